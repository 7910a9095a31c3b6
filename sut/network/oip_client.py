"""Asynchronous clients of the Open Inference Protocol (KServe v2): HTTP/REST with Triton's binary
tensor extension (aiohttp: a streaming client with a bounded connection pool, already a Ray
dependency) and gRPC (grpc.aio with `raw_input_contents`). Both answer `infer` with the outputs as
numpy arrays and the server's own timings where it reports them (mlharness serve does)."""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np

from mlharness.specs.endpoint import Endpoint
from mlharness.sut.network.http_session import client_session, send
from mlharness.sut.network.tensors import TensorError, as_contiguous, datatype_of, from_bytes, from_list

# Timings mlharness serve puts in each response's parameters (microseconds), read back per request.
SERVER_TIMINGS = ("queue_us", "preprocess_us", "infer_us", "postprocess_us", "batch_size")
BINARY_HEADER = "Inference-Header-Content-Length"


class EndpointError(Exception):
    """The server answered with an error, not at all, or with something that is not the protocol's;
    the message names the endpoint (and the HTTP status or gRPC code)."""


@dataclass
class InferReply:
    outputs: dict[str, np.ndarray]
    server: dict[str, float] = field(default_factory=dict)  # SERVER_TIMINGS the server reported


@dataclass
class ModelInfo:
    name: str
    platform: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


def _timings(parameters: dict[str, Any] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (parameters or {}).items() if k in SERVER_TIMINGS and isinstance(v, (int, float))}


class HttpClient:
    """The protocol over HTTP/REST. `binary` sends and asks for tensors as the binary extension's raw
    bytes after a JSON header; otherwise tensors travel as JSON numbers (any v2 server reads those)."""

    def __init__(self, endpoint: Endpoint, connections: int, timeout_s: float, binary: bool = True):
        import aiohttp

        self.endpoint, self.binary = endpoint, binary
        self._base = f"{'https' if endpoint.tls else 'http'}://{endpoint.authority}{endpoint.path}"
        self._aiohttp = aiohttp
        self._session = client_session(connections, aiohttp.ClientTimeout(total=timeout_s))
        self.counters: dict[str, int] = {}  # requests sent again on a fresh connection (http_session)

    async def _call(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
        url = self._base + path
        try:
            async with await send(self._session, method, url, self.counters, **kwargs) as response:
                return response.status, dict(response.headers), await response.read()
        except asyncio.TimeoutError:
            raise EndpointError(f"{self.endpoint.url}: no answer to {method} {path} within the request timeout") from None
        except self._aiohttp.ClientError as exc:
            raise EndpointError(f"{self.endpoint.url}: {method} {path}: {type(exc).__name__}: {exc}") from None

    def _error(self, status: int, body: bytes, what: str) -> EndpointError:
        try:
            message = json.loads(body).get("error") or body[:200].decode(errors="replace")
        except (ValueError, AttributeError):
            message = body[:200].decode(errors="replace")
        return EndpointError(f"{self.endpoint.url}: {what}: HTTP {status}: {str(message).strip()}")

    async def model_info(self, model: str) -> ModelInfo:
        status, _, body = await self._call("GET", f"/v2/models/{quote(model, safe='')}")
        if status != 200:
            raise self._error(status, body, f"model {model!r}")
        try:
            meta = json.loads(body)
            info = ModelInfo(meta.get("name", model), meta.get("platform", ""), list(meta.get("inputs", [])),
                             list(meta.get("outputs", [])))
            # Read by name later (the request's input): a tensor without one is the server's fault, said here.
            if not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in info.inputs + info.outputs):
                raise ValueError("an input or output is not an object with a name")
            return info
        except (ValueError, AttributeError, TypeError) as exc:
            raise EndpointError(f"{self.endpoint.url}: model {model!r}: metadata is not the protocol's JSON: {exc}") from None

    async def server_name(self) -> str:
        status, _, body = await self._call("GET", "/v2")
        if status != 200:
            raise self._error(status, body, "server metadata")
        try:
            meta = json.loads(body)
            return f"{meta.get('name', '?')} {meta.get('version', '')}".strip()
        except (ValueError, AttributeError):
            raise EndpointError(f"{self.endpoint.url}: server metadata is not the protocol's JSON") from None

    async def infer(self, model: str, inputs: dict[str, np.ndarray], request_id: str = "") -> InferReply:
        arrays = {name: as_contiguous(value) for name, value in inputs.items()}
        header: dict[str, Any] = {"id": request_id, "inputs": []}
        if self.binary:
            header["parameters"] = {"binary_data_output": True}
            for name, array in arrays.items():
                header["inputs"].append({"name": name, "shape": list(array.shape), "datatype": datatype_of(array),
                                         "parameters": {"binary_data_size": array.nbytes}})
            head = json.dumps(header).encode()
            body = b"".join([head, *(a.tobytes() for a in arrays.values())])
            headers = {BINARY_HEADER: str(len(head)), "Content-Type": "application/octet-stream"}
        else:
            for name, array in arrays.items():
                header["inputs"].append({"name": name, "shape": list(array.shape), "datatype": datatype_of(array),
                                         "data": array.ravel().tolist()})
            body, headers = json.dumps(header).encode(), {"Content-Type": "application/json"}
        status, reply_headers, reply = await self._call("POST", f"/v2/models/{quote(model, safe='')}/infer", data=body, headers=headers)
        if status != 200:
            raise self._error(status, reply, f"infer on model {model!r}")
        return self._decode(reply, reply_headers)

    def _decode(self, reply: bytes, headers: dict[str, str]) -> InferReply:
        length = {k.lower(): v for k, v in headers.items()}.get(BINARY_HEADER.lower())
        try:
            head_len = int(length) if length is not None else len(reply)
            meta = json.loads(reply[:head_len])
            outputs: dict[str, np.ndarray] = {}
            offset = head_len
            view = memoryview(reply)
            for out in meta["outputs"]:
                size = (out.get("parameters") or {}).get("binary_data_size")
                if size is not None:
                    outputs[out["name"]] = from_bytes(view[offset:offset + int(size)], out["datatype"], out["shape"])
                    offset += int(size)
                else:
                    outputs[out["name"]] = from_list(out["data"], out["datatype"], out["shape"])
            return InferReply(outputs, _timings(meta.get("parameters")))
        # AttributeError: JSON of the wrong shape (an output or the parameters not an object)
        except (ValueError, KeyError, TypeError, AttributeError, TensorError) as exc:
            raise EndpointError(f"{self.endpoint.url}: the answer is not the protocol's: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        await self._session.close()


class GrpcClient:
    """The protocol over gRPC (inference.GRPCInferenceService), tensors as `raw_input_contents`."""

    def __init__(self, endpoint: Endpoint, connections: int, timeout_s: float):
        # gRPC's core logs at INFO to stderr by default (a failed TLS handshake is a line of its own
        # before ours): errors only, unless the user chose. Read once, when grpc is first imported.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        import grpc

        from mlharness.sut.network import oip_grpc

        self.endpoint, self.timeout_s, self._grpc = endpoint, timeout_s, grpc
        self.messages = oip_grpc.messages()
        options = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]
        # One HTTP/2 connection multiplexes the requests; several spread them over more sockets.
        self._channels = [grpc.aio.secure_channel(endpoint.authority, grpc.ssl_channel_credentials(), options=options)
                          if endpoint.tls else grpc.aio.insecure_channel(endpoint.authority, options=options)
                          for _ in range(max(1, min(connections, 4)))]
        self._stubs = [oip_grpc.stub(channel) for channel in self._channels]
        self._next = 0

    def _stub(self) -> Any:
        self._next = (self._next + 1) % len(self._stubs)
        return self._stubs[self._next]

    async def _rpc(self, name: str, request: Any, what: str) -> Any:
        try:
            return await getattr(self._stub(), name)(request, timeout=self.timeout_s)
        except self._grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                raise EndpointError(f"{self.endpoint.url}: no answer to {what} within the request timeout") from None
            raise EndpointError(f"{self.endpoint.url}: {what}: gRPC {code.name}: {exc.details()}") from None

    async def model_info(self, model: str) -> ModelInfo:
        meta = await self._rpc("ModelMetadata", self.messages.ModelMetadataRequest(name=model), f"model {model!r}")
        tensors = lambda items: [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]  # noqa: E731
        return ModelInfo(meta.name or model, meta.platform, tensors(meta.inputs), tensors(meta.outputs))

    async def server_name(self) -> str:
        meta = await self._rpc("ServerMetadata", self.messages.ServerMetadataRequest(), "server metadata")
        return f"{meta.name} {meta.version}".strip()

    async def infer(self, model: str, inputs: dict[str, np.ndarray], request_id: str = "") -> InferReply:
        m = self.messages
        request = m.ModelInferRequest(model_name=model, id=request_id)
        for name, value in inputs.items():
            array = as_contiguous(value)
            request.inputs.add(name=name, datatype=datatype_of(array), shape=list(array.shape))
            request.raw_input_contents.append(array.tobytes())
        reply = await self._rpc("ModelInfer", request, f"infer on model {model!r}")
        return self._decode(reply)

    def _decode(self, reply: Any) -> InferReply:
        from mlharness.sut.network.oip_grpc import tensors_of

        try:
            outputs = tensors_of(reply.outputs, reply.raw_output_contents)
            server = {k: float(p.int64_param or p.string_param or 0) for k, p in reply.parameters.items()
                      if k in SERVER_TIMINGS}
            return InferReply(outputs, server)
        except (TensorError, ValueError) as exc:
            raise EndpointError(f"{self.endpoint.url}: the answer is not the protocol's: {exc}") from None

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


def make_client(endpoint: Endpoint, connections: int, timeout_s: float, binary: bool = True) -> HttpClient | GrpcClient:
    """The client of `endpoint`'s protocol; build it inside the event loop that will use it."""
    if endpoint.protocol == "grpc":
        return GrpcClient(endpoint, connections, timeout_s)
    return HttpClient(endpoint, connections, timeout_s, binary)
