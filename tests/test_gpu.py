"""The GPU path on a real GPU (issue 15), marked `gpu`: skipped, with the reason, where no CUDA device
is visible. Nothing is replaced here: pycuda memory and streams, IOBinding on "cuda", torch tensors
on the device, CUDA graphs, CUDA events, NVML and the benchmark all run for real.

    .venv/bin/python -m pytest -m gpu tests/test_gpu.py

The onnxruntime tests need onnxruntime-gpu (CUDAExecutionProvider) and pycuda; the torch tests need a
CUDA build of torch; each is skipped on its own when its part is missing (docs/gpu.md)."""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import REPO, read_run, run_cli


def _torch_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else f"no CUDA device is visible to torch {torch.__version__}"


def _ort_problem() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)"
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        return "pycuda is not installed (pip install 'mlharness[gpu]')"
    return None


TORCH_PROBLEM = _torch_problem()
ORT_PROBLEM = _ort_problem()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(TORCH_PROBLEM is not None and ORT_PROBLEM is not None,
                                 reason=f"no CUDA GPU here: {TORCH_PROBLEM}; {ORT_PROBLEM}")]
needs_ort = pytest.mark.skipif(ORT_PROBLEM is not None, reason=f"onnxruntime GPU path: {ORT_PROBLEM}")
needs_torch = pytest.mark.skipif(TORCH_PROBLEM is not None, reason=f"torch GPU path: {TORCH_PROBLEM}")


def _runtime(model: str, backend: str, hardware: str, options: dict[str, Any]) -> Any:
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index
    from mlharness.sut.runtime import build_runtime

    index = default_index()
    manifest = select_model(index, model, backend)
    dataset = index.find("dataset", manifest.default_dataset)
    return build_runtime(manifest, dataset, index.find("hardware", hardware), backend,
                         {"max_batch_size": 4, "dataset_limit": 8, **options})


@needs_ort
def test_pycuda_gather_and_iobinding_equal_the_cpu_session() -> None:
    from mlharness.sut.device_memory import PycudaMemory
    from mlharness.sut.device_staging import DeviceStagedSamples

    cpu = _runtime("resnet50-light", "onnxruntime", "cpu", {})
    gpu = _runtime("resnet50-light", "onnxruntime", "cuda0", {})
    assert isinstance(gpu.staged, DeviceStagedSamples) and isinstance(gpu.backend._device_memory, PycudaMemory)
    cpu.staged.load_samples(list(range(8)))
    gpu.staged.load_samples(list(range(8)))
    for rows in ([6, 1, 2, 3], [0, 7], [5]):
        feed = gpu.staged.device_gather(0, np.array(rows)) if len(rows) > 1 else gpu.staged.feed_of(rows[0])
        got = gpu.backend.predict(feed)
        want = cpu.backend.predict({n: a[rows] for n, a in cpu.staged.arrays.items()})
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-4)
    assert gpu.backend.describe()["providers"][0] == "CUDAExecutionProvider"


@needs_ort
@pytest.mark.parametrize("scenario", ["Offline", "SingleStream"])
def test_onnxruntime_on_cuda0_runs_and_records_its_device_path(tmp_path: Path, scenario: str) -> None:
    assert run_cli("run", "resnet50-light", "--scenario", scenario, "--hardware", "cuda0", "--quick",
                   "--mode", "submission", "--results-dir", str(tmp_path)) == 0
    record = read_run(tmp_path, "resnet50-light", scenario)
    assert record["status"] == "ok" and record["backend_info"]["device"] == "cuda:0"
    assert record["backend_info"]["device_path"]["io_binding"] == "one binding per worker thread"
    assert "cuda0" in str(record["results_path"])


@needs_ort
def test_tensorrt_reaches_the_provider_and_the_record(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no TensorrtExecutionProvider")
    try:  # the wheel lists the provider whether or not TensorRT's own libraries (libnvinfer) are installed
        ctypes.CDLL(str(Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_tensorrt.so"))
    except OSError as exc:
        pytest.skip(f"TensorRT's libraries are not installed: {exc}")
    hardware = tmp_path / "trt.yaml"
    hardware.write_text("kind: hardware\nname: trt\nversion: 1.0.0\ndevice: cuda:0\n"
                        "tensorrt: {enabled: true, fp16: true, engine_cache: engines}\n")
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--hardware", str(hardware), "--quick",
                   "--results-dir", str(tmp_path / "r")) == 0
    info = read_run(tmp_path / "r", "resnet50-light", "Offline")["backend_info"]
    assert info["providers"][0] == "TensorrtExecutionProvider"
    assert info["provider_options"][0]["trt_fp16_enable"] in (True, "1", "True")
    assert info["tensorrt"] == {"enabled": True, "fp16": True, "engine_cache": str(tmp_path / "engines")}
    assert any((tmp_path / "engines").iterdir())  # the engine was cached


@needs_torch
def test_torch_staging_on_the_device_gathers_with_index_select() -> None:
    import torch

    from mlharness.sut.device_torch import TorchDevice, TorchStaging

    on = TorchDevice(torch, torch.device("cuda:0"))
    staging = TorchStaging(on, 4)
    arrays = {"x": np.arange(60, dtype=np.float32).reshape(10, 6)}
    staged = staging.put(arrays)
    assert staged["x"].device.type == "cuda"
    feed = staging.batch_feed(staged, 0, np.array([9, 0, 4]))
    assert feed["x"].device.type == "cuda"
    host = on.to_host([feed["x"]], 4)[0]
    np.testing.assert_array_equal(host, arrays["x"][[9, 0, 4]])
    assert torch.from_numpy(host).is_pinned()  # page-locked: the device-to-host copy was asynchronous


@needs_torch
@pytest.mark.parametrize("graphs", ["0", "1"])
def test_torch_on_cuda0_with_and_without_cuda_graphs(tmp_path: Path, graphs: str) -> None:
    assert run_cli("run", "mobilenet-v2", "--backend", "torch", "--scenario", "Offline", "--hardware", "cuda0",
                   "--quick", "--mode", "submission", "--set", "max_batch_size=8", "--set", f"cuda_graphs={graphs}",
                   "--results-dir", str(tmp_path)) == 0
    record = read_run(tmp_path, "mobilenet-v2", "Offline")
    path = record["backend_info"]["device_path"]
    assert path["inference_mode"] is True
    if graphs == "1":
        assert path["cuda_graphs"]["batch_sizes"] == [1, 8]
        assert record["settings"]["harness"]["cuda_graphs"] is True
    else:
        assert path["cuda_graphs"] is None
    assert record["cold_start"]["device_memory"]["peak_allocated_bytes"] > 0


@needs_torch
def test_profile_draws_cuda_events_nvml_and_kernels_on_one_timeline(tmp_path: Path) -> None:
    assert run_cli("run", "mobilenet-v2", "--backend", "torch", "--scenario", "Offline", "--hardware", "cuda0",
                   "--quick", "--profile", "harness,system,framework", "--results-dir", str(tmp_path)) == 0
    root = tmp_path.glob("*/mobilenet-v2/Offline/profile")
    profile = next(root)
    timeline = json.loads((profile / "timeline.json").read_text())
    events = timeline["traceEvents"] if isinstance(timeline, dict) else timeline
    names = {event.get("name") for event in events}
    assert "device_predict" in names
    summary = json.loads((profile / "summary.json").read_text())
    text = json.dumps(summary)
    assert "device_predict" in text and "gpu0_util_pct" in text
    assert summary["framework"]["device_kernels"]["count"] > 0  # CUPTI's kernels reached the summary
    assert summary["operators"]["predict_basis"] == "device_predict spans"
    assert summary["operators"]["predict_total_ms"] > 0


def test_gpu_efficiency_bench_runs_briefly_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "gpu_efficiency.json"
    done = subprocess.run([sys.executable, "bench/gpu_efficiency.py", "--seconds", "1", "--repeats", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["gpu"]
    for framework in ("onnxruntime", "torch"):
        if framework in figures:
            assert figures[framework]["offline_ratio"] > 0 and figures[framework]["singlestream_p90_ratio"] > 0
