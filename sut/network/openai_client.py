"""An asynchronous client of an OpenAI-compatible LLM server (vLLM, llama.cpp's server, TGI, SGLang,
`mlharness serve --openai`): `/v1/models`, and `/v1/chat/completions` or `/v1/completions` streamed
as Server-Sent Events. aiohttp reads the body as it arrives (a bounded connection pool; `timeout_s`
bounds the server's silence, no byte for that long, not the whole answer); mlharness.sut.network.sse cuts it into events; each parsed chunk is handed
on with the time it arrived (perf_counter_ns), which is what the token figures are measured from.

A 429 or 503 before the stream starts (the server is busy) is retried up to `retries` times, after
the server's `Retry-After` (at most RETRY_AFTER_CAP_S) or a short doubling wait; a request that met
an idle connection the server had just closed is sent once more (http_session); every retry is
counted. Anything else that is not a whole stream ending in `[DONE]` is an EndpointError naming the
endpoint: an error status, a reset or refused connection, a silence past the timeout, a stream cut short
or mid-event, an event that is not JSON, a line that is no SSE field, an error in the stream (an `error`
object, llama.cpp's `error:` line; its own message said), an answer that is not a stream at all
(said so, with its Content-Type, where that is what broke the stream)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

from mlharness.specs.endpoint import Endpoint
from mlharness.sut.network.http_session import client_session, send
from mlharness.sut.network.oip_client import EndpointError, ModelInfo
from mlharness.sut.network.sse import Event, SSEDecoder, StrayLine

RETRY_STATUSES = (429, 503)
RETRY_AFTER_CAP_S = 5.0
FIRST_RETRY_WAIT_S = 0.05
API_PATHS = {"chat": "/chat/completions", "completions": "/completions"}


def _message(status: int, body: bytes) -> str:
    """The server's own error message (OpenAI's `{"error": {"message": ...}}` or any JSON `error`/`detail`),
    else the body's first 200 characters."""
    text = body[:2000].decode("utf-8", errors="replace")
    try:
        found = json.loads(text)
    except ValueError:
        return f"HTTP {status}: {text[:200].strip()}"
    error = found.get("error", found.get("detail")) if isinstance(found, dict) else None
    if isinstance(error, dict):
        error = error.get("message", error)
    return f"HTTP {status}: {str(error if error is not None else text)[:200].strip()}"


def _error_text(error: Any) -> str:
    """A streamed error's own message: OpenAI's `{"error": {"message": ...}}`, llama.cpp's `{"message": ...}`,
    else the value itself (200 characters at most)."""
    if isinstance(error, dict):
        error = error.get("error", error)
    if isinstance(error, dict):
        error = error.get("message", error)
    return f"{error!s:.200}"


def _retry_after(headers: Any, attempt: int) -> float:
    try:
        return min(max(float(headers.get("Retry-After", "")), 0.0), RETRY_AFTER_CAP_S)
    except ValueError:
        return min(FIRST_RETRY_WAIT_S * 2 ** attempt, RETRY_AFTER_CAP_S)


class OpenAIClient:
    def __init__(self, endpoint: Endpoint, connections: int, timeout_s: float, retries: int = 3):
        import aiohttp

        self.endpoint, self.retries, self.timeout_s = endpoint, retries, timeout_s
        self._aiohttp = aiohttp
        # The timeout bounds the server's silence, not the whole answer: a request may wait long in the
        # server's own queue (Offline sends every prompt at once), and a long answer streams for long.
        self._session = client_session(connections, aiohttp.ClientTimeout(total=None, sock_connect=timeout_s,
                                                                           sock_read=timeout_s))
        self.server_header = ""

    async def _get(self, path: str) -> Any:
        url = self.endpoint.base_url + path
        try:
            async with await send(self._session, "GET", url) as response:
                body = await response.read()
                self.server_header = response.headers.get("Server", "")
                if response.status != 200:
                    raise EndpointError(f"{self.endpoint.url}: GET {path}: {_message(response.status, body)}")
        except asyncio.TimeoutError:
            raise EndpointError(f"{self.endpoint.url}: no answer to GET {path} within the request timeout") from None
        except self._aiohttp.ClientError as exc:
            raise EndpointError(f"{self.endpoint.url}: GET {path}: {type(exc).__name__}: {exc}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise EndpointError(f"{self.endpoint.url}: GET {path} answered something that is not JSON") from None

    async def served_models(self) -> list[str]:
        listed = await self._get("/models")
        data = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(data, list):
            raise EndpointError(f"{self.endpoint.url}: GET /models answered no model list (no `data`)")
        return [str(item.get("id")) for item in data if isinstance(item, dict) and item.get("id")]

    async def server_name(self) -> str:
        await self.served_models()
        return f"OpenAI-compatible server{f' ({self.server_header})' if self.server_header else ''}"

    async def model_info(self, wanted: str, explicit: bool = False) -> ModelInfo:
        """The served model a run asks for: `wanted` when the server lists it; otherwise (unless the name
        was given explicitly, endpoint_model) the server's only model."""
        served = await self.served_models()
        if wanted in served:
            return ModelInfo(wanted, "openai", [], [])
        if not explicit and len(served) == 1:
            return ModelInfo(served[0], "openai (the server's only model)", [], [])
        listed = ", ".join(repr(name) for name in served[:5]) or "none"
        raise EndpointError(f"{self.endpoint.url}: the server does not serve model {wanted!r} (it lists {listed}); "
                            "name it with --set endpoint_model=NAME")

    async def stream(self, api: str, body: dict[str, Any], counters: dict[str, int]) -> AsyncIterator[tuple[int, Any]]:
        """(arrival perf_counter_ns, parsed chunk) for each event of a streamed request, up to `[DONE]`;
        `counters["retries"]` counts the requests sent again: busy answers, and a closed idle connection
        (mlharness.sut.network.http_session)."""
        path = API_PATHS[api]
        url = self.endpoint.base_url + path
        deadline = time.monotonic() + self.timeout_s
        try:
            for attempt in range(self.retries + 1):
                async with await send(self._session, "POST", url, counters, json=body) as response:
                    if response.status in RETRY_STATUSES and attempt < self.retries:
                        wait = _retry_after(response.headers, attempt)
                        if time.monotonic() + wait < deadline:
                            counters["retries"] = counters.get("retries", 0) + 1
                            await asyncio.sleep(wait)
                            continue
                    if response.status != 200:
                        raise EndpointError(f"{self.endpoint.url}: POST {path}: {_message(response.status, await response.read())}")
                    async for item in self._events(response, path):
                        yield item
                    return
        except asyncio.TimeoutError:
            raise EndpointError(f"{self.endpoint.url}: POST {path}: the server sent nothing for {self.timeout_s:g} s "
                                f"(endpoint_timeout)") from None
        except self._aiohttp.ClientError as exc:
            raise EndpointError(f"{self.endpoint.url}: POST {path}: {type(exc).__name__}: {exc}") from None

    async def _events(self, response: Any, path: str) -> AsyncIterator[tuple[int, Any]]:
        decoder, head = SSEDecoder(), b""
        async for piece in response.content.iter_any():
            arrived = time.perf_counter_ns()
            head = head or piece[:80]
            for event in decoder.feed(piece):
                if isinstance(event, StrayLine):
                    raise self._not_a_stream(response, path, head) or self._stray(event.line, path)
                if event.data.strip() == "[DONE]":
                    return
                yield arrived, self._chunk(event, path)
        cut = " mid-event" if decoder.pending else ""
        raise self._not_a_stream(response, path, head) or \
            EndpointError(f"{self.endpoint.url}: POST {path}: the stream ended{cut} without [DONE]")

    def _chunk(self, event: Event, path: str) -> Any:
        """An event's parsed chunk; an EndpointError for one that is not JSON or carries an error."""
        try:
            chunk = json.loads(event.data)
        except ValueError:
            raise EndpointError(f"{self.endpoint.url}: POST {path}: a streamed event is not JSON: "
                                f"{event.data[:80]!r}") from None
        if isinstance(chunk, dict) and chunk.get("error") is not None:
            raise EndpointError(f"{self.endpoint.url}: POST {path}: the stream carried an error: {_error_text(chunk)}")
        return chunk

    def _stray(self, line: str, path: str) -> EndpointError:
        """A line that is no SSE field: llama.cpp's server's `error: {...}` (its message said), else the line."""
        name, _, value = line.partition(":")
        if name == "error":
            try:
                found = json.loads(value)
            except ValueError:
                found = value.strip()
            return EndpointError(f"{self.endpoint.url}: POST {path}: the stream carried an error: {_error_text(found)}")
        return EndpointError(f"{self.endpoint.url}: POST {path}: a streamed line is no Server-Sent Events field: "
                             f"{line[:80]!r}")

    def _not_a_stream(self, response: Any, path: str, head: bytes) -> EndpointError | None:
        """Where the answer is not labelled text/event-stream (the server ignored `stream`), that is the error."""
        if response.content_type == "text/event-stream":
            return None
        return EndpointError(f"{self.endpoint.url}: POST {path}: answered {response.content_type}, not a stream "
                             f"(text/event-stream): {head.decode('utf-8', errors='replace')!r}")

    async def close(self) -> None:
        await self._session.close()
