"""ONNX Runtime's tensor type names ("tensor(float)", as NodeArg.type gives them) as numpy dtypes: one
map for the backend's check of the declared inputs and for the bricks' output buffers."""
from __future__ import annotations

import numpy as np

NUMPY_OF_ORT: dict[str, type] = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16, "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32, "tensor(uint32)": np.uint32, "tensor(int64)": np.int64, "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_}


def numpy_name(ort_type: str) -> str | None:
    """The numpy name of an ONNX Runtime tensor type ("float32"), or None for a type not in the map
    (strings, sequences, maps: nothing to compare against)."""
    dtype = NUMPY_OF_ORT.get(ort_type)
    return np.dtype(dtype).name if dtype is not None else None
