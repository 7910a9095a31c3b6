"""The Open Inference Protocol's tensor datatypes against numpy's, and tensors to and from the bytes
the protocol carries (row-major, no padding: `raw_input_contents`, the HTTP binary extension)."""
from __future__ import annotations

from typing import Any

import numpy as np

# The protocol's datatype names; BYTES (strings) is not used by mlharness' tensor models.
DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64}
_BY_DTYPE = {np.dtype(t): name for name, t in DATATYPES.items()}
# The typed `contents` field (gRPC) each datatype travels in, where a peer sends no raw bytes.
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                  "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                  "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                  "FP64": "fp64_contents"}


class TensorError(ValueError):
    """A tensor that does not match what its header says (size, datatype, shape)."""


def datatype_of(array: np.ndarray) -> str:
    try:
        return _BY_DTYPE[array.dtype]
    except KeyError:
        raise TensorError(f"dtype {array.dtype} has no Open Inference Protocol datatype") from None


def dtype_of(datatype: str) -> np.dtype:
    try:
        return np.dtype(DATATYPES[datatype])
    except KeyError:
        raise TensorError(f"datatype {datatype!r} is not one of {', '.join(DATATYPES)}") from None


def element_type_datatype(element_type: str) -> str:
    """A manifest's element_type (numpy's name: float32, int64, ...) as the protocol's datatype."""
    return datatype_of(np.empty(0, dtype=element_type))


def from_bytes(data: bytes | memoryview, datatype: str, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    dtype = dtype_of(datatype)
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise TensorError(f"shape {list(shape)} has a negative or non-integer dimension")
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) != count * dtype.itemsize:
        raise TensorError(f"{len(data)} bytes for a {datatype} tensor of shape {list(shape)} "
                          f"({count * dtype.itemsize} expected)")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def from_list(values: Any, datatype: str, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    """A tensor from the JSON form (`data`: flat or nested numbers)."""
    dtype = dtype_of(datatype)
    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise TensorError(f"data is not {datatype}: {exc}") from None
    if array.size != int(np.prod(shape, dtype=np.int64)):
        raise TensorError(f"{array.size} values for a tensor of shape {list(shape)}")
    return array.reshape(shape)


def as_contiguous(array: Any) -> np.ndarray:
    """A raw sample as the row-major array the protocol sends (scalars become shape [1])."""
    array = np.ascontiguousarray(array)
    return array.reshape(1) if array.ndim == 0 else array
