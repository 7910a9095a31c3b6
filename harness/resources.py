"""Memory a run used: the process's peak resident set and, where torch ran on a GPU, its peak device memory.

A leaf module (nothing else of the project is imported) that never imports a framework: torch is
asked only when something else already imported it, so a CPU or ONNX Runtime run pays nothing."""
from __future__ import annotations

import resource
import sys
from typing import Any


def peak_rss_bytes() -> int:
    """The largest resident set this process has had so far (the kernel's high-water mark, not a sample).

    Linux's VmHWM belongs to the process image and starts afresh at exec; getrusage's ru_maxrss does
    not (a child started by fork + exec keeps its parent's peak), so it is only the fallback."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS reports bytes, Linux KiB


def current_rss_bytes() -> int | None:
    """The resident set now, or None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def device_memory(device: str) -> dict[str, Any] | None:
    """Peak device memory torch's caching allocator saw on `device` (`cuda:N`), or None when the device
    is not a GPU, torch was never imported, or CUDA was never initialised in this process. Memory other
    frameworks allocate themselves (ONNX Runtime's CUDA arena) is not seen by torch: without torch on
the GPU, NVML's figure for this process is reported instead (nvml_process_memory)."""
    if not device.startswith("cuda"):
        return None
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    index = int(device.partition(":")[2] or 0)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return nvml_process_memory(index)
    return {"device": device, "source": "torch.cuda",
            "peak_allocated_bytes": int(cuda.max_memory_allocated(index)),
            "peak_reserved_bytes": int(cuda.max_memory_reserved(index))}


def nvml_process_memory(index: int) -> dict[str, Any] | None:
    """The device memory this process holds on GPU `index` now, as NVML reports it (ONNX Runtime's
    arena included; a current figure, not a peak), or None without nvidia-ml-py, a driver or a figure."""
    try:
        import os

        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            used = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                    if p.pid == os.getpid() and p.usedGpuMemory is not None]
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None
    if not used:
        return None
    return {"device": f"cuda:{index}", "source": "nvml (this process, at the end of the run)",
            "used_bytes": int(sum(used))}


def usage(device: str) -> dict[str, Any]:
    """The run record's resource figures: `peak_rss_bytes` and `device_memory` (None on CPU)."""
    return {"peak_rss_bytes": peak_rss_bytes(), "device_memory": device_memory(device)}
