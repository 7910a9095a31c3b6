"""Raw device memory for the ONNX Runtime GPU path: allocations, page-locked host buffers and
asynchronous copies on one stream per thread, through pycuda (`mlharness[gpu]`).

IOBinding binds an address, a shape and an element type; DeviceArray is exactly that plus the
allocation that keeps the address valid. HostMemory offers the same interface over ordinary host
memory: ONNX Runtime binds "cpu" addresses the same way, so the code that gathers batches and binds
them runs for real on a machine without a GPU (the tests use it there)."""
from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from mlharness.errors import UserError


@dataclass(frozen=True)
class DeviceArray:
    """A C-contiguous array at `ptr` on `device` ("cuda" or "cpu", as IOBinding names devices)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: str
    device_id: int
    owner: Any = None  # the allocation behind ptr; a view keeps it alive

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    def rows(self, start: int, count: int) -> "DeviceArray":
        """Rows [start, start + count) as a view (no copy)."""
        return DeviceArray(self.ptr + start * self.row_bytes, (count, *self.shape[1:]), self.dtype, self.device,
                           self.device_id, self.owner)


def row_runs(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """(batch row, staged row, count) for each run of consecutive staged rows: a batch gathered from
    rows 4, 5, 6, 9 is two copies, not four (LoadGen's Offline order is often sequential)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return []
    starts = np.concatenate(([0], np.flatnonzero(np.diff(rows) != 1) + 1))
    ends = np.concatenate((starts[1:], [rows.size]))
    return [(int(s), int(rows[s]), int(e - s)) for s, e in zip(starts, ends)]


class DeviceMemory(Protocol):
    device: str
    device_id: int
    kind: str  # what the record says: "pycuda" or "host"

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> DeviceArray: ...
    def upload(self, array: np.ndarray) -> DeviceArray: ...
    def pinned_empty(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray: ...
    def copy_rows(self, src: DeviceArray, rows: np.ndarray, dst: DeviceArray) -> None: ...
    def copy_in(self, host: np.ndarray, dst: DeviceArray) -> None: ...
    def copy_out(self, src_ptr: int, nbytes: int, host: np.ndarray) -> None: ...
    def synchronize(self) -> None: ...


def check_rows(rows: np.ndarray, staged: int) -> None:
    """The handoff's rule for a gather: a row outside [0, staged) is a bug, named."""
    if rows.size and (rows.min() < 0 or rows.max() >= staged):
        position = int(np.argmax((rows < 0) | (rows >= staged)))
        raise IndexError(f"row {int(rows[position])} (position {position}) is out of bounds for {staged} staged samples")


class HostMemory:
    """DeviceMemory over host memory: what IOBinding calls device "cpu". Copies are memmoves."""

    device = "cpu"
    device_id = 0
    kind = "host"

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> DeviceArray:
        array = np.empty(tuple(shape), dtype)
        return DeviceArray(array.ctypes.data, array.shape, array.dtype, self.device, self.device_id, array)

    def upload(self, array: np.ndarray) -> DeviceArray:
        target = self.empty(array.shape, array.dtype)
        target.owner[...] = array
        return target

    def pinned_empty(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        return np.empty(tuple(shape), dtype)

    def copy_rows(self, src: DeviceArray, rows: np.ndarray, dst: DeviceArray) -> None:
        check_rows(rows, src.shape[0])
        stride = src.row_bytes
        for at, row, count in row_runs(rows):
            ctypes.memmove(dst.ptr + at * stride, src.ptr + row * stride, count * stride)

    def copy_in(self, host: np.ndarray, dst: DeviceArray) -> None:
        ctypes.memmove(dst.ptr, np.ascontiguousarray(host).ctypes.data, host.nbytes)

    def copy_out(self, src_ptr: int, nbytes: int, host: np.ndarray) -> None:
        ctypes.memmove(host.ctypes.data, src_ptr, nbytes)

    def synchronize(self) -> None:
        pass


def pycuda_problem() -> str | None:
    """Why pycuda cannot serve the ONNX Runtime GPU path here, or None."""
    try:
        import pycuda.driver  # noqa: F401
    except ImportError as exc:
        return f"the onnxruntime GPU path needs pycuda ({exc}); pip install 'mlharness[gpu]'"
    return None


class PycudaMemory:
    """DeviceMemory on cuda:N through pycuda, in the device's primary context (the one the CUDA
    runtime, and so ONNX Runtime, uses): addresses pass between the two without copies. Each thread
    that touches it gets a stream of its own, so SUT workers never wait on each other's copies.

    The context is pushed for each operation and popped after it, never left current: pycuda aborts
    the process when a thread, or the interpreter at exit, ends with a context it pushed still on its
    stack (seen on an H200 on 2026-11-27: the run's process died of SIGABRT after its last sample)."""

    device = "cuda"
    kind = "pycuda"

    def __init__(self, device_id: int):
        problem = pycuda_problem()
        if problem:
            raise UserError(problem)
        import pycuda.driver as cuda

        cuda.init()
        self._cuda = cuda
        self.device_id = device_id
        self._context = cuda.Device(device_id).retain_primary_context()
        self._local = threading.local()

    @contextmanager
    def _active(self) -> Iterator[Any]:
        """The primary context current on this thread for one operation; yields the thread's stream."""
        self._context.push()
        try:
            stream = getattr(self._local, "stream", None)
            if stream is None:
                stream = self._local.stream = self._cuda.Stream()
            yield stream
        finally:
            self._cuda.Context.pop()

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> DeviceArray:
        dtype = np.dtype(dtype)
        nbytes = max(1, int(np.prod(tuple(shape), dtype=np.int64)) * dtype.itemsize)
        with self._active():
            allocation = self._cuda.mem_alloc(nbytes)
        return DeviceArray(int(allocation), tuple(shape), dtype, self.device, self.device_id, allocation)

    def upload(self, array: np.ndarray) -> DeviceArray:
        """Once per LoadQuerySamples, outside the timed region: a plain synchronous copy."""
        target = self.empty(array.shape, array.dtype)
        with self._active():
            self._cuda.memcpy_htod(target.ptr, np.ascontiguousarray(array))
        return target

    def pinned_empty(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        with self._active():
            return self._cuda.pagelocked_empty(tuple(shape), np.dtype(dtype))

    def copy_rows(self, src: DeviceArray, rows: np.ndarray, dst: DeviceArray) -> None:
        check_rows(rows, src.shape[0])
        stride = src.row_bytes
        with self._active() as stream:
            for at, row, count in row_runs(rows):
                self._cuda.memcpy_dtod_async(dst.ptr + at * stride, src.ptr + row * stride, count * stride, stream)

    def copy_in(self, host: np.ndarray, dst: DeviceArray) -> None:
        # A host array from outside the staging (the warm-up's): not page-locked, so a synchronous copy.
        with self._active():
            self._cuda.memcpy_htod(dst.ptr, np.ascontiguousarray(host))

    def copy_out(self, src_ptr: int, nbytes: int, host: np.ndarray) -> None:
        """Into a page-locked buffer from pinned_empty: asynchronous on this thread's stream."""
        with self._active() as stream:
            self._cuda.memcpy_dtoh_async(host.reshape(-1).view(np.uint8)[:nbytes], src_ptr, stream)

    def synchronize(self) -> None:
        with self._active() as stream:
            stream.synchronize()

    def new_event(self) -> Any:
        """A CUDA event for timing work on this thread's stream (mlharness.sut.device_timing)."""
        with self._active():
            return self._cuda.Event()

    def record(self, event: Any) -> None:
        with self._active() as stream:
            event.record(stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded events, once the later one has completed."""
        with self._active():
            end.synchronize()
            return start.time_till(end)
