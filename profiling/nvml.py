"""GPU utilisation and memory through NVML (the nvidia-ml-py package), when a driver and a GPU are
present; otherwise the reason it is unavailable."""
from __future__ import annotations

import ctypes
from typing import Any


def open_devices() -> tuple[Any, list[Any], str | None]:
    """(pynvml module, device handles, None) or (None, [], why not)."""
    try:
        import pynvml
    except ImportError:
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None, [], "no NVIDIA driver (libnvidia-ml.so.1 not found)"
        return None, [], "NVML is present but the nvidia-ml-py package (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as exc:  # pynvml raises NVMLError subclasses for a missing driver or device
        return None, [], f"NVML failed: {exc}"
    if not handles:
        pynvml.nvmlShutdown()
        return None, [], "NVML sees no GPU"
    return pynvml, handles, None


def sample(pynvml: Any, handles: list[Any]) -> dict[str, float]:
    """Utilisation (SM and memory), memory used, power and clocks of each GPU. A reading a GPU does not
    support (NVMLError_NotSupported: power on some boards) is left out, the others stay."""
    values: dict[str, float] = {}
    for i, handle in enumerate(handles):
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        values[f"gpu{i}_util_pct"] = float(rates.gpu)
        values[f"gpu{i}_mem_util_pct"] = float(rates.memory)
        values[f"gpu{i}_mem_mib"] = round(pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20, 1)
        for key, read in ((f"gpu{i}_power_w", lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                          (f"gpu{i}_sm_clock_mhz", lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                          (f"gpu{i}_mem_clock_mhz", lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))):
            try:
                values[key] = round(float(read(handle)), 1)
            except pynvml.NVMLError:
                pass
    return values


def close(pynvml: Any) -> None:
    if pynvml is not None:
        pynvml.nvmlShutdown()
