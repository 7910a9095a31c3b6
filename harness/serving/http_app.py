"""The Open Inference Protocol over HTTP/REST (Starlette, served by uvicorn): health, metadata and
infer, with Triton's binary tensor extension both ways. Errors answer the protocol's `{"error": ...}`
with a 4xx/5xx status and one log line; the server keeps serving."""
from __future__ import annotations

import json
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlharness.serving.batcher import DynamicBatcher
from mlharness.serving.protocol import (EXTENSIONS, ProtocolError, TensorMeta, answer_samples, check_requested_outputs,
                                        output_meta, samples_of)
from mlharness.sut.network.oip_client import BINARY_HEADER
from mlharness.sut.network.tensors import TensorError, datatype_of, from_bytes, from_list


def server_version() -> str:
    try:
        return version("mlharness")
    except PackageNotFoundError:
        return "0"


def log_refusal(transport: str, message: str) -> None:
    print(f"mlharness serve: {transport}: refused: {message}", file=sys.stderr, flush=True)


class HttpFront:
    def __init__(self, name: str, served: Any, batcher: DynamicBatcher, inputs: TensorMeta, metadata: dict[str, Any],
                 max_body_bytes: int):
        self.name, self.served, self.batcher, self.inputs = name, served, batcher, inputs
        self.metadata, self.max_body_bytes = metadata, max_body_bytes
        self.ready = True

    def app(self) -> Starlette:
        routes = [Route("/v2/health/live", self.live), Route("/v2/health/ready", self.ready_route),
                  Route("/v2", self.server_meta), Route("/v2/models/{model}", self.model_meta),
                  Route("/v2/models/{model}/ready", self.model_ready),
                  Route("/v2/models/{model}/infer", self.infer, methods=["POST"])]
        # A path or method the protocol does not serve here (Triton's model config, say) answers the
        # protocol's JSON error too: clients such as tritonclient parse every error body as JSON.
        return Starlette(routes=routes, exception_handlers={HTTPException: self._unrouted})

    async def _unrouted(self, request: Request, exc: HTTPException) -> Response:
        message = f"{request.method} {request.url.path}: {exc.detail} (not a route of the protocol served here)"
        log_refusal("http", message)
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready_route(self, request: Request) -> Response:
        return JSONResponse({"ready": self.ready}, status_code=200 if self.ready else 503)

    async def server_meta(self, request: Request) -> Response:
        return JSONResponse({"name": "mlharness", "version": server_version(), "extensions": EXTENSIONS})

    def _known(self, model: str) -> None:
        if model != self.name:
            raise ProtocolError(404, f"model {model!r} is not served here (serving {self.name!r})")

    async def model_meta(self, request: Request) -> Response:
        return await self._guard(request, lambda: self._known(request.path_params["model"]) or JSONResponse(self.metadata))

    async def model_ready(self, request: Request) -> Response:
        return await self._guard(request, lambda: self._known(request.path_params["model"]) or
                                 JSONResponse({"name": self.name, "ready": self.ready}))

    async def _guard(self, request: Request, answer: Any) -> Response:
        try:
            result = answer()
            return await result if hasattr(result, "__await__") else result
        except ProtocolError as exc:
            log_refusal("http", f"{request.method} {request.url.path}: {exc}")
            return JSONResponse({"error": str(exc)}, status_code=exc.status)

    async def infer(self, request: Request) -> Response:
        return await self._guard(request, lambda: self._infer(request))

    async def _infer(self, request: Request) -> Response:
        self._known(request.path_params["model"])
        length = int(request.headers.get("content-length") or 0)
        if length > self.max_body_bytes:
            raise ProtocolError(413, f"request body of {length} bytes is over the limit of {self.max_body_bytes}")
        try:
            body = await request.body()
        except ClientDisconnect:  # the client left mid-body: one line (the answer reaches nobody), no traceback
            raise ProtocolError(400, "the client disconnected before sending the whole body") from None
        if len(body) > self.max_body_bytes:
            raise ProtocolError(413, f"request body of {len(body)} bytes is over the limit of {self.max_body_bytes}")
        header, tensors = self._decode(body, request.headers.get(BINARY_HEADER))
        samples = samples_of(tensors, self.inputs)
        check_requested_outputs([str(o.get("name")) for o in header.get("outputs") or []], output_meta(self.served))
        rows, timings = await answer_samples(self.batcher, samples)
        # The client's request JSON (KServe v2): its optional `parameters` objects are free-form.
        binary = bool((header.get("parameters") or {}).get("binary_data_output")) or any(
            (o.get("parameters") or {}).get("binary_data") for o in header.get("outputs") or [])
        out = output_meta(self.served)
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype_of(rows), "shape": list(rows.shape)}
        reply = {"model_name": self.name, "model_version": self.served.model.version, "id": header.get("id", ""),
                 "parameters": timings, "outputs": [entry]}
        if not binary:
            entry["data"] = rows.ravel().tolist()
            return JSONResponse(reply)
        data = np.ascontiguousarray(rows).tobytes()
        entry["parameters"] = {"binary_data_size": len(data)}
        head = json.dumps(reply).encode()
        return Response(head + data, media_type="application/octet-stream", headers={BINARY_HEADER: str(len(head))})

    def _decode(self, body: bytes, header_length: str | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        try:
            size = int(header_length) if header_length is not None else len(body)
            if not 0 < size <= len(body):
                raise ValueError(f"{BINARY_HEADER} {size} does not fit a body of {len(body)} bytes")
            header = json.loads(body[:size])
            if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
                raise ValueError("expected a JSON object with a list of inputs")
            tensors, offset, view = {}, size, memoryview(body)
            for item in header["inputs"]:
                name, datatype, shape = item["name"], item["datatype"], list(item["shape"])
                # An input's optional, free-form `parameters` (KServe v2's binary tensor extension).
                binary_size = (item.get("parameters") or {}).get("binary_data_size")
                if binary_size is not None:
                    tensors[name] = from_bytes(view[offset:offset + int(binary_size)], datatype, shape)
                    offset += int(binary_size)
                else:
                    tensors[name] = from_list(item["data"], datatype, shape)
            return header, tensors
        except (ValueError, KeyError, TypeError, TensorError) as exc:
            raise ProtocolError(400, f"malformed request: {type(exc).__name__}: {exc}") from None
