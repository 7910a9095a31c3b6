"""ONNX Runtime through IOBinding, one binding per worker thread: inputs bound where they lie (device
rows or a gathered device batch, mlharness.sut.device_staging), outputs written into device buffers allocated
once per worker, then copied once per batch into page-locked host buffers. The arrays returned are
views of those host buffers: the SUT postprocesses them and the zero-copy handoff points LoadGen at
them; the worker reuses them only for its next batch, after LoadGen has returned.

Outputs whose sample shape has symbolic dims (known only after the run) are bound to the device and
allocated by ONNX Runtime, then copied out the same way."""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from mlharness.sut.device_memory import DeviceArray, DeviceMemory


class BoundSession:
    """One worker's IOBinding over `session`. `outputs` is [(name, element type, sample shape or None
    when a dim is symbolic)] in the manifest's order."""

    def __init__(self, session: Any, memory: DeviceMemory, outputs: Sequence[tuple[str, str, tuple[int, ...] | None]],
                 max_batch_size: int):
        self.session = session
        self.memory = memory
        self.outputs = [(name, np.dtype(dtype), shape) for name, dtype, shape in outputs]
        self.max_batch_size = max(1, max_batch_size)
        self.binding = session.io_binding()
        self._device_out: dict[str, DeviceArray] = {}
        self._host_out: dict[str, np.ndarray] = {}
        self._device_in: dict[str, DeviceArray] = {}

    def _host_input(self, name: str, array: np.ndarray) -> DeviceArray:
        """A host array (the warm-up's) copied into this worker's device input buffer."""
        buffer = self._device_in.get(name)
        if buffer is None or buffer.shape[1:] != array.shape[1:] or buffer.dtype != array.dtype \
                or buffer.shape[0] < array.shape[0]:
            buffer = self.memory.empty((max(self.max_batch_size, array.shape[0]), *array.shape[1:]), array.dtype)
            self._device_in[name] = buffer
        view = buffer.rows(0, array.shape[0])
        self.memory.copy_in(array, view)
        return view

    def _host_buffer(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """This worker's page-locked output buffer for `name`, grown when a batch needs more."""
        buffer = self._host_out.get(name)
        if buffer is None or buffer.shape[1:] != shape[1:] or buffer.shape[0] < shape[0] or buffer.dtype != dtype:
            buffer = self.memory.pinned_empty((max(self.max_batch_size, shape[0]), *shape[1:]), dtype)
            self._host_out[name] = buffer
        return buffer[: shape[0]]

    def run(self, feed: dict[str, Any]) -> dict[str, np.ndarray]:
        binding, memory = self.binding, self.memory
        rows = 0
        for name, value in feed.items():
            if isinstance(value, np.ndarray):
                value = self._host_input(name, value)
            rows = value.shape[0]
            binding.bind_input(name, memory.device, memory.device_id, value.dtype.type, list(value.shape), value.ptr)
        for name, dtype, sample_shape in self.outputs:
            if sample_shape is None:
                binding.bind_output(name, memory.device, memory.device_id)
                continue
            buffer = self._device_out.get(name)
            if buffer is None or buffer.shape[0] < rows:
                buffer = memory.empty((max(self.max_batch_size, rows), *sample_shape), dtype)
                self._device_out[name] = buffer
            binding.bind_output(name, memory.device, memory.device_id, dtype.type, [rows, *sample_shape], buffer.ptr)
        binding.synchronize_inputs()
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        results: dict[str, np.ndarray] = {}
        bound = None
        for position, (name, dtype, sample_shape) in enumerate(self.outputs):
            if sample_shape is not None:
                source = self._device_out[name]
                shape = (rows, *sample_shape)
                source_ptr = source.ptr
            else:
                bound = bound if bound is not None else binding.get_outputs()
                value = bound[position]
                shape, source_ptr = tuple(value.shape()), value.data_ptr()
            host = self._host_buffer(name, dtype, shape)
            memory.copy_out(source_ptr, host.nbytes, host)
            results[name] = host
        memory.synchronize()
        return results


class BoundSessions:
    """A BoundSession per thread that calls predict (SUT workers, the inline path, the warm-up)."""

    def __init__(self, session: Any, memory: DeviceMemory, outputs: Sequence[tuple[str, str, tuple[int, ...] | None]],
                 max_batch_size: int):
        self._args = (session, memory, list(outputs), max_batch_size)
        self._local = threading.local()

    def run(self, feed: dict[str, Any]) -> dict[str, np.ndarray]:
        bound = getattr(self._local, "bound", None)
        if bound is None:
            bound = self._local.bound = BoundSession(*self._args)
        return bound.run(feed)


def output_layout(outputs: Sequence[Any]) -> list[tuple[str, str, tuple[int, ...] | None]]:
    """(name, element type, fixed sample shape or None) of the manifest's outputs: what can be
    preallocated once per worker and what ONNX Runtime must allocate after seeing the inputs."""
    layout = []
    for spec in outputs:
        sample = tuple(spec.sample_shape())
        fixed = all(isinstance(dim, int) for dim in sample)
        layout.append((spec.name, spec.element_type, sample if fixed else None))  # type: ignore[arg-type]
    return layout
