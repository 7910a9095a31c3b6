"""The Open Inference Protocol's gRPC messages and service, generated from the shipped oip.proto when
first used (grpc.protos_and_services, grpcio-tools): no generated code to keep in step with the
protobuf runtime. Shared by the client (the network SUT) and the server (mlharness serve)."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mlharness.errors import require
from mlharness.sut.network.tensors import CONTENTS_FIELD, dtype_of

PROTO = Path(__file__).with_name("oip.proto")
SERVICE = "inference.GRPCInferenceService"


@functools.lru_cache(maxsize=1)
def _generated() -> tuple[Any, Any]:
    grpc = require("grpc", "network", "the Open Inference Protocol over gRPC")
    require("grpc_tools", "network", "the Open Inference Protocol's gRPC messages")
    # protos_and_services resolves the file against sys.path: put its folder there for the call.
    sys.path.insert(0, str(PROTO.parent))
    try:
        return grpc.protos_and_services(PROTO.name)
    finally:
        sys.path.remove(str(PROTO.parent))


def messages() -> Any:
    """The module of generated message classes (ModelInferRequest, ...)."""
    return _generated()[0]


def services() -> Any:
    """The module of the generated stub and servicer (GRPCInferenceServiceStub, ...)."""
    return _generated()[1]


def stub(channel: Any) -> Any:
    return services().GRPCInferenceServiceStub(channel)


def tensor_from_contents(contents: Any, datatype: str, shape: list[int]) -> np.ndarray:
    """A tensor a peer sent in the typed `contents` field rather than as raw bytes."""
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise ValueError(f"datatype {datatype!r} cannot travel in typed contents")
    values = np.asarray(getattr(contents, field), dtype=dtype_of(datatype))
    if values.size != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"{values.size} values for a {datatype} tensor of shape {shape}")
    return values.reshape(shape)
