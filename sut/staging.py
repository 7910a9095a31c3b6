"""The query sample library's storage: LoadQuerySamples preprocesses the chosen samples once
(outside the timed region) into one contiguous array per model input; UnloadQuerySamples frees it."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from harness.errors import UserError
from harness.manifests import TensorSpec
from sut.processing import ProcessingContext


class SampleError(UserError):
    """User code failed on one sample; the message names the sample index."""

    def __init__(self, indices: Sequence[int], stage: str, exc: BaseException):
        self.indices = list(indices)
        self.stage = stage
        which = f"sample {self.indices[0]}" if len(self.indices) == 1 else f"samples {self.indices}"
        super().__init__(f"{which}: {stage} raised {type(exc).__name__}: {exc}")


class StagedSamples:
    def __init__(self, items: Sequence[tuple[Any, Any]], inputs: Sequence[TensorSpec],
                 preprocess: Callable[[Any, ProcessingContext], Any] | None,
                 load: Callable[[Any, ProcessingContext], Any] | None, ctx: ProcessingContext):
        self.items = items
        self.inputs = list(inputs)
        self.preprocess = preprocess
        self.load_raw = load
        self.ctx = ctx
        self.arrays: dict[str, np.ndarray] = {}
        self.row_of = np.full(len(items), -1, dtype=np.int64)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def _prepare(self, index: int) -> dict[str, np.ndarray]:
        stage = "load"
        try:
            raw = self.items[index][0]
            if self.load_raw is not None:
                raw = self.load_raw(raw, self.ctx)
            stage = "preprocess"
            value = self.preprocess(raw, self.ctx) if self.preprocess is not None else raw
        except Exception as exc:
            raise SampleError([index], stage, exc) from exc
        if not isinstance(value, dict):
            value = {self.inputs[0].name: value}
        arrays = {}
        for spec in self.inputs:
            if spec.name not in value:
                raise SampleError([index], "preprocess", KeyError(f"no array for input {spec.name!r}"))
            arrays[spec.name] = np.asarray(value[spec.name], dtype=spec.element_type)
        return arrays

    def load_samples(self, indices: Sequence[int]) -> None:
        """Preprocess `indices` into fresh contiguous arrays; rows follow the order given."""
        indices = list(indices)
        if not indices:
            return
        first = self._prepare(indices[0])
        arrays = {name: np.empty((len(indices), *a.shape), a.dtype) for name, a in first.items()}
        for row, index in enumerate(indices):
            prepared = first if row == 0 else self._prepare(index)
            for name, array in prepared.items():
                if array.shape != arrays[name].shape[1:]:
                    raise SampleError([index], "preprocess", ValueError(
                        f"input {name!r} has shape {array.shape}, the first staged sample had {arrays[name].shape[1:]}"))
                arrays[name][row] = array
        row_of = np.full(len(self.items), -1, dtype=np.int64)
        row_of[indices] = np.arange(len(indices))
        with self._lock:
            self.arrays, self.row_of = arrays, row_of

    def unload_samples(self, indices: Sequence[int]) -> None:
        with self._lock:
            self.arrays = {}
            self.row_of = np.full(len(self.items), -1, dtype=np.int64)

    def rows(self, indices: Sequence[int]) -> np.ndarray:
        rows = self.row_of[np.asarray(indices, dtype=np.int64)]
        if rows.size and rows.min() < 0:
            missing = [int(i) for i, r in zip(indices, rows) if r < 0][:5]
            raise SampleError(missing, "staging", LookupError("sample was issued but never loaded by LoadQuerySamples"))
        return rows

    def labels(self) -> list[Any]:
        return [item[1] for item in self.items]
