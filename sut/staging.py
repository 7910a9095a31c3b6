"""The query sample library's storage: LoadQuerySamples preprocesses the chosen samples once
(outside the timed region) into one contiguous array per model input; UnloadQuerySamples frees it."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.manifests import TensorSpec
from mlharness.sut.processing import ProcessingContext


class SampleError(UserError):
    """User code failed on, or broke the manifest's contract for, some samples; the message names
    the first few sample indices (all of them stay in `indices`) and the stage.

    `problem` is either the exception user code raised ("sample 3: preprocess raised ...") or a
    sentence saying what the stage returned ("sample 3: preprocess returned input 'x' as ...")."""

    SHOWN = 8  # a batch can hold a thousand samples; the message stays one readable line

    def __init__(self, indices: Sequence[int], stage: str, problem: BaseException | str):
        self.indices = list(indices)
        self.stage = stage
        if len(self.indices) == 1:
            which = f"sample {self.indices[0]}"
        elif len(self.indices) <= self.SHOWN:
            which = f"samples {self.indices}"
        else:
            which = f"samples {str(self.indices[:self.SHOWN])[:-1]}, ...] ({len(self.indices)} in all)"
        what = problem if isinstance(problem, str) else f"raised {type(problem).__name__}: {problem}"
        super().__init__(f"{which}: {stage} {what}")


def _never_loaded(indices: list[int]) -> SampleError:
    """The error for samples LoadGen issued that LoadQuerySamples never staged."""
    return SampleError(indices, "staging", LookupError("sample was issued but never loaded by LoadQuerySamples"))


def shape_text(shape: Sequence[int | str]) -> str:
    """A shape as Python prints a tuple, symbolic dims by name: (3, 224, 224), (sequence,), ()."""
    dims = [str(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def declared_text(spec: TensorSpec, per: str = "sample") -> str:
    """What the manifest declares, e.g. `float32 [batch, 1] (sample shape (1,))`."""
    return f"{spec.element_type} [{', '.join(map(str, spec.shape))}] ({per} shape {shape_text(spec.sample_shape())})"


def got_text(value: Any) -> str:
    """What user code returned, e.g. `float64 with shape (3, 7)`, `None`, `a list, not a numpy array`."""
    if isinstance(value, (np.ndarray, np.generic)):
        return f"{value.dtype} with shape {shape_text(value.shape)}"
    return "None" if value is None else f"a {type(value).__name__}, not a numpy array"


def check_sample(value: Any, spec: TensorSpec, bound: dict[str, tuple[str, int]]) -> str | None:
    """None when `value` is one sample of the input `spec`; else what is wrong, for SampleError.

    The contract: a numpy array (or numpy scalar) of exactly the declared element type and of the
    declared sample shape (the declared shape without its leading `batch`): the same rank, every
    fixed dim equal, and each symbolic dim the same size in every input of one sample (`bound`
    collects dim name -> (input name, size) over the inputs of the sample). Nothing is converted:
    a Python list or scalar would get whatever dtype numpy infers (int64, float64), and a silent
    cast (float64 to float32, float to int) would hide a preprocess that is not what the manifest
    says, so both are refused: the preprocess itself says `np.asarray(value, np.float32)`."""
    declared = spec.sample_shape()
    mismatch = f"returned input {spec.name!r} as {got_text(value)}; the manifest declares {declared_text(spec)}"
    if (not isinstance(value, (np.ndarray, np.generic)) or value.dtype != np.dtype(spec.element_type)
            or value.ndim != len(declared)
            or any(isinstance(dim, int) and size != dim for dim, size in zip(declared, value.shape))):
        return mismatch
    for dim, size in zip(declared, value.shape):
        if isinstance(dim, str):
            other, other_size = bound.setdefault(dim, (spec.name, size))
            if other_size != size:
                return f"{mismatch}, and {dim} is {other_size} in input {other!r} of the same sample"
    return None


def _nothing_staged(count: int) -> np.ndarray:
    """The row of each sample in the staged arrays, all negative: none is staged."""
    return np.full(count, -1, dtype=np.int64)


class StagedSamples:
    """The samples LoadGen chose, preprocessed and checked against the model's declared inputs."""

    def __init__(self, items: Sequence[tuple[Any, Any]], inputs: Sequence[TensorSpec],
                 preprocess: Callable[[Any, ProcessingContext], Any] | None,
                 load: Callable[[Any, ProcessingContext], Any] | None, ctx: ProcessingContext):
        self.items = items
        self.inputs = list(inputs)
        self.preprocess = preprocess
        self.load_raw = load
        self.ctx = ctx
        # The stage whose result must fit the declared inputs: the preprocess, else what load or
        # the dataset's samples function gave.
        self.value_stage = "preprocess" if preprocess is not None else "load" if load is not None else "samples"
        self.arrays: dict[str, np.ndarray] = {}
        self.row_of = _nothing_staged(len(items))
        # For the inline one-sample path (SingleStream): each sample's row as a Python list and each
        # row's inputs as views, made once per load, so a query costs two list lookups.
        self._single: tuple[list[int], list[dict[str, np.ndarray]]] = (self.row_of.tolist(), [])
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def _prepare(self, index: int) -> dict[str, np.ndarray]:
        """Load and preprocess one sample and check it against the declared inputs (check_sample):
        a mismatch is the user's to fix, so it stops the run here, outside the timed region."""
        stage = "load"
        try:
            raw = self.items[index][0]
            if self.load_raw is not None:
                raw = self.load_raw(raw, self.ctx)
            stage = "preprocess"
            value = self.preprocess(raw, self.ctx) if self.preprocess is not None else raw
        except Exception as exc:
            raise SampleError([index], stage, exc) from exc
        stage = self.value_stage
        names = [spec.name for spec in self.inputs]
        declared = ", ".join(map(repr, names))
        if not isinstance(value, dict):
            if len(names) > 1:
                raise SampleError([index], stage, f"returned {got_text(value)} for {len(names)} inputs; the manifest "
                                                  f"declares inputs {declared}: return {{input name: array}}")
            value = {names[0]: value}
        missing = [name for name in names if name not in value]
        extra = [name for name in value if name not in names]
        if missing or extra:
            wrong = f"no input {missing[0]!r}" if missing else f"input {extra[0]!r}, which is not declared"
            raise SampleError([index], stage, f"returned {wrong}; the manifest declares inputs {declared}, "
                                              f"got {', '.join(map(repr, value)) or 'none'}")
        arrays = {}
        bound: dict[str, tuple[str, int]] = {}
        for spec in self.inputs:
            problem = check_sample(value[spec.name], spec, bound)
            if problem is not None:
                raise SampleError([index], stage, problem)
            arrays[spec.name] = np.asarray(value[spec.name])
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
                    raise SampleError([index], self.value_stage, (
                        f"returned input {name!r} with shape {shape_text(array.shape)}, but the first staged sample's "
                        f"is {shape_text(arrays[name].shape[1:])}: the staged samples of an input share one shape"))
                arrays[name][row] = array
        row_of = _nothing_staged(len(self.items))
        row_of[indices] = np.arange(len(indices))
        views = [{name: array[row:row + 1] for name, array in arrays.items()} for row in range(len(indices))]
        with self._lock:
            self.arrays, self.row_of = arrays, row_of
            self._single = (row_of.tolist(), views)

    def unload_samples(self, indices: Sequence[int]) -> None:
        with self._lock:
            self.arrays = {}
            self.row_of = _nothing_staged(len(self.items))
            self._single = (self.row_of.tolist(), [])

    def feed_of(self, index: int) -> dict[str, np.ndarray]:
        """One staged sample's inputs as a batch of one (views, no copy): the inline path's rows()."""
        rows, views = self._single
        row = rows[index]
        if row < 0:
            raise _never_loaded([index])
        return views[row]

    def rows(self, indices: Sequence[int]) -> np.ndarray:
        rows = self.row_of[np.asarray(indices, dtype=np.int64)]
        if rows.size and rows.min() < 0:
            missing = [int(i) for i, r in zip(indices, rows) if r < 0][:5]
            raise _never_loaded(missing)
        return rows

    def labels(self) -> list[Any]:
        return [item[1] for item in self.items]
