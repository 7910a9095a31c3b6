"""The GPU path's pieces that need no GPU, run for real here (issue 15): device staging and gathering,
IOBinding with bound inputs and preallocated outputs, the torch device path, the cuda_graphs key and its
refusals, the refusals of a cuda device on a machine without one, CUDA-event spans in the harness
level, NVML readings, the record, and the benchmark's refusal.

Where a GPU would hold memory, mlharness.sut.device_memory.HostMemory holds it on the host: ONNX Runtime binds
"cpu" addresses through IOBinding exactly as it binds "cuda" ones, and the torch pieces take their
device as an argument, so the code that gathers, binds, runs and copies out is the code that runs on a
GPU. What only a GPU has (pycuda allocations and streams, CUDA events, NVML readings, CUDA graphs) is
in tests/test_gpu.py, or replaced by a stand-in where a test says so in its docstring."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.sut.device_memory import DeviceArray, HostMemory, check_rows, pycuda_problem, row_runs
from mlharness.sut.device_staging import BufferStaging, DeviceStagedSamples
from tests.support import REPO

ORT_MODEL = "mobilenet-v2"  # its outputs differ from sample to sample (resnet50-light's are all 0.001)
TORCH_MODEL = "mobilenet-v2"


# ---------------------------------------------------------------- gathering rows on the device

def test_row_runs_copy_each_run_of_consecutive_rows_once() -> None:
    assert row_runs(np.array([4, 5, 6, 9, 1, 2])) == [(0, 4, 3), (3, 9, 1), (4, 1, 2)]
    assert row_runs(np.array([3])) == [(0, 3, 1)]
    assert row_runs(np.array([2, 2, 3])) == [(0, 2, 1), (1, 2, 2)]  # a repeated row is two copies
    assert row_runs(np.array([], dtype=np.int64)) == []


def test_a_row_outside_the_staged_samples_is_named() -> None:
    check_rows(np.array([0, 4]), 5)
    with pytest.raises(IndexError, match=r"row 5 \(position 1\) is out of bounds for 5 staged samples"):
        check_rows(np.array([0, 5]), 5)
    with pytest.raises(IndexError, match=r"row -1 \(position 0\)"):
        check_rows(np.array([-1]), 5)


def test_buffer_staging_gathers_what_numpy_take_gives_into_one_buffer_per_worker() -> None:
    staged = {"x": np.arange(60, dtype=np.float32).reshape(10, 2, 3), "ids": np.arange(10, dtype=np.int64)}
    staging = BufferStaging(HostMemory(), max_batch_size=4)
    device = staging.put(staged)
    for rows in ([7, 2, 3, 4], [0, 9], [5]):
        feed = staging.batch_feed(device, 0, np.array(rows))
        for name, array in staged.items():
            got = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_char * feed[name].nbytes).from_address(feed[name].ptr))
            np.testing.assert_array_equal(np.frombuffer(got, array.dtype).reshape(feed[name].shape), array[rows])
    first = staging.batch_feed(device, 0, np.array([1, 2]))["x"].ptr
    assert staging.batch_feed(device, 0, np.array([3, 4, 5]))["x"].ptr == first  # reused, not reallocated
    assert staging.batch_feed(device, 1, np.array([3]))["x"].ptr != first  # another worker, another buffer
    row = staging.row_feed(device, 6)["x"]
    assert row.shape == (1, 2, 3) and row.ptr == device["x"].ptr + 6 * device["x"].row_bytes  # a view, no copy


def _ort_runtime(limit: int = 16, max_batch_size: int = 4) -> Any:
    pytest.importorskip("onnxruntime")
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index
    from mlharness.sut.runtime import build_runtime

    index = default_index()
    model = select_model(index, ORT_MODEL, "onnxruntime")
    dataset = index.find("dataset", model.default_dataset)
    return build_runtime(model, dataset, index.find("hardware", "cpu"), "onnxruntime",
                         {"max_batch_size": max_batch_size, "dataset_limit": limit})


def _on_host_memory(runtime: Any) -> DeviceStagedSamples:
    """The onnxruntime GPU path with HostMemory for device memory: bound predict, device staging."""
    from mlharness.sut.device_staging import staged_samples

    backend = runtime.backend
    backend._load_device_path(HostMemory())
    old = runtime.staged
    runtime.staged = staged_samples(backend, old.items, old.inputs, old.preprocess, old.load_raw, old.ctx)
    assert isinstance(runtime.staged, DeviceStagedSamples)  # the backend offers device staging now
    return runtime.staged


def test_iobinding_outputs_equal_session_run_and_land_in_reused_host_buffers() -> None:
    runtime = _ort_runtime()
    runtime.staged.load_samples(list(range(8)))
    arrays = {name: array.copy() for name, array in runtime.staged.arrays.items()}
    plain = runtime.backend.predict
    expected = {rows: plain({n: a[list(rows)] for n, a in arrays.items()}) for rows in ((3, 1, 2), (0, 1), (5,))}
    staged = _on_host_memory(runtime)
    staged.load_samples(list(range(8)))
    assert runtime.backend.predict.__name__ == "_predict_bound"
    seen = []
    for rows, want in expected.items():
        feed = staged.device_gather(0, np.array(rows)) if len(rows) > 1 else staged.feed_of(rows[0])
        assert all(isinstance(value, DeviceArray) for value in feed.values())
        got = runtime.backend.predict(feed)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
            seen.append(got[name].__array_interface__["data"][0])
    assert len(set(seen)) == 1  # one host buffer per output per worker, reused for every batch
    # A host array (the warm-up's) goes through the worker's device input buffer.
    warm = runtime.backend.predict({n: a[[3, 1, 2]] for n, a in arrays.items()})
    for name, want in expected[(3, 1, 2)].items():
        np.testing.assert_allclose(warm[name], want, rtol=1e-6, atol=1e-6)
    described = runtime.backend.describe()["device_path"]
    assert described["io_binding"] == "one binding per worker thread" and described["max_batch_size"] == 4


def test_the_cpu_path_is_untouched_when_no_device_is_used() -> None:
    from mlharness.sut.staging import StagedSamples
    from mlharness.sut.system_under_test import SystemUnderTest

    runtime = _ort_runtime()
    assert type(runtime.staged) is StagedSamples
    assert runtime.backend.device_staging() is None and runtime.backend.describe()["device_path"] is None
    assert "predict" not in vars(runtime.backend)  # the class's plain session.run predict
    sut = SystemUnderTest(backend=runtime.backend, staged=runtime.staged, handoff=None, scenario="Offline",
                          postprocess=None, ctx=runtime.ctx, max_batch_size=4)
    assert "_inputs_for" not in vars(sut)  # the host gather, as before


def _loadgen_accuracy(runtime: Any, scenario: str, out: Path) -> dict[int, bytes]:
    """A real LoadGen accuracy test over the SUT; each sample's response bytes by sample index."""
    import mlperf_loadgen as lg

    from mlharness.sut.handoff import load_handoff
    from mlharness.sut.loadgen_handles import loadgen_handles
    from mlharness.sut.system_under_test import SystemUnderTest

    count = len(runtime.staged)
    sut = SystemUnderTest(backend=runtime.backend, staged=runtime.staged, handoff=load_handoff(), scenario=scenario,
                          postprocess=runtime.postprocess, ctx=runtime.ctx, max_batch_size=4, workers=2)
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.AccuracyOnly
    settings.offline_expected_qps = 100
    settings.single_stream_expected_latency_ns = 1_000_000
    log = lg.LogSettings()
    log.log_output.outdir = str(out)
    log.log_output.copy_summary_to_stdout = False
    out.mkdir(parents=True, exist_ok=True)
    with loadgen_handles(sut, count, count, runtime.staged.load_samples, runtime.staged.unload_samples) as (lg_sut, qsl):
        lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, str(out / "no-audit.config"))
    assert sut.failure is None, sut.failure
    # Batches are gathered by the device staging exactly when the samples are staged on the device.
    assert ("_inputs_for" in vars(sut)) == isinstance(runtime.staged, DeviceStagedSamples)
    entries = json.loads((out / "mlperf_log_accuracy.json").read_text())
    return {entry["qsl_idx"]: bytes.fromhex(entry["data"]) for entry in entries}


@pytest.mark.parametrize("scenario", ["Offline", "SingleStream"])
def test_loadgen_reads_each_samples_own_output_through_the_device_path(tmp_path: Path, scenario: str) -> None:
    """LoadGen, the SUT, the handoff and IOBinding for real; HostMemory stands in for the GPU's memory.
    Every response (mobilenet-v2's top-5 classes) must be byte for byte the plain CPU path's response
    for the same sample."""
    plain = _ort_runtime()
    expected = _loadgen_accuracy(plain, scenario, tmp_path / "plain")
    device = _ort_runtime()
    _on_host_memory(device)
    got = _loadgen_accuracy(device, scenario, tmp_path / "device")
    assert sorted(got) == sorted(expected) == list(range(16))
    assert len(set(expected.values())) > 1  # the samples' responses differ, so a mix-up would show
    for index, data in expected.items():
        assert got[index] == data, f"sample {index}"  # the same kernels on the same host: the same bytes


# ---------------------------------------------------------------- torch

def _torch_runtime(options: dict[str, Any] | None = None) -> Any:
    pytest.importorskip("torch")
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index
    from mlharness.sut.runtime import build_runtime

    index = default_index()
    model = select_model(index, TORCH_MODEL, "torch")
    dataset = index.find("dataset", model.default_dataset)
    return build_runtime(model, dataset, index.find("hardware", "cpu"), "torch",
                         {"max_batch_size": 4, "dataset_limit": 8, **(options or {})})


def test_torch_device_path_gathers_with_index_select_and_returns_each_samples_outputs() -> None:
    """The torch GPU path's code on the device `cpu` (no pinning, no streams there): staging as device
    tensors, index_select into a per-worker buffer, outputs through the per-thread host buffers."""
    runtime = _torch_runtime()
    runtime.staged.load_samples(list(range(8)))
    arrays = {name: array.copy() for name, array in runtime.staged.arrays.items()}
    want = runtime.backend.predict({n: a[[6, 0, 3]] for n, a in arrays.items()})
    backend = runtime.backend
    backend._load_device_path()
    assert backend.predict.__name__ == "_predict_device"
    old = runtime.staged
    staged = DeviceStagedSamples(old.items, old.inputs, old.preprocess, old.load_raw, old.ctx, backend.device_staging())
    staged.load_samples(list(range(8)))
    got = backend.predict(staged.device_gather(0, np.array([6, 0, 3])))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    single = backend.predict(staged.feed_of(3))
    for name in want:
        np.testing.assert_allclose(single[name][0], want[name][2], rtol=1e-5, atol=1e-5)
    assert backend.describe()["device_path"]["cuda_graphs"] is None


def test_cuda_graphs_is_a_boolean_harness_key_recorded_with_the_settings() -> None:
    from mlharness.running.settings import HARNESS_KEYS, Settings

    assert "cuda_graphs" in HARNESS_KEYS
    settings = Settings(scenario="Offline", mode="performance", conf_model="resnet50")
    settings.set("cuda_graphs", "1", "cli", "--set")
    assert settings.harness["cuda_graphs"] is True
    settings.set("cuda_graphs", "off", "cli", "--set")
    assert settings.harness["cuda_graphs"] is False
    assert settings.as_record()["harness"]["cuda_graphs"] is False


def test_cuda_graphs_on_the_cpu_or_with_symbolic_dims_is_refused_in_one_line() -> None:
    from mlharness.sut.device_torch import cuda_graph_problem, graph_batch_sizes

    fixed = SimpleNamespace(name="x", sample_shape=lambda: (3, 224, 224))
    tokens = SimpleNamespace(name="ids", sample_shape=lambda: ("seq",))
    assert cuda_graph_problem("cuda:0", [fixed]) is None
    assert cuda_graph_problem("cpu", [fixed]) == ("cuda_graphs: CUDA graphs need a cuda:N device, the hardware "
                                                  "manifest has cpu")
    assert cuda_graph_problem("cuda:0", [tokens]) == ("cuda_graphs: input 'ids' has symbolic dims ['seq']; CUDA "
                                                      "graphs replay fixed shapes only")
    assert graph_batch_sizes(8) == [1, 8] and graph_batch_sizes(1) == [1]
    with pytest.raises(UserError) as caught:
        _torch_runtime({"cuda_graphs": True})
    message = str(caught.value)
    assert message.endswith("cpu.yaml: cuda_graphs: CUDA graphs need a cuda:N device, the hardware manifest has cpu")
    assert "\n" not in message


# ---------------------------------------------------------------- refusals on a machine without a GPU

def _no_gpu() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is visible: the refusals cannot happen here (tests/test_gpu.py runs instead)")
    except ImportError:
        pass


@pytest.mark.parametrize("model, backend, expected", [
    ("null", "null", "cuda0.yaml: device: the null backend runs on cpu only, got cuda:0"),
    ("resnet50-light", "onnxruntime", "cuda0.yaml: device: cuda:0 needs onnxruntime with CUDAExecutionProvider"),
])
def test_cuda0_without_a_gpu_is_one_line_and_a_non_zero_exit(tmp_path: Path, model: str, backend: str,
                                                             expected: str) -> None:
    _no_gpu()
    done = subprocess.run([sys.executable, "-m", "mlharness.cli", "run", model, "--backend", backend, "--scenario",
                           "Offline", "--hardware", "cuda0", "--quick", "--quiet", "--results-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlharness: error: ") and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("model, backend, expected", [
    ("null", "null", "mlharness: error: cuda_graphs: only the torch backend captures CUDA graphs, this run's "
                     "backend is null (set by cli)"),
    ("mobilenet-v2", "torch", "cpu.yaml: cuda_graphs: CUDA graphs need a cuda:N device, the hardware manifest has cpu"),
])
def test_cuda_graphs_where_it_cannot_apply_is_refused_before_anything_is_written(
        tmp_path: Path, model: str, backend: str, expected: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mlharness.cli", "run", model, "--backend", backend, "--scenario",
                           "Offline", "--quick", "--quiet", "--set", "cuda_graphs=1", "--results-dir",
                           str(tmp_path / "results")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("mlharness: error: ") and line.endswith(expected), done.stderr
    assert not (tmp_path / "results").exists()  # no failed-<run id>/ folder: refused before the run began


def test_pycuda_missing_is_named_with_the_gpu_extra() -> None:
    try:
        import pycuda.driver  # noqa: F401
        pytest.skip("pycuda is installed here")
    except ImportError:
        pass
    problem = pycuda_problem()
    assert problem is not None and problem.endswith("pip install 'mlharness[gpu]'")
    from mlharness.sut.device_memory import PycudaMemory

    with pytest.raises(UserError, match=r"needs pycuda .*mlharness\[gpu\]"):
        PycudaMemory(0)


def test_tensorrt_settings_reach_the_provider_options(tmp_path: Path) -> None:
    """The providers onnxruntime would get on a GPU machine; only the provider list (what a GPU build of
    onnxruntime reports) is supplied, since this build has no GPU providers."""
    pytest.importorskip("onnxruntime")
    from mlharness.specs.manifests import load_manifest
    from mlharness.sut.backends.onnxruntime_backend import OnnxRuntimeBackend, provider_problem

    path = tmp_path / "trt.yaml"
    path.write_text("kind: hardware\nname: trt\nversion: 1.0.0\ndevice: cuda:1\n"
                    "tensorrt: {enabled: true, fp16: true, engine_cache: engines}\n")
    hardware = load_manifest(path)
    model = load_manifest(REPO / "specs" / "models" / "resnet50-light.yaml")
    backend = OnnxRuntimeBackend(model=model, sources={}, hardware=hardware, options={})
    gpu_build = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    providers, options = backend._providers(gpu_build)
    assert providers == gpu_build
    assert options[0] == {"device_id": 1, "trt_fp16_enable": True, "trt_engine_cache_enable": True,
                          "trt_engine_cache_path": str(tmp_path / "engines")}
    assert options[1] == {"device_id": 1} and (tmp_path / "engines").is_dir()
    assert "no TensorrtExecutionProvider" in provider_problem(hardware, gpu_build[1:], "1.31.1")


# ---------------------------------------------------------------- profiling

def test_device_timings_are_kept_only_while_timing_is_on() -> None:
    """Stand-in events (a CUDA event cannot exist here): each carries the elapsed time it reports."""
    from mlharness.sut.device_timing import DeviceTimings

    timings = DeviceTimings()
    calls = []

    def work() -> str:
        calls.append(1)
        return "out"

    events = iter([0.0, 2.5])
    assert timings.timed(lambda: next(events), lambda: next(events), lambda a, b: b - a, work, 4) == "out"
    assert timings.stop() == []  # off: nothing recorded, no event made
    timings.start()
    assert timings.timed(lambda: next(events), lambda: next(events), lambda a, b: b - a, work, 4) == "out"
    (record,) = timings.stop()
    assert record.device_ns == 2_500_000 and record.rows == 4 and len(calls) == 2


def test_harness_level_draws_cuda_event_spans_on_the_device_track(tmp_path: Path) -> None:
    """The backend's device timings stand in for CUDA events (no GPU here); the harness level must turn
    timing on and off around the test and draw each as a device span with its own stage figures."""
    from mlharness.profiling.clock import ClockAnchor
    from mlharness.profiling.harness_tracer import HarnessTracer
    from mlharness.profiling.tracer import TraceContext
    from mlharness.sut.device_timing import DeviceTiming

    class GpuBackend:
        device_timing_unavailable = None
        on = False

        def start_device_timing(self) -> None:
            self.on = True

        def end_device_timing(self) -> list[DeviceTiming]:
            self.on = False
            return [DeviceTiming(7, 1_000, 400, 4), DeviceTiming(7, 2_000, 600, 4)]

    backend = GpuBackend()
    ctx = TraceContext(SimpleNamespace(backend=backend), tmp_path, ClockAnchor.measure())
    with HarnessTracer(ctx) as tracer:
        assert backend.on
    assert not backend.on
    result = tracer.collect((0, 10_000))
    device = [span for span in result.spans if span.track == "device"]
    assert [(s.name, s.start_ns, s.end_ns, s.tid) for s in device] == [("device_predict", 1_000, 1_400, 7),
                                                                      ("device_predict", 2_000, 2_600, 7)]
    assert result.summary["stages"]["device_predict"]["count"] == 2
    cpu_ctx = TraceContext(SimpleNamespace(backend=SimpleNamespace()), tmp_path, ClockAnchor.measure())
    with HarnessTracer(cpu_ctx) as cpu_tracer:
        pass
    assert cpu_tracer.collect((0, 1)).summary["device_timing"].startswith("off")


def test_framework_level_counts_the_device_kernels_its_profiler_saw(tmp_path: Path) -> None:
    """A framework profile with CUDA kernels in it (torch.profiler's CUPTI events; written here, no GPU):
    the kernels go on the device track and the level's summary counts them, in the window only."""
    from mlharness.profiling.clock import ClockAnchor
    from mlharness.profiling.framework_tracer import FrameworkTracer
    from mlharness.profiling.tracer import TraceContext
    from mlharness.sut.backends.base import FrameworkProfile, OpEvent

    events = [OpEvent("aten::conv2d", "op", "aten::conv2d", 1_000, 500, 7),
              OpEvent("sm90_gemm", "kernel", "sm90_gemm", 1_100, 300_000, 7, "cuda"),
              OpEvent("Memcpy DtoH", "kernel", "Memcpy DtoH", 1_500, 100_000, 7, "cuda"),
              OpEvent("late_kernel", "kernel", "late_kernel", 50_000, 100, 7, "cuda")]

    class Backend:
        def start_profiling(self, out_dir: Path) -> None:
            pass

        def end_profiling(self) -> FrameworkProfile:
            return FrameworkProfile("torch", "monotonic", events)

    ctx = TraceContext(SimpleNamespace(backend=Backend()), tmp_path, ClockAnchor.measure())
    with FrameworkTracer(ctx) as tracer:
        pass
    result = tracer.collect((0, 10_000))
    assert result.summary["device_kernels"] == {"count": 2, "total_ms": 0.4}
    assert [s.name for s in result.spans if s.track == "device"] == ["sm90_gemm", "Memcpy DtoH"]
    cpu_only = FrameworkTracer(ctx)
    cpu_only.profile = FrameworkProfile("torch", "monotonic", events[:1])
    assert "device_kernels" not in cpu_only.collect((0, 10_000)).summary


def test_nvml_readings_include_power_and_clocks_and_skip_what_a_board_lacks() -> None:
    """A stand-in pynvml (no driver here) answering as NVML does, one GPU without a power reading."""
    from mlharness.profiling import nvml

    class NVMLError(Exception):
        pass

    fake = SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 312_500 if h == "a" else (_ for _ in ()).throw(NVMLError("NotSupported")),
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 1 else 2619)
    values = nvml.sample(fake, ["a", "b"])
    assert values["gpu0_util_pct"] == 87 and values["gpu0_mem_util_pct"] == 40 and values["gpu0_mem_mib"] == 3072
    assert values["gpu0_power_w"] == 312.5 and values["gpu0_sm_clock_mhz"] == 1980 and values["gpu0_mem_clock_mhz"] == 2619
    assert "gpu1_power_w" not in values and values["gpu1_sm_clock_mhz"] == 1980


# ---------------------------------------------------------------- the benchmark

def test_gpu_efficiency_without_a_gpu_says_so_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    _no_gpu()
    out = tmp_path / "gpu_efficiency.json"
    done = subprocess.run([sys.executable, "bench/gpu_efficiency.py", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_efficiency: no CUDA GPU to measure on ("), done.stderr
    assert not out.exists()
