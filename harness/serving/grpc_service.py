"""The Open Inference Protocol over gRPC (inference.GRPCInferenceService on grpc.aio): the same
metadata and infer as over HTTP, tensors as raw contents (typed contents accepted too). A refused
request answers its status code and details, logs one line, and the server keeps serving."""
from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from mlharness.serving.batcher import DynamicBatcher
from mlharness.serving.http_app import log_refusal, server_version
from mlharness.serving.protocol import (EXTENSIONS, ProtocolError, TensorMeta, answer_samples, check_requested_outputs,
                                        output_meta, samples_of)
from mlharness.sut.network import oip_grpc
from mlharness.sut.network.tensors import TensorError, datatype_of

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL}


class GrpcFront:
    """The protocol's methods (oip_grpc.add_servicer serves them by these names)."""

    def __init__(self, name: str, served: Any, batcher: DynamicBatcher, inputs: TensorMeta, metadata: dict[str, Any]):
        self.name, self.served, self.batcher, self.inputs, self.metadata = name, served, batcher, inputs, metadata
        self.m = oip_grpc.messages()

    async def _refuse(self, context: Any, exc: ProtocolError, what: str) -> None:
        log_refusal("grpc", f"{what}: {exc}")
        await context.abort(_CODES.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        return self.m.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.m.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.m.ServerMetadataResponse(name="mlharness", version=server_version(), extensions=EXTENSIONS)

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        if request.name != self.name:
            await self._refuse(context, ProtocolError(404, f"model {request.name!r} is not served here "
                                                           f"(serving {self.name!r})"), "ModelReady")
        return self.m.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        if request.name != self.name:
            await self._refuse(context, ProtocolError(404, f"model {request.name!r} is not served here "
                                                           f"(serving {self.name!r})"), "ModelMetadata")
        meta = self.metadata
        reply = self.m.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for item in meta["inputs"]:
            reply.inputs.add(**item)
        for item in meta["outputs"]:
            reply.outputs.add(**item)
        return reply

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            if request.model_name != self.name:
                raise ProtocolError(404, f"model {request.model_name!r} is not served here (serving {self.name!r})")
            samples = samples_of(self._tensors(request), self.inputs)
            check_requested_outputs([o.name for o in request.outputs], output_meta(self.served))
            rows, timings = await answer_samples(self.batcher, samples)
        except ProtocolError as exc:
            await self._refuse(context, exc, "ModelInfer")
            raise AssertionError("unreachable: abort raises") from None
        reply = self.m.ModelInferResponse(model_name=self.name, model_version=self.served.model.version, id=request.id)
        reply.outputs.add(name=output_meta(self.served).name, datatype=datatype_of(rows), shape=list(rows.shape))
        reply.raw_output_contents.append(np.ascontiguousarray(rows).tobytes())
        for key, value in timings.items():
            reply.parameters[key].int64_param = value
        return reply

    def _tensors(self, request: Any) -> dict[str, np.ndarray]:
        try:
            return oip_grpc.tensors_of(request.inputs, request.raw_input_contents)
        except (TensorError, ValueError) as exc:
            raise ProtocolError(400, f"malformed request: {exc}") from None
