"""The torch backend's GPU pieces: samples staged as device tensors, batches gathered there with
index_select, one CUDA stream per thread, outputs copied once per batch (non-blocking) into pinned
host tensors, and optional CUDA graphs for fixed batch sizes (the harness key `cuda_graphs`).

Everything here takes the device as an argument: on `cpu` the same code runs without pinning or
streams, which is how it is tested on a machine without a GPU."""
from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any, Sequence

import numpy as np


class TorchDevice:
    """One device's per-thread state: the thread's stream (made current for it, so staging's gather
    and predict queue on the same stream) and its pinned host buffers."""

    def __init__(self, torch: Any, device: Any):
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self._local = threading.local()

    def stream(self) -> Any:
        """This thread's stream, made current on first use (None on the CPU)."""
        if not self.cuda:
            return None
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = self.torch.cuda.Stream(device=self.device)
            self.torch.cuda.set_stream(stream)
        return stream

    def synchronize(self) -> None:
        stream = self.stream()
        if stream is not None:
            stream.synchronize()

    def host_buffer(self, key: str, shape: Sequence[int], dtype: Any, rows: int) -> Any:
        """This thread's pinned host tensor for `key` (page-locked on cuda), grown when needed."""
        buffers = getattr(self._local, "host", None)
        if buffers is None:
            buffers = self._local.host = {}
        buffer = buffers.get(key)
        if buffer is None or tuple(buffer.shape[1:]) != tuple(shape[1:]) or buffer.shape[0] < shape[0] \
                or buffer.dtype != dtype:
            buffer = self.torch.empty((max(rows, shape[0]), *shape[1:]), dtype=dtype, pin_memory=self.cuda)
            buffers[key] = buffer
        return buffer[: shape[0]]

    def to_device(self, array: np.ndarray, rows: int) -> Any:
        """A host array (the warm-up's) onto the device: through this thread's pinned buffer, non-blocking."""
        host = self.torch.from_numpy(np.ascontiguousarray(array))
        if not self.cuda:
            return host
        self.stream()
        pinned = self.host_buffer(f"in:{array.dtype}:{array.shape[1:]}", host.shape, host.dtype, rows)
        pinned.copy_(host)
        return pinned.to(self.device, non_blocking=True)

    def to_host(self, tensors: Sequence[Any], rows: int) -> list[np.ndarray]:
        """Device outputs into this thread's pinned buffers (one non-blocking copy each), synchronised once."""
        arrays = []
        for position, tensor in enumerate(tensors):
            tensor = tensor.detach()
            host = self.host_buffer(f"out:{position}", tuple(tensor.shape), tensor.dtype, rows)
            host.copy_(tensor, non_blocking=self.cuda)
            arrays.append(host)
        self.synchronize()
        return [host.numpy() for host in arrays]


class TorchStaging:
    """DeviceStaging (mlharness.sut.device_staging) as device tensors: staged once, gathered with index_select
    into a device buffer per worker; the row indices travel through a pinned buffer."""

    def __init__(self, torch_device: TorchDevice, max_batch_size: int):
        self.on = torch_device
        self.max_batch_size = max(1, max_batch_size)
        self._buffers: dict[tuple[int, str], Any] = {}

    def describe(self) -> dict[str, Any]:
        return {"memory": "torch tensors", "device": str(self.on.device),
                "gather": "index_select on the device, per worker buffer"}

    def put(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        torch, on = self.on.torch, self.on
        on.stream()  # the copies below queue on this thread's stream, which synchronize() then waits for
        staged = {}
        for name, array in arrays.items():
            host = torch.from_numpy(array)
            staged[name] = host.pin_memory().to(on.device, non_blocking=True) if on.cuda else host
        on.synchronize()
        self._buffers.clear()
        return staged

    def row_feed(self, staged: dict[str, Any], row: int) -> dict[str, Any]:
        return {name: tensor[row:row + 1] for name, tensor in staged.items()}

    def batch_feed(self, staged: dict[str, Any], worker: int, rows: np.ndarray) -> dict[str, Any]:
        torch, on = self.on.torch, self.on
        on.stream()
        count = len(rows)
        if on.cuda:
            index_host = on.host_buffer("rows", (count,), torch.int64, self.max_batch_size)
            index_host.copy_(torch.from_numpy(np.asarray(rows, dtype=np.int64)))
            index = index_host.to(on.device, non_blocking=True)
        else:
            index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        feed = {}
        for name, tensor in staged.items():
            if count and (int(rows.min()) < 0 or int(rows.max()) >= tensor.shape[0]):
                bad = int(rows[(rows < 0) | (rows >= tensor.shape[0])][0])
                raise IndexError(f"row {bad} is out of bounds for {tensor.shape[0]} staged samples")
            buffer = self._buffers.get((worker, name))
            if buffer is None or buffer.shape[0] < count:
                buffer = torch.empty((max(self.max_batch_size, count), *tensor.shape[1:]), dtype=tensor.dtype,
                                     device=on.device)
                self._buffers[(worker, name)] = buffer
            out = buffer[:count]
            torch.index_select(tensor, 0, index, out=out)
            feed[name] = out
        return feed  # on this thread's stream, which predict uses too: no synchronisation needed


def cuda_graph_problem(device: str, inputs: Sequence[Any]) -> str | None:
    """Why `cuda_graphs` cannot be used ("cuda_graphs: why"), or None: a graph replays fixed shapes
    on a GPU, so it needs a cuda device and inputs without symbolic dims besides the batch."""
    if not device.startswith("cuda"):
        return f"cuda_graphs: CUDA graphs need a cuda:N device, the hardware manifest has {device}"
    for spec in inputs:
        symbolic = [dim for dim in spec.sample_shape() if not isinstance(dim, int)]
        if symbolic:
            return (f"cuda_graphs: input {spec.name!r} has symbolic dims {symbolic}; CUDA graphs replay fixed "
                    f"shapes only")
    return None


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The batch sizes captured: 1 (SingleStream, the inline path) and the largest; a batch between
    runs in the next larger graph, padded (its extra rows hold stale inputs, their outputs unused)."""
    return sorted({1, max(1, max_batch_size)})


class CudaGraphs:
    """CUDA graphs of the module, one per batch size, captured at load with static input and output
    tensors; a replay copies the batch in, replays, and hands back views of the static outputs. A
    graph's static tensors are shared, so each graph is replayed under its lock until its outputs
    have been copied out (`replaying`)."""

    def __init__(self, torch: Any, call: Any, inputs: Sequence[Any], device: Any, batch_sizes: Sequence[int],
                 warm_runs: int = 3):
        """`call(tensors by input name)` runs the module and returns its outputs as a list of tensors."""
        self.torch = torch
        self.batch_sizes = sorted(batch_sizes)
        self._graphs: dict[int, tuple[dict[str, Any], list[Any], Any, threading.Lock]] = {}
        for size in self.batch_sizes:
            static_in = {spec.name: torch.zeros((size, *spec.sample_shape()), dtype=getattr(torch, spec.element_type),
                                                device=device) for spec in inputs}
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.inference_mode(), torch.cuda.stream(side):
                for _ in range(warm_runs):  # the capture must not see first-call work (allocations, autotuning)
                    call(static_in)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph):
                static_out = call(static_in)
            self._graphs[size] = (static_in, static_out, graph, threading.Lock())

    def size_for(self, rows: int) -> int | None:
        for size in self.batch_sizes:
            if size >= rows:
                return size
        return None

    def replaying(self, tensors: dict[str, Any], rows: int) -> tuple[Any, list[Any]]:
        """(the graph's lock, held; its outputs' first `rows` rows) or (a null context, None) when no
        captured size fits. The caller copies the outputs out, then releases the lock."""
        size = self.size_for(rows)
        if size is None:
            return nullcontext(), None  # type: ignore[return-value]
        static_in, static_out, graph, lock = self._graphs[size]
        lock.acquire()
        try:
            for name, tensor in tensors.items():
                static_in[name][:rows].copy_(tensor, non_blocking=True)
            graph.replay()
        except BaseException:
            lock.release()
            raise
        return _Held(lock), [out[:rows] for out in static_out]


class _Held:
    """A lock already acquired, released when the with-block ends."""

    def __init__(self, lock: threading.Lock):
        self.lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        self.lock.release()
        return False
