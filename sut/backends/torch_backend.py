"""PyTorch: an nn.Module from a factory named in the manifest plus a state dict, or TorchScript.
Arrays cross to and from torch without copies (torch.from_numpy / Tensor.numpy on CPU)."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import UserError
from specs.manifests import HardwareManifest
from sut.backends.base import Backend, FrameworkProfile, OpEvent
from sut.processing import ProcessingContext, compile_function

_THREADS_LOCK = threading.Lock()


class TorchBackend(Backend):
    name = "torch"
    devices = ("cpu", "cuda")
    framework = "torch"

    @classmethod
    def device_problem(cls, hardware: HardwareManifest) -> str | None:
        """A cuda:N device must be one this torch build sees."""
        problem = super().device_problem(hardware)
        if problem or hardware.device == "cpu":
            return problem
        import torch

        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            return f"device: no CUDA device is visible to torch {torch.__version__} ({build}), got {hardware.device}"
        count = torch.cuda.device_count()
        index = int(hardware.device.partition(":")[2])
        if index >= count:
            return f"device: torch sees {count} CUDA device(s) (cuda:0..cuda:{count - 1}), got {hardware.device}"
        return None

    def load(self) -> None:
        import torch

        self._torch = torch
        with _THREADS_LOCK:
            if self.intra_op_threads:
                torch.set_num_threads(self.intra_op_threads)
            if self.inter_op_threads:
                try:
                    torch.set_num_interop_threads(self.inter_op_threads)
                except RuntimeError:
                    pass  # fixed once per process by torch; the first setting stands
        self.device = torch.device(self.hardware.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"{self.hardware.path}: device: {self.hardware.device} but torch sees no CUDA device")
        if "torchscript" in self.sources:
            self.module = torch.jit.load(str(self.sources["torchscript"]), map_location=self.device)
        else:
            factory = compile_function(self.model.factory or "", "factory", f"{self.model.path}: sources.module")
            ctx = ProcessingContext(attributes=dict(self.model.attributes), sources=dict(self.sources), model=self.model)
            self.module = factory(ctx)
            if "weights" in self.sources:
                state = torch.load(str(self.sources["weights"]), map_location="cpu", weights_only=True)
                try:
                    self.module.load_state_dict(state)
                except RuntimeError as exc:
                    first = str(exc).strip().splitlines()[0]
                    raise UserError(f"{self.model.path}: sources.weights: state dict does not fit the module: {first}") from None
        self.module.eval().to(self.device)
        self.input_names = [spec.name for spec in self.model.inputs]
        self.output_names = [spec.name for spec in self.model.outputs]
        self.keyword_inputs = bool(self.model.attributes.get("keyword_inputs", False))

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        tensors = {name: torch.from_numpy(inputs[name]).to(self.device, non_blocking=True) for name in self.input_names}
        with torch.inference_mode():
            raw = self.module(**tensors) if self.keyword_inputs else self.module(*tensors.values())
        return dict(zip(self.output_names, self._as_arrays(raw)))

    def _as_arrays(self, raw: Any) -> list[np.ndarray]:
        if isinstance(raw, self._torch.Tensor):
            items = [raw]
        elif isinstance(raw, dict) or hasattr(raw, "keys"):
            items = [raw[name] for name in self.output_names]
        else:
            items = list(raw)[: len(self.output_names)]
        return [t.detach().cpu().numpy() for t in items]

    def profiling_unavailable(self) -> str | None:
        return None

    def start_profiling(self, out_dir: Path) -> None:
        """torch.profiler over every thread (SUT workers call predict, not the thread that starts it);
        CUDA kernels through CUPTI when the module runs on a GPU."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        config = self._torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        self._profile_dir = Path(out_dir)
        self._profiler = profile(activities=activities, experimental_config=config)
        self._profiler.start()

    def end_profiling(self) -> FrameworkProfile:
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        path = self._profile_dir / "torch_profile.json"
        profiler.export_chrome_trace(str(path))  # carries OS thread ids, which the event API does not
        return FrameworkProfile("torch", "realtime", torch_events(path), [path])

    def close(self) -> None:
        self.module = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "torch": self._torch.__version__,
                "torch_threads": self._torch.get_num_threads(),
                "torchscript": "torchscript" in self.sources}


_TORCH_CATEGORIES = {"cpu_op": "op", "kernel": "kernel", "gpu_memcpy": "kernel", "gpu_memset": "kernel"}


def torch_events(path: Path) -> list[OpEvent]:
    """torch.profiler's Chrome trace: microseconds after `baseTimeNanoseconds` (realtime clock)."""
    trace = json.loads(path.read_text())
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    events = []
    for raw in trace.get("traceEvents", []):
        category = _TORCH_CATEGORIES.get(raw.get("cat", ""))
        if raw.get("ph") != "X" or category is None:
            continue
        tid = raw.get("tid")
        device = "cuda" if category == "kernel" else "cpu"
        events.append(OpEvent(raw["name"], category, raw["name"], base_ns + round(float(raw["ts"]) * 1000),
                              round(float(raw.get("dur", 0)) * 1000), tid if isinstance(tid, int) else 0, device))
    return events
