"""Samples that live on the device: on `device: cuda:N`, LoadQuerySamples preprocesses on the host
as on the CPU (same checks, same errors), then puts the staged arrays on the device once, as MLPerf
GPU harnesses do. A batch of one is a view of its device row; a larger batch is gathered on the
device into a per-worker buffer. Nothing is copied per sample on the host in the timed region.

Which device memory is used is the backend's choice (its `device_staging()`): torch tensors for the
torch backend (mlharness.sut.device_torch), pycuda allocations that IOBinding binds for onnxruntime
(BufferStaging over mlharness.sut.device_memory). A backend without one (every CPU run) gets the plain
StagedSamples, unchanged."""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from mlharness.sut.device_memory import DeviceArray, DeviceMemory
from mlharness.sut.processing import ProcessingContext
from mlharness.sut.staging import StagedSamples, _never_loaded

Feed = dict[str, Any]  # input name -> a device value the backend's predict takes (or a host array)


class DeviceStaging(Protocol):
    """How one backend keeps staged samples on its device."""

    def describe(self) -> dict[str, Any]: ...
    def put(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]: ...
    def row_feed(self, staged: dict[str, Any], row: int) -> Feed: ...
    def batch_feed(self, staged: dict[str, Any], worker: int, rows: np.ndarray) -> Feed: ...


class BufferStaging:
    """DeviceStaging over a DeviceMemory: one allocation per input, batches gathered into a buffer per
    worker by row runs (device-to-device copies on the worker's stream), then the stream is
    synchronised, since the framework reads the batch on a stream of its own."""

    def __init__(self, memory: DeviceMemory, max_batch_size: int):
        self.memory = memory
        self.max_batch_size = max(1, max_batch_size)
        self._buffers: dict[tuple[int, str], DeviceArray] = {}

    def describe(self) -> dict[str, Any]:
        return {"memory": self.memory.kind, "device": f"{self.memory.device}:{self.memory.device_id}",
                "gather": "device-to-device copies per run of consecutive rows"}

    def put(self, arrays: dict[str, np.ndarray]) -> dict[str, DeviceArray]:
        staged = {name: self.memory.upload(array) for name, array in arrays.items()}
        self._buffers.clear()  # shapes may differ from the previous load's
        return staged

    def row_feed(self, staged: dict[str, DeviceArray], row: int) -> Feed:
        return {name: array.rows(row, 1) for name, array in staged.items()}

    def batch_feed(self, staged: dict[str, DeviceArray], worker: int, rows: np.ndarray) -> Feed:
        feed = {}
        for name, array in staged.items():
            buffer = self._buffers.get((worker, name))
            if buffer is None or buffer.shape[0] < len(rows):
                buffer = self.memory.empty((max(self.max_batch_size, len(rows)), *array.shape[1:]), array.dtype)
                self._buffers[(worker, name)] = buffer
            out = buffer.rows(0, len(rows))
            self.memory.copy_rows(array, rows, out)
            feed[name] = out
        self.memory.synchronize()
        return feed


class DeviceStagedSamples(StagedSamples):
    """StagedSamples whose rows are also on the device; `device_gather` replaces the SUT's host gather."""

    def __init__(self, items: Sequence[tuple[Any, Any]], inputs: Sequence[Any],
                 preprocess: Callable[[Any, ProcessingContext], Any] | None,
                 load: Callable[[Any, ProcessingContext], Any] | None, ctx: ProcessingContext,
                 staging: DeviceStaging):
        super().__init__(items, inputs, preprocess, load, ctx)
        self.staging = staging
        self.device_arrays: dict[str, Any] = {}
        self._device_rows: list[Feed] = []

    def load_samples(self, indices: Sequence[int]) -> None:
        indices = list(indices)
        if not indices:
            return
        super().load_samples(indices)  # host staging and every check, as on the CPU
        device_arrays = self.staging.put(self.arrays)
        rows = [self.staging.row_feed(device_arrays, row) for row in range(len(indices))]
        with self._lock:
            self.device_arrays, self._device_rows = device_arrays, rows

    def unload_samples(self, indices: Sequence[int]) -> None:
        super().unload_samples(indices)
        with self._lock:
            self.device_arrays, self._device_rows = {}, []

    def feed_of(self, index: int) -> Feed:
        """One sample's device row as a batch of one (a view): the inline path costs no copy at all."""
        rows = self._single[0]
        row = rows[index]
        if row < 0:
            raise _never_loaded([index])
        return self._device_rows[row]

    def device_gather(self, worker: int, rows: np.ndarray) -> Feed:
        """The SUT's `_inputs_for(worker, rows)` for device-resident samples."""
        return self.staging.batch_feed(self.device_arrays, worker, rows)


def staged_samples(backend: Any, items: Sequence[tuple[Any, Any]], inputs: Sequence[Any],
                   preprocess: Callable[[Any, ProcessingContext], Any] | None,
                   load: Callable[[Any, ProcessingContext], Any] | None, ctx: ProcessingContext) -> StagedSamples:
    """Device-resident staging when the loaded backend offers one (a cuda device), else StagedSamples."""
    make = getattr(backend, "device_staging", None)
    staging = make() if make is not None else None
    if staging is None:
        return StagedSamples(items, inputs, preprocess, load, ctx)
    return DeviceStagedSamples(items, inputs, preprocess, load, ctx, staging)
