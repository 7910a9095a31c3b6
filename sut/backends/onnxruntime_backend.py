"""ONNX Runtime: CPU execution provider by default; CUDA on the hardware manifest's cuda:N device,
with TensorRT ahead of it when the manifest's `tensorrt` section enables it. A provider this build
lacks, or one that cannot start, is an error naming the hardware manifest, never a silent CPU run.

On a cuda device the session runs through IOBinding (mlharness.sut.device_iobinding): samples staged in device
memory (mlharness.sut.device_staging over pycuda), outputs into preallocated device buffers copied once per
batch into page-locked host buffers. The CPU path is the plain `session.run` below, unchanged."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.artifacts import cache_dir
from mlharness.specs.manifests import HardwareManifest
from mlharness.sut.backends.base import Backend, FrameworkProfile, OpEvent
from mlharness.sut.backends.onnx_types import numpy_name
from mlharness.sut.device_timing import DeviceTimed
from mlharness.sut.graph_transforms import apply_transforms


_ORT_LEVELS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC",
               "disable_all": "ORT_DISABLE_ALL"}


class OnnxRuntimeBackend(DeviceTimed, Backend):
    name = "onnxruntime"
    devices = ("cpu", "cuda")
    framework = "onnxruntime"
    uses_tensorrt = True
    _device_memory: Any = None  # mlharness.sut.device_memory.PycudaMemory on a cuda device, once loaded

    @classmethod
    def device_problem(cls, hardware: HardwareManifest) -> str | None:
        """A cuda device needs this onnxruntime build's CUDA provider, and tensorrt its TensorRT provider."""
        problem = super().device_problem(hardware)
        if problem or hardware.device == "cpu":
            return problem
        import onnxruntime as ort

        from mlharness.sut.device_memory import pycuda_problem

        return provider_problem(hardware, ort.get_available_providers(), ort.__version__) or pycuda_problem()

    @property
    def graph_optimization(self) -> str:
        return str(self.options.get("graph_optimization") or "all")

    @property
    def execution_mode(self) -> str:
        return str(self.options.get("execution_mode") or "sequential")

    def load(self) -> None:
        import onnxruntime as ort

        graph = self.sources["graph"]
        self.graph_path, self.graph_sha256 = apply_transforms(
            graph, self.model.sources["graph"].sha256 or "", self.model.graph_transforms, cache_dir(),
            f"{self.model.path}: sources.graph")
        options = self._session_options()
        self.session_options = options
        self.providers, self.provider_options = self._providers(ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(str(self.graph_path), options, providers=self.providers,
                                                provider_options=self.provider_options)
        except Exception as exc:  # ORT raises its own types for bad graphs
            raise UserError(f"{self.model.path}: sources.graph: ONNX Runtime cannot load {graph}: {exc}") from None
        self._check_providers_started()
        self._check_io()
        self.output_names = [o.name for o in self.model.outputs]
        self._device_memory = None
        if self.hardware.device != "cpu":
            self._load_device_path()

    @property
    def max_batch_size(self) -> int:
        return int(self.options.get("max_batch_size") or 1)

    def _load_device_path(self, memory: Any = None) -> None:
        """IOBinding per worker over pycuda memory (or the DeviceMemory given: the tests pass
        mlharness.sut.device_memory.HostMemory where no GPU exists); predict becomes the bound one, the CPU path
        stays the plain method, untouched."""
        from mlharness.sut.device_memory import PycudaMemory
        from mlharness.sut.device_timing import DeviceTimings

        self._device_memory = memory or PycudaMemory(int(self.hardware.device.partition(":")[2]))
        self._device_timings = DeviceTimings()
        self._bind_session()
        self.predict = self._predict_bound  # type: ignore[method-assign]

    def _bind_session(self) -> None:
        from mlharness.sut.device_iobinding import BoundSessions, output_layout

        self._bound = BoundSessions(self.session, self._device_memory, output_layout(self.model.outputs),
                                    self.max_batch_size)

    def device_staging(self) -> Any:
        """Device-resident samples (mlharness.sut.device_staging) on a cuda device; None on the CPU."""
        if self._device_memory is None:
            return None
        from mlharness.sut.device_staging import BufferStaging

        return BufferStaging(self._device_memory, self.max_batch_size)

    def _predict_bound(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        memory = self._device_memory

        def record() -> Any:
            event = memory.new_event()
            memory.record(event)
            return event

        rows = next(iter(inputs.values())).shape[0] if inputs else 0
        def elapsed_ms(start: Any, end: Any) -> float:  # only while timing is on, so only with pycuda's events
            return memory.elapsed_ms(start, end)

        return self._device_timings.timed(record, record, elapsed_ms, lambda: self._bound.run(inputs), rows)

    @property
    def device_timing_unavailable(self) -> str | None:
        return None if self._device_memory is not None else "the session runs on the CPU"

    def new_session_options(self) -> Any:
        """Fresh SessionOptions as this backend's session has them (threads, mode, optimization level)."""
        return self._session_options()

    def _session_options(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        # Harness keys graph_optimization and execution_mode (`mlharness tune` searches them).
        options.execution_mode = getattr(ort.ExecutionMode, f"ORT_{self.execution_mode.upper()}")
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                   _ORT_LEVELS[self.graph_optimization])
        options.log_severity_level = 3  # errors only: light_resnet50 has an unused initializer ORT warns about
        return options

    def profiling_unavailable(self) -> str | None:
        return None

    def start_profiling(self, out_dir: Path) -> None:
        """ORT profiles only sessions created with profiling on: build a second session with the
        same options plus profiling and run it until end_profiling; the plain one waits untouched."""
        import onnxruntime as ort

        options = self._session_options()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(out_dir) / "onnxruntime_profile")
        self._plain_session = self.session
        self.session = ort.InferenceSession(str(self.graph_path), options, providers=self.providers,
                                            provider_options=self.provider_options)
        if self._device_memory is not None:
            self._bind_session()  # the bindings belong to a session

    def end_profiling(self) -> FrameworkProfile:
        profiled, self.session = self.session, self._plain_session
        if self._device_memory is not None:
            self._bind_session()
        start_ns = profiled.get_profiling_start_time_ns()
        path = Path(profiled.end_profiling())
        path = path.replace(path.with_name("onnxruntime_profile.json"))  # a fixed name: a re-run replaces it
        return FrameworkProfile("onnxruntime", "realtime", ort_events(path, start_ns), [path])

    def _providers(self, available: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """Execution providers in priority order with their options: TensorRT (when the hardware
        manifest enables it), CUDA on the manifest's device, then the CPU for what they do not run."""
        hardware = self.hardware
        if hardware.device == "cpu":
            return ["CPUExecutionProvider"], [{}]
        import onnxruntime as ort

        problem = provider_problem(hardware, available, ort.__version__)
        if problem:
            raise UserError(f"{hardware.path}: {problem}")
        device_id = int(hardware.device.partition(":")[2])
        chosen: list[tuple[str, dict[str, Any]]] = []
        tensorrt = hardware.tensorrt
        if tensorrt is not None and tensorrt.enabled:
            trt_options: dict[str, Any] = {"device_id": device_id, "trt_fp16_enable": tensorrt.fp16,
                                           "trt_engine_cache_enable": tensorrt.engine_cache is not None}
            if tensorrt.engine_cache is not None:
                try:
                    Path(tensorrt.engine_cache).mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise UserError(f"{hardware.path}: tensorrt.engine_cache: cannot create "
                                    f"{tensorrt.engine_cache}: {exc.strerror or exc}") from None
                trt_options["trt_engine_cache_path"] = tensorrt.engine_cache
            chosen.append(("TensorrtExecutionProvider", trt_options))
        chosen += [("CUDAExecutionProvider", {"device_id": device_id}), ("CPUExecutionProvider", {})]
        return [name for name, _ in chosen], [options for _, options in chosen]

    def _check_providers_started(self) -> None:
        """ONNX Runtime falls back to the CPU, with only a log line, when a GPU provider cannot start
        (a missing CUDA, cuDNN or TensorRT library): that would measure the wrong device."""
        started = self.session.get_providers()
        missing = [p for p in self.providers if p not in started]
        if missing:
            raise UserError(f"{self.hardware.path}: device: onnxruntime could not start {', '.join(missing)} for "
                            f"{self.hardware.device} (the session has {', '.join(started)}); check that the CUDA, "
                            f"cuDNN and TensorRT libraries it needs are installed")

    def _check_io(self) -> None:
        graph_inputs = {i.name: i for i in self.session.get_inputs()}
        graph_outputs = {o.name for o in self.session.get_outputs()}
        for i, spec in enumerate(self.model.inputs):
            found = graph_inputs.get(spec.name)
            if found is None:
                raise UserError(f"{self.model.path}: inputs[{i}].name: expected one of the graph's inputs "
                                f"{sorted(graph_inputs)}, got {spec.name!r}")
            dtype = numpy_name(found.type)
            if dtype and dtype != spec.element_type:
                raise UserError(f"{self.model.path}: inputs[{i}].element_type: the graph expects {dtype}, "
                                f"got {spec.element_type}")
        for i, spec in enumerate(self.model.outputs):
            if spec.name not in graph_outputs:
                raise UserError(f"{self.model.path}: outputs[{i}].name: expected one of the graph's outputs "
                                f"{sorted(graph_outputs)}, got {spec.name!r}")

    @property
    def supports_batching(self) -> bool:
        first_dims = self.session.get_inputs()[0].shape
        return not (first_dims and first_dims[0] == 1)

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.session.run(self.output_names, inputs)
        return dict(zip(self.output_names, results))

    def close(self) -> None:
        self.session = None

    def describe(self) -> dict[str, Any]:
        import onnxruntime as ort

        tensorrt = self.hardware.tensorrt
        return {**super().describe(), "providers": self.providers, "provider_options": self.provider_options,
                "tensorrt": tensorrt.describe() if tensorrt is not None else None, "onnxruntime": ort.__version__,
                "graph_optimization": self.graph_optimization, "execution_mode": self.execution_mode,
                "graph": str(self.graph_path), "graph_sha256": self.graph_sha256,
                "transforms": list(self.model.graph_transforms), "device_path": self.describe_device_path()}

    def describe_device_path(self) -> dict[str, Any] | None:
        """How a cuda run moved tensors (None on the CPU), for run.json's backend entry."""
        memory = self._device_memory
        if memory is None:
            return None
        return {"io_binding": "one binding per worker thread", "staging": f"{memory.kind} device memory",
                "outputs": f"preallocated device buffers per worker, copied once per batch into page-locked "
                           f"host buffers ({memory.kind})", "max_batch_size": self.max_batch_size}


def provider_problem(hardware: HardwareManifest, available: list[str], version: str) -> str | None:
    """Why onnxruntime `version` with these execution providers cannot run the hardware manifest
    ("FIELD: why"), or None."""
    if hardware.device == "cpu":
        return None
    if "CUDAExecutionProvider" not in available:
        return (f"device: {hardware.device} needs onnxruntime with CUDAExecutionProvider, but no CUDA device "
                f"is visible to onnxruntime {version} (providers: {', '.join(available)})")
    if hardware.tensorrt is not None and hardware.tensorrt.enabled and "TensorrtExecutionProvider" not in available:
        return (f"tensorrt: enabled, but onnxruntime {version} has no TensorrtExecutionProvider "
                f"(providers: {', '.join(available)})")
    return None


def ort_events(path: Path, start_ns: int) -> list[OpEvent]:
    """ONNX Runtime's profile: Chrome-trace events in microseconds after the session's profiling
    start (realtime clock). Runs ("model_run") become session spans; node kernels become ops."""
    events = []
    for raw in json.loads(path.read_text()):
        if raw.get("ph") != "X":
            continue
        cat, name = raw.get("cat"), raw.get("name", "")
        args = raw.get("args") or {}
        if cat == "Node" and name.endswith("_kernel_time"):
            category, op_type, name = "op", args.get("op_name", "?"), name[: -len("_kernel_time")]
            args = {k: args[k] for k in ("op_name", "provider", "node_index") if k in args}
        elif cat == "Session" and name in ("model_run", "SequentialExecutor::Execute"):
            category, op_type, args = "session", name, {}
        else:
            continue  # fences, loading and initialisation: not part of a run's work
        events.append(OpEvent(name, category, op_type, start_ns + int(raw["ts"]) * 1000, int(raw["dur"]) * 1000,
                              int(raw.get("tid", 0)), "cpu", args))
    return events
