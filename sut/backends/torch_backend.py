"""PyTorch: an nn.Module from a factory named in the manifest plus a state dict, or TorchScript.
Arrays cross to and from torch without copies (torch.from_numpy / Tensor.numpy on CPU).

On a cuda device (mlharness.sut.device_torch): samples staged as device tensors, one stream per thread,
inputs from the warm-up through pinned memory, outputs copied once per batch into pinned host
tensors, torch.inference_mode, and CUDA graphs for batch sizes 1 and max_batch_size when the harness
key `cuda_graphs` is on. The CPU predict below is unchanged."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.manifests import HardwareManifest
from mlharness.sut.backends.base import Backend, FrameworkProfile, OpEvent
from mlharness.sut.device_timing import DeviceTimed
from mlharness.sut.processing import ProcessingContext, compile_function

_THREADS_LOCK = threading.Lock()


class TorchBackend(DeviceTimed, Backend):
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

    _on: Any = None  # mlharness.sut.device_torch.TorchDevice on a cuda device, once loaded
    _graphs: Any = None  # mlharness.sut.device_torch.CudaGraphs when cuda_graphs is on

    @property
    def max_batch_size(self) -> int:
        return int(self.options.get("max_batch_size") or 1)

    @property
    def cuda_graphs(self) -> bool:
        return bool(self.options.get("cuda_graphs"))

    def load(self) -> None:
        import torch

        if self.cuda_graphs:
            from mlharness.sut.device_torch import cuda_graph_problem

            problem = cuda_graph_problem(self.hardware.device, self.model.inputs)
            if problem:
                raise UserError(f"{self.hardware.path}: {problem}" if problem.startswith("cuda_graphs: CUDA")
                                else f"{self.model.path}: {problem}")
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
        if self.device.type == "cuda":
            self._load_device_path()

    def _load_device_path(self) -> None:
        from mlharness.sut.device_timing import DeviceTimings
        from mlharness.sut.device_torch import CudaGraphs, TorchDevice, graph_batch_sizes

        self._on = TorchDevice(self._torch, self.device)
        self._device_timings = DeviceTimings()
        if self.cuda_graphs:
            self._graphs = CudaGraphs(self._torch, self._call, self.model.inputs, self.device,
                                      graph_batch_sizes(self.max_batch_size))
        self.predict = self._predict_device  # type: ignore[method-assign]

    def device_staging(self) -> Any:
        """Device-resident samples (mlharness.sut.device_staging) on a cuda device; None on the CPU."""
        if self._on is None:
            return None
        from mlharness.sut.device_torch import TorchStaging

        return TorchStaging(self._on, self.max_batch_size)

    def _call(self, tensors: dict[str, Any]) -> list[Any]:
        raw = self.module(**tensors) if self.keyword_inputs else self.module(*(tensors[n] for n in self.input_names))
        return self._as_tensors(raw)

    def _predict_device(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """Device tensors in (staged rows or a gathered batch; host arrays go through pinned memory),
        pinned host arrays out, all on this thread's stream."""
        torch, on = self._torch, self._on
        on.stream()
        rows = next(iter(inputs.values())).shape[0]
        tensors = {name: value if isinstance(value, torch.Tensor) else on.to_device(value, self.max_batch_size)
                   for name, value in ((n, inputs[n]) for n in self.input_names)}

        def work() -> list[np.ndarray]:
            with torch.inference_mode():
                held, outputs = self._graphs.replaying(tensors, rows) if self._graphs is not None else (None, None)
                if outputs is None:
                    return on.to_host(self._call(tensors), self.max_batch_size)
                with held:
                    return on.to_host(outputs, self.max_batch_size)

        arrays = self._device_timings.timed(self._record_event, self._record_event, self._elapsed_ms, work, rows)
        return dict(zip(self.output_names, arrays))

    def _record_event(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def _elapsed_ms(start: Any, end: Any) -> float:
        end.synchronize()
        return float(start.elapsed_time(end))

    @property
    def device_timing_unavailable(self) -> str | None:
        return None if self._on is not None else "the module runs on the CPU"

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        tensors = {name: torch.from_numpy(inputs[name]).to(self.device, non_blocking=True) for name in self.input_names}
        with torch.inference_mode():
            raw = self.module(**tensors) if self.keyword_inputs else self.module(*tensors.values())
        return dict(zip(self.output_names, self._as_arrays(raw)))

    def _as_arrays(self, raw: Any) -> list[np.ndarray]:
        return [t.detach().cpu().numpy() for t in self._as_tensors(raw)]

    def _as_tensors(self, raw: Any) -> list[Any]:
        if isinstance(raw, self._torch.Tensor):
            return [raw]
        if isinstance(raw, dict) or hasattr(raw, "keys"):
            return [raw[name] for name in self.output_names]
        return list(raw)[: len(self.output_names)]

    @property
    def prefers_caller_thread(self) -> bool:
        """On the CPU, predict on the thread that loaded and warmed the module: torch's OpenMP runtime
        (libgomp) slows parallel regions on a second live thread once the first has run some
        (mobilenet-v2, batch 1, 2 threads: 15.8 ms on the main thread, 35.6 ms on another)."""
        return self.hardware.device == "cpu"

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
                "torchscript": "torchscript" in self.sources, "device_path": self.describe_device_path()}

    def describe_device_path(self) -> dict[str, Any] | None:
        """How a cuda run moved tensors and whether it replayed CUDA graphs (None on the CPU)."""
        if self._on is None:
            return None
        graphs = self._graphs
        return {"staging": "device tensors, gathered with index_select", "streams": "one per thread",
                "inputs": "non-blocking copies from pinned memory", "outputs": "pinned host tensors, one copy per batch",
                "inference_mode": True, "max_batch_size": self.max_batch_size,
                "cuda_graphs": {"batch_sizes": graphs.batch_sizes,
                                "smaller_batches": "padded to the next captured size"} if graphs is not None else None}


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
