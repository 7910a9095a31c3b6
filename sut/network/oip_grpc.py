"""The Open Inference Protocol's gRPC messages and service, compiled from the shipped oip.proto when
first used (grpcio-tools' protoc) into a descriptor pool of mlharness' own: other clients of this
protocol in the same process (tritonclient, mlserver, kserve) register the same `inference.*` names in
protobuf's default pool, where a second registration fails. The stub and the servicer's handlers are
built from the method table with grpc's generic API. Shared by the client (the network SUT) and the
server (mlharness serve)."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from mlharness.errors import require
from mlharness.sut.network.tensors import CONTENTS_FIELD, dtype_of, from_bytes

PROTO = Path(__file__).with_name("oip.proto")
PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"
# method -> (request message, response message), as oip.proto declares them
METHODS = {name: (f"{name}Request", f"{name}Response")
           for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")}


@functools.lru_cache(maxsize=1)
def _pool() -> Any:
    require("grpc_tools", "network", "the Open Inference Protocol's gRPC messages")
    from google.protobuf import descriptor_pb2, descriptor_pool
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="mlharness-oip-") as folder:
        compiled = Path(folder) / "oip.desc"
        status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={compiled}", PROTO.name])
        if status != 0 or not compiled.is_file():
            raise RuntimeError(f"protoc could not compile {PROTO} (exit {status})")
        files = descriptor_pb2.FileDescriptorSet.FromString(compiled.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


@functools.lru_cache(maxsize=None)
def _message(name: str) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


class _Messages:
    """The message classes by name: messages().ModelInferRequest, ..."""

    def __getattr__(self, name: str) -> Any:
        try:
            return _message(name)
        except KeyError:
            raise AttributeError(f"oip.proto has no message {name!r}") from None


def messages() -> Any:
    return _Messages()


def stub(channel: Any) -> Any:
    """A stub of the service over `channel` (grpc or grpc.aio): one callable per method."""
    require("grpc", "network", "the Open Inference Protocol over gRPC")
    return SimpleNamespace(**{
        name: channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=_message(request).SerializeToString,
                                  response_deserializer=_message(response).FromString)
        for name, (request, response) in METHODS.items()})


def add_servicer(servicer: Any, server: Any) -> None:
    """Serve `servicer`'s methods (named as the protocol names them, sync or async) on `server`."""
    grpc = require("grpc", "network", "the Open Inference Protocol over gRPC")
    handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(servicer, name),
                                                          request_deserializer=_message(request).FromString,
                                                          response_serializer=_message(response).SerializeToString)
                for name, (request, response) in METHODS.items() if hasattr(servicer, name)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def tensor_from_contents(contents: Any, datatype: str, shape: list[int]) -> np.ndarray:
    """A tensor a peer sent in the typed `contents` field rather than as raw bytes."""
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise ValueError(f"datatype {datatype!r} cannot travel in typed contents")
    values = np.asarray(getattr(contents, field), dtype=dtype_of(datatype))
    if values.size != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"{values.size} values for a {datatype} tensor of shape {shape}")
    return values.reshape(shape)


def tensors_of(items: Any, raw: Any) -> dict[str, np.ndarray]:
    """A request's inputs or a reply's outputs by name: each from its raw bytes where the peer sent
    them (in the same order), else from its typed contents. Raises TensorError or ValueError."""
    tensors = {}
    for i, item in enumerate(items):
        shape = list(item.shape)
        tensors[item.name] = from_bytes(raw[i], item.datatype, shape) if i < len(raw) else \
            tensor_from_contents(item.contents, item.datatype, shape)
    return tensors
