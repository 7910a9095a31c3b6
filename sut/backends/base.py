"""The contract every backend keeps: load once, predict on a batch of named arrays, close."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlharness.specs.manifests import HardwareManifest, ModelManifest


@dataclass(frozen=True)
class OpEvent:
    """One span from a framework's own profiler. `start_ns` is on the clock the profile names
    (both ONNX Runtime and torch.profiler stamp with the realtime clock); `thread` is the OS thread id."""

    name: str
    category: str  # "session" (a whole run), "op" (a node or operator), "kernel" (device work)
    op_type: str
    start_ns: int
    dur_ns: int
    thread: int
    device: str = "cpu"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FrameworkProfile:
    framework: str
    clock: str  # "realtime" or "monotonic": how to read OpEvent.start_ns
    events: list[OpEvent]
    files: list[Path] = field(default_factory=list)  # the framework's raw trace, kept beside ours
    notes: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    name: str = ""
    devices: tuple[str, ...] = ("cpu",)  # device kinds (cpu, cuda) this backend can run on
    framework: str | None = None  # the module it runs on, required when the backend is created
    uses_tensorrt: bool = False  # whether it honours the hardware manifest's tensorrt section

    @classmethod
    def device_problem(cls, hardware: HardwareManifest) -> str | None:
        """Why this backend cannot run on the hardware manifest's device here ("FIELD: why"), or None.
        Backends with accelerators extend it with what their framework sees on this machine."""
        kind = hardware.device.partition(":")[0]
        if kind not in cls.devices:
            return f"device: the {cls.name} backend runs on {' or '.join(cls.devices)} only, got {hardware.device}"
        if hardware.tensorrt is not None and hardware.tensorrt.enabled and not cls.uses_tensorrt:
            return f"tensorrt: enabled, but the {cls.name} backend does not use TensorRT (the onnxruntime backend does)"
        return None

    def __init__(self, model: ModelManifest, sources: dict[str, Path], hardware: HardwareManifest,
                 options: dict[str, Any] | None = None):
        self.model = model
        self.sources = sources
        self.hardware = hardware
        self.options = dict(options or {})
        self.intra_op_threads = int(self.options.get("intra_op_threads") or hardware.intra_op_threads or 0)
        self.inter_op_threads = int(self.options.get("inter_op_threads") or hardware.inter_op_threads or 0)

    @abstractmethod
    def load(self) -> None:
        """Build the session or module; everything slow happens here, before LoadGen starts."""

    @abstractmethod
    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One batch in (arrays by input name, leading batch dim), arrays by output name out."""

    def close(self) -> None:
        """Release the session or module."""

    def describe(self) -> dict[str, Any]:
        """What the record should say about how this backend ran (providers, threads)."""
        return {"name": self.name, "intra_op_threads": self.intra_op_threads,
                "inter_op_threads": self.inter_op_threads, "device": self.hardware.device}

    # Framework profiling (the `framework` profiling level). Off unless started, so runs without
    # --profile never pay for it.
    def profiling_unavailable(self) -> str | None:
        """Why this backend cannot profile its framework here, or None when it can."""
        return f"the {self.name} backend has no framework profiler"

    def start_profiling(self, out_dir: Path) -> None:
        """Turn the framework's profiler on; called before LoadGen starts, never during a run."""
        raise NotImplementedError(self.profiling_unavailable() or "start_profiling")

    def end_profiling(self) -> FrameworkProfile:
        """Turn it off and return what it recorded; the backend runs unprofiled again afterwards."""
        raise NotImplementedError(self.profiling_unavailable() or "end_profiling")

    @property
    def supports_batching(self) -> bool:
        """False when the graph has a fixed batch of 1, so the SUT must send one sample at a time."""
        return True
