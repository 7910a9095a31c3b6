"""A connection to a model server: the client's own event loop on a thread of its own (LoadGen's
issue thread never waits on the network), the protocol client built in it, and the checks made
before a test starts (the server answers, serves the model, answers a sample)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable, Callable

from mlharness.errors import UserError
from mlharness.specs.endpoint import Endpoint
from mlharness.sut.network.oip_client import EndpointError, ModelInfo, make_client


class EndpointConnection:
    def __init__(self, endpoint: Endpoint, model_name: str, concurrency: int, timeout_s: float,
                 connect_timeout_s: float, binary: bool = True, retries: int = 0, explicit_model: bool = False):
        self.endpoint, self.model_name = endpoint, model_name
        self.retries, self.explicit_model = retries, explicit_model
        self.concurrency, self.timeout_s, self.connect_timeout_s = concurrency, timeout_s, connect_timeout_s
        self.binary = binary
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="mlharness-endpoint", daemon=True)
        self._thread.start()
        self.server_name = ""
        self.model: ModelInfo | None = None
        self.client: Any = self.run(self._make(), connect_timeout_s)

    async def _make(self) -> Any:
        if self.endpoint.protocol == "openai":
            from mlharness.sut.network.openai_client import OpenAIClient

            return OpenAIClient(self.endpoint, self.concurrency, self.timeout_s, self.retries)
        return make_client(self.endpoint, self.concurrency, self.timeout_s, self.binary)

    def run(self, coroutine: Awaitable[Any], timeout_s: float) -> Any:
        """Run `coroutine` on the connection's loop and wait for it, at most `timeout_s` seconds."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise EndpointError(f"{self.endpoint.url}: no answer within {timeout_s:g} s "
                                f"(endpoint_connect_timeout)") from None

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def check(self) -> ModelInfo:
        """The server answers and serves the model: its name and the model's metadata, or a UserError
        naming the endpoint (nothing listening, a refused connection, an unknown model, TLS asked of
        a plain server)."""
        try:
            self.server_name = self.run(self.client.server_name(), self.connect_timeout_s)
            if self.endpoint.protocol == "openai":  # the served name may differ: the server's only model
                self.model = self.run(self.client.model_info(self.model_name, self.explicit_model), self.connect_timeout_s)
                self.model_name = self.model.name
            else:
                self.model = self.run(self.client.model_info(self.model_name), self.connect_timeout_s)
        except EndpointError as exc:
            raise UserError(f"--endpoint: {exc}") from None
        return self.model

    def describe(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint.url, "protocol": self.endpoint.protocol, "tls": self.endpoint.tls,
                "server": self.server_name, "served_model": self.model_name,
                "platform": self.model.platform if self.model else None, "concurrency": self.concurrency,
                "request_timeout_s": self.timeout_s, "binary_tensors": self.binary if self.endpoint.protocol == "http" else None,
                **({"retries": self.retries} if self.endpoint.protocol == "openai" else {})}

    def close(self) -> None:
        if not self.loop.is_running():
            return
        try:
            self.run(self.client.close(), 5.0)
        except Exception:  # noqa: BLE001 - closing a connection to a dead server must not mask the run's error
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
