"""The Open Inference Protocol's requests and answers as `mlharness serve` reads and writes them,
apart from the transport: the model's metadata, a request's one input checked against it and cut into
samples, and the answer's tensors. Problems raise ProtocolError with the status to answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlharness.sut.network.tensors import datatype_of, element_type_datatype
from mlharness.sut.served_model import ServedModel

PROTOCOL_VERSION = "2"
EXTENSIONS = ["binary_tensor_data"]


class ProtocolError(Exception):
    """A request the protocol refuses: `status` is the HTTP status (the gRPC code is derived)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str
    shape: list[int]  # -1 for a dimension of any size
    # True where the rank is not known (no sample to read it from): `shape` is then [-1], any rank.
    # Otherwise [-1] is a rank-1 input, and a request of another rank is refused.
    any_rank: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _dims(shape: Any) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in shape]


def input_meta(served: ServedModel, raw_sample: np.ndarray | None) -> TensorMeta:
    """The one input a client sends: the raw sample as the dataset loads it (the server preprocesses),
    named after the model's first input; without a preprocess, the model's declared input itself.
    `raw_sample` is one sample of the model's dataset, where the server could load one."""
    spec = served.model.inputs[0]
    if served.preprocess is None:
        return TensorMeta(spec.name, element_type_datatype(spec.element_type), _dims(spec.shape))
    if raw_sample is not None:
        sample = np.asarray(raw_sample)
        return TensorMeta(spec.name, element_type_datatype(str(sample.dtype)), [-1] * (sample.ndim + 1))
    return TensorMeta(spec.name, element_type_datatype(spec.element_type), [-1], any_rank=True)


def output_meta(served: ServedModel) -> TensorMeta:
    spec = served.result_spec
    return TensorMeta(spec.name, element_type_datatype(spec.element_type), _dims(["batch", *spec.sample_shape()]))


def model_metadata(served: ServedModel, name: str, raw_sample: np.ndarray | None) -> dict[str, Any]:
    return {"name": name, "versions": [served.model.version], "platform": served.backend_name,
            "inputs": [input_meta(served, raw_sample).as_dict()], "outputs": [output_meta(served).as_dict()]}


def samples_of(tensors: dict[str, np.ndarray], expected: TensorMeta) -> list[np.ndarray]:
    """The request's input checked against the metadata and cut into samples (its leading dim)."""
    if list(tensors) != [expected.name]:
        raise ProtocolError(400, f"expected one input named {expected.name!r}, got {sorted(tensors)}")
    array = tensors[expected.name]
    got = datatype_of(array)
    if got != expected.datatype:
        raise ProtocolError(400, f"input {expected.name!r}: expected datatype {expected.datatype}, got {got}")
    if not expected.any_rank and array.ndim != len(expected.shape) or array.ndim == 0:
        raise ProtocolError(400, f"input {expected.name!r}: expected shape {expected.shape}, got {list(array.shape)}")
    if any(want not in (-1, have) for want, have in zip(expected.shape, array.shape)):
        raise ProtocolError(400, f"input {expected.name!r}: expected shape {expected.shape}, got {list(array.shape)}")
    if array.shape[0] < 1:
        raise ProtocolError(400, f"input {expected.name!r}: no samples (leading dimension 0)")
    return [array[i:i + 1] for i in range(array.shape[0])]


def check_requested_outputs(names: list[str], served: TensorMeta) -> None:
    """A request may name the outputs it wants (none: all); the model answers one, its result."""
    unknown = [name for name in names if name != served.name]
    if unknown:
        raise ProtocolError(400, f"requested output {unknown[0]!r} is not one of this model's outputs "
                                 f"(it answers {served.name!r})")


async def answer_samples(batcher: Any, samples: list[np.ndarray]) -> tuple[np.ndarray, dict[str, int]]:
    """The samples through the batcher: their result rows in order, and the request's timings; a
    sample the model refuses is the client's error (400), a failure of the model the server's (500)."""
    from mlharness.serving.batcher import BadSample

    try:
        answers = await batcher.infer(samples)
    except BadSample as exc:
        raise ProtocolError(400, str(exc)) from None
    except RuntimeError as exc:
        raise ProtocolError(500, str(exc)) from None
    rows = np.concatenate([rows for rows, _ in answers]) if len(answers) > 1 else answers[0][0]
    return rows, timing_parameters([timings for _, timings in answers])


def timing_parameters(timings: list[dict[str, float]]) -> dict[str, int]:
    """The server's timings of a request (us; the slowest of its samples), as response parameters."""
    keys = ("queue_us", "preprocess_us", "infer_us", "postprocess_us", "batch_size")
    return {key: int(round(max(t[key] for t in timings))) for key in keys}
