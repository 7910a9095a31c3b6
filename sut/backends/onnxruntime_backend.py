"""ONNX Runtime: CPU execution provider by default; CUDA / TensorRT providers when the hardware
manifest names a cuda device and this onnxruntime build has them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from harness.artifacts import cache_dir
from harness.errors import UserError
from sut.backends.base import Backend, FrameworkProfile, OpEvent
from sut.graph_transforms import apply_transforms

_NUMPY_OF_ORT = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
                 "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
                 "tensor(uint8)": "uint8", "tensor(bool)": "bool"}


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    devices = ("cpu", "cuda")

    def load(self) -> None:
        import onnxruntime as ort

        graph = self.sources["graph"]
        self.graph_path, self.graph_sha256 = apply_transforms(
            graph, self.model.sources["graph"].sha256 or "", self.model.graph_transforms, cache_dir())
        options = self._session_options()
        self.session_options = options
        self.providers = self._providers(ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(str(self.graph_path), options, providers=self.providers)
        except Exception as exc:  # ORT raises its own types for bad graphs
            raise UserError(f"{self.model.path}: sources.graph: ONNX Runtime cannot load {graph}: {exc}") from None
        self._check_io()
        self.output_names = [o.name for o in self.model.outputs]

    def _session_options(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
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
        self.session = ort.InferenceSession(str(self.graph_path), options, providers=self.providers)

    def end_profiling(self) -> FrameworkProfile:
        profiled, self.session = self.session, self._plain_session
        start_ns = profiled.get_profiling_start_time_ns()
        path = Path(profiled.end_profiling())
        path = path.replace(path.with_name("onnxruntime_profile.json"))  # a fixed name: a re-run replaces it
        return FrameworkProfile("onnxruntime", "realtime", ort_events(path, start_ns), [path])

    def _providers(self, available: list[str]) -> list[str]:
        device = self.hardware.device
        if device == "cpu":
            return ["CPUExecutionProvider"]
        wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if self.hardware.doc.get("tensorrt"):
            wanted.insert(0, "TensorrtExecutionProvider")
        chosen = [p for p in wanted if p in available]
        if "CUDAExecutionProvider" not in chosen:
            raise UserError(f"{self.hardware.path}: device: {device} needs onnxruntime with CUDAExecutionProvider "
                            f"(available: {', '.join(available)})")
        return chosen

    def _check_io(self) -> None:
        graph_inputs = {i.name: i for i in self.session.get_inputs()}
        graph_outputs = {o.name for o in self.session.get_outputs()}
        for i, spec in enumerate(self.model.inputs):
            found = graph_inputs.get(spec.name)
            if found is None:
                raise UserError(f"{self.model.path}: inputs[{i}].name: expected one of the graph's inputs "
                                f"{sorted(graph_inputs)}, got {spec.name!r}")
            dtype = _NUMPY_OF_ORT.get(found.type)
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

        return {**super().describe(), "providers": self.providers, "onnxruntime": ort.__version__,
                "graph": str(self.graph_path), "graph_sha256": self.graph_sha256,
                "transforms": list(self.model.graph_transforms)}


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
