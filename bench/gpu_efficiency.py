"""How much of a GPU's speed mlharness keeps: mlharness against a raw loop of the same framework on the
same model, batch size and device, as ratios; and the harness's own overhead on the null model with
device outputs. Needs a CUDA GPU: without one it says so in one line and exits 1 (no JSON written).

- onnxruntime (resnet50-light by default): mlharness `--hardware cuda0` against an IOBinding loop
  (inputs as CUDA OrtValues, outputs bound to a preallocated CUDA OrtValue and copied to the host
  each run, as the harness must).
- torch (mobilenet-v2 by default): mlharness `--hardware cuda0 --backend torch` against a torch.cuda
  loop (batches on the device, inference_mode, outputs to the host each run).
- offline_ratio: mlharness Offline samples/s over the raw loop's at --batch (target >= 0.98).
- singlestream_p90_ratio: mlharness SingleStream p90 over the raw loop's p90 at batch 1 (target <= 1.02).
- null_device: LoadGen's own Offline limit (every sample completed empty) against mlharness's SUT
  with a null backend whose outputs live on the GPU and are copied to pinned host memory per batch.

Each measurement runs in a fresh subprocess; each figure is the best of --repeats rounds. Printed, and
written to bench/out/gpu_efficiency.json with the GPU's name.

    .venv/bin/python bench/gpu_efficiency.py [--seconds 10] [--repeats 3] [--batch 8] [--frameworks onnxruntime torch]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from child_process import measured, report, without_db  # bench/child_process.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "gpu_efficiency.json"
MODELS = {"onnxruntime": "resnet50-light", "torch": "mobilenet-v2"}
WARMUP_RUNS = 10


# ------------------------------------------------------------------------------ what this machine has

def gpu_problems() -> dict[str, str | None]:
    """Per framework: why its GPU path cannot be measured here, or None."""
    problems: dict[str, str | None] = {}
    try:
        import torch

        problems["torch"] = None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device"
    except ImportError:
        problems["torch"] = "torch is not installed"
    try:
        import onnxruntime as ort

        providers = ort.get_available_providers()
        problems["onnxruntime"] = (None if "CUDAExecutionProvider" in providers else
                                   f"onnxruntime {ort.__version__} has no CUDAExecutionProvider")
    except ImportError:
        problems["onnxruntime"] = "onnxruntime is not installed"
    if problems["onnxruntime"] is None:
        try:
            import pycuda.driver  # noqa: F401
        except ImportError:
            problems["onnxruntime"] = "pycuda is not installed (pip install 'mlharness[gpu]')"
    return problems


def refusal(problems: dict[str, str | None], wanted: list[str]) -> str | None:
    """The one line printed when nothing asked for can run here, else None."""
    if any(problems.get(name) is None for name in wanted):
        return None
    reasons = "; ".join(f"{problems.get(name) or name + ' unknown'}" for name in wanted)
    return f"gpu_efficiency: no CUDA GPU to measure on ({reasons}); run it on a machine with one (docs/gpu.md)"


# ------------------------------------------------------------------------------ children

def _runtime(model_name: str, backend: str, batch: int) -> Any:
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index
    from mlharness.sut.runtime import build_runtime

    index = default_index()
    model = select_model(index, model_name, backend)
    dataset = index.find("dataset", model.default_dataset)
    options = {"max_batch_size": batch, "workers": 1}
    runtime = build_runtime(model, dataset, index.find("hardware", "cuda0"), backend, options)
    count = min(len(runtime.staged), int(model.attributes.get("performance_sample_count", 64)))
    runtime.staged.load_samples(list(range(count)))
    return runtime


def _timed_loop(step: Any, batch: int, seconds: float) -> dict[str, Any]:
    import numpy as np

    for i in range(WARMUP_RUNS):
        step(i)
    times, i = [], 0
    started = now = time.perf_counter_ns()
    deadline = started + int(seconds * 1e9)
    while now < deadline:
        step(i)
        end = time.perf_counter_ns()
        times.append(end - now)
        now, i = end, i + 1
    return {"samples_per_second": len(times) * batch / ((now - started) / 1e9), "runs": len(times),
            "p90_latency_ns": int(np.percentile(times, 90)), "p50_latency_ns": int(np.percentile(times, 50))}


def raw_onnxruntime(model_name: str, batch: int, seconds: float) -> dict[str, Any]:
    """An IOBinding loop on the harness's graph and samples, with onnxruntime's own CUDA OrtValues."""
    import numpy as np
    import onnxruntime as ort

    runtime = _runtime(model_name, "onnxruntime", batch)
    backend = runtime.backend
    session = ort.InferenceSession(str(backend.graph_path), backend.new_session_options(), providers=backend.providers,
                                   provider_options=backend.provider_options)
    arrays = runtime.staged.arrays
    count = len(next(iter(arrays.values())))
    batches = [{name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a[s:s + batch]), "cuda", 0)
                for name, a in arrays.items()} for s in range(0, count - batch + 1, batch)]
    binding = session.io_binding()
    outputs = []
    for spec in runtime.model.outputs:
        shape = [batch, *spec.sample_shape()]
        value = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(spec.element_type).type, "cuda", 0)
        binding.bind_ortvalue_output(spec.name, value)
        outputs.append(value)

    def step(i: int) -> None:
        for name, value in batches[i % len(batches)].items():
            binding.bind_ortvalue_input(name, value)
        session.run_with_iobinding(binding)
        for value in outputs:
            value.numpy()  # to the host, as the harness must

    return _timed_loop(step, batch, seconds)


def raw_torch(model_name: str, batch: int, seconds: float) -> dict[str, Any]:
    """A torch.cuda loop: the harness's module and samples, batches on the device, outputs to the host."""
    import torch

    runtime = _runtime(model_name, "torch", batch)
    module = runtime.backend.module
    arrays = runtime.staged.arrays
    count = len(next(iter(arrays.values())))
    names = [spec.name for spec in runtime.model.inputs]
    batches = [[torch.from_numpy(arrays[n][s:s + batch]).to("cuda:0") for n in names]
               for s in range(0, count - batch + 1, batch)]

    def step(i: int) -> None:
        with torch.inference_mode():
            out = module(*batches[i % len(batches)])
        (out if isinstance(out, torch.Tensor) else out[0]).cpu()

    return _timed_loop(step, batch, seconds)


def harness_run(model_name: str, backend: str, scenario: str, overrides: list[str]) -> dict[str, Any]:
    from mlharness import RunRequest, run

    with tempfile.TemporaryDirectory(prefix="mlharness-bench-") as scratch:
        record = run(RunRequest(model=model_name, scenario=scenario, backend=backend, hardware="cuda0",
                                overrides=overrides, results_dir=Path(scratch), use_tuned=False, quiet=True,
                                command="bench/gpu_efficiency.py"))
    summary = record.performance
    return {"valid": summary.get("valid"), "samples_per_second": summary.get("samples_per_second"),
            "p90_latency_ns": summary.get("p90_latency_ns"), "backend": record.backend_info}


def null_device(variant: str, seconds: float, batch: int) -> dict[str, Any]:
    """LoadGen Offline on 1000 float32 outputs per sample: `limit` completes every sample empty;
    `harness` is mlharness's SUT with outputs on the GPU copied once per batch to pinned memory."""
    import mlperf_loadgen as lg
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from overhead import _limit_sut, _loadgen_settings

    from mlharness.records.loadgen_logs import parse_summary
    from mlharness.sut.device_torch import TorchDevice
    from mlharness.sut.handoff import load_handoff
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.system_under_test import SystemUnderTest

    class DeviceNull:
        """The null backend's contract with device outputs: zeros on cuda:0, copied to the host per batch."""
        supports_batching = True

        def __init__(self) -> None:
            self.on = TorchDevice(torch, torch.device("cuda:0"))
            self.zeros = torch.zeros((batch, 1000), dtype=torch.float32, device="cuda:0")

        def predict(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
            rows = len(next(iter(inputs.values())))
            return {"out": self.on.to_host([self.zeros[:rows]], batch)[0]}

    class Staged:
        arrays = {"x": np.zeros((1024, 1), np.float32)}

        def feed_of(self, index: int) -> dict[str, np.ndarray]:
            return {"x": self.arrays["x"][index:index + 1]}

        def rows(self, indices: list[int]) -> np.ndarray:
            return np.asarray(indices, dtype=np.int64)

    overrides = [f"min_duration={int(seconds * 1000)}", f"max_batch_size={batch}"]
    with tempfile.TemporaryDirectory(prefix="mlharness-bench-") as workdir:
        settings = _loadgen_settings("Offline", overrides, Path(workdir))
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = workdir
        log_settings.log_output.copy_summary_to_stdout = False
        if variant == "limit":
            sut, destroy = _limit_sut(lg, batch)
        else:
            harness_sut = SystemUnderTest(backend=DeviceNull(), staged=Staged(), handoff=load_handoff(),  # type: ignore[arg-type]
                                          scenario="Offline", postprocess=None, ctx=ProcessingContext(),
                                          max_batch_size=batch, workers=1)
            harness_sut.start()
            sut = lg.ConstructFastSUT(harness_sut.issue_query, harness_sut.flush_queries)
            destroy = lg.DestroyFastSUT
        qsl = lg.ConstructQSL(1024, 1024, lambda indices: None, lambda indices: None)
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings, str(Path(workdir) / "no-audit.config"))
        finally:
            lg.DestroyQSL(qsl)
            destroy(sut)
            if variant != "limit":
                harness_sut.stop()
        return {"samples_per_second": parse_summary(Path(workdir) / "mlperf_log_summary.txt").get("samples_per_second")}


def child(spec: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT))
    kind = spec["kind"]
    if kind == "raw":
        raw = raw_onnxruntime if spec["framework"] == "onnxruntime" else raw_torch
        result = raw(spec["model"], spec["batch"], spec["seconds"])
    elif kind == "harness":
        result = harness_run(spec["model"], spec["framework"], spec["scenario"], spec["overrides"])
    else:
        result = null_device(spec["variant"], spec["seconds"], spec["batch"])
    report(result)


# ------------------------------------------------------------------------------ parent

def measure(spec: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    run = {**spec, **measured(__file__, spec, without_db())}
    runs.append(run)
    print(f"  {json.dumps({k: v for k, v in spec.items() if k != 'overrides'})}: "
          f"{run.get('samples_per_second') or 0:.1f} samples/s, p90 {(run.get('p90_latency_ns') or 0) / 1e6:.3f} ms",
          flush=True)
    return run


def best(spec: dict[str, Any], repeats: int, runs: list[dict[str, Any]], key: str, lowest: bool = False) -> float:
    values = [measure(spec, runs)[key] for _ in range(repeats)]
    return min(values) if lowest else max(values)


def framework_figures(framework: str, model: str, batch: int, seconds: float, repeats: int,
                      runs: list[dict[str, Any]]) -> dict[str, Any]:
    duration = [f"min_duration={int(seconds * 1000)}"]
    raw = {"kind": "raw", "framework": framework, "model": model, "seconds": seconds}
    harness = {"kind": "harness", "framework": framework, "model": model}
    raw_offline = best({**raw, "batch": batch}, repeats, runs, "samples_per_second")
    raw_p90 = best({**raw, "batch": 1}, repeats, runs, "p90_latency_ns", lowest=True)
    offline = best({**harness, "scenario": "Offline", "overrides": duration + [f"max_batch_size={batch}"]}, repeats,
                   runs, "samples_per_second")
    p90 = best({**harness, "scenario": "SingleStream", "overrides": duration}, repeats, runs, "p90_latency_ns",
               lowest=True)
    return {"model": model, "batch": batch, "raw_offline_samples_per_second": raw_offline,
            "mlharness_offline_samples_per_second": offline, "offline_ratio": offline / raw_offline,
            "raw_p90_latency_ns": raw_p90, "mlharness_singlestream_p90_latency_ns": p90,
            "singlestream_p90_ratio": p90 / raw_p90}


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frameworks", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    problems = gpu_problems()
    line = refusal(problems, args.frameworks)
    if line:
        print(line, file=sys.stderr)
        return 1
    runs: list[dict[str, Any]] = []
    figures: dict[str, Any] = {"gpu": gpu_name(), "python": platform.python_version(), "unavailable": {}}
    for framework in args.frameworks:
        if problems[framework]:
            figures["unavailable"][framework] = problems[framework]
            print(f"  {framework}: skipped ({problems[framework]})", flush=True)
            continue
        figures[framework] = framework_figures(framework, MODELS[framework], args.batch, args.seconds, args.repeats,
                                               runs)
    if problems["torch"] is None:  # the device null backend's outputs are torch tensors
        null_spec = {"kind": "null", "seconds": args.seconds, "batch": args.batch}
        limit = best({**null_spec, "variant": "limit"}, args.repeats, runs, "samples_per_second")
        harness = best({**null_spec, "variant": "harness"}, args.repeats, runs, "samples_per_second")
        figures["null_device"] = {"limit_samples_per_second": limit, "harness_samples_per_second": harness,
                                  "ratio": harness / limit, "batch": args.batch}
    figures["runs"] = runs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2, default=str))
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
