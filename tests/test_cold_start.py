"""Cold start and resources: the runtime's phase times, the first inference and warm-up outside LoadGen
(null and resnet50-light on ONNX Runtime, for real), a failing user function during the warm-up, the
coldstart.* figures and their direction, peak memory, and where the figures are shown."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mlharness.records.record_metrics import flatten, higher_is_better
from mlharness.specs.manifests import load_manifest
from mlharness.sut.runtime import Runtime, build_runtime
from mlharness.sut import warmup as warmup_module
from mlharness.sut.staging import SampleError
from mlharness.sut.warmup import first_inference_and_warm_up
from tests.support import REPO, write_manifest

SPECS = REPO / "specs"


def make_runtime(model: Path, backend: str, dataset: str, **options: Any) -> Runtime:
    return build_runtime(load_manifest(model), load_manifest(SPECS / "datasets" / f"{dataset}.yaml"),
                         load_manifest(SPECS / "hardware" / "cpu.yaml"), backend, options)


def spy_on_predict(runtime: Runtime) -> list[dict[str, np.ndarray]]:
    """The real predict, with a copy of every batch it was given kept."""
    batches: list[dict[str, np.ndarray]] = []
    predict = runtime.backend.predict

    def recording(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batches.append({name: array.copy() for name, array in inputs.items()})
        return predict(inputs)

    runtime.backend.predict = recording  # type: ignore[method-assign]
    return batches


def batch_sizes(batches: list[dict[str, np.ndarray]]) -> list[int]:
    return [len(next(iter(batch.values()))) for batch in batches]


@pytest.fixture
def null_runtime() -> Runtime:
    return make_runtime(SPECS / "models" / "null.yaml", "null", "null-samples")


def test_runtime_times_each_cold_start_phase(null_runtime: Runtime) -> None:
    assert set(null_runtime.cold_start) == {"resolve_seconds", "enumerate_seconds", "compile_seconds", "load_seconds"}
    assert all(isinstance(v, float) and v >= 0 for v in null_runtime.cold_start.values())


def test_null_first_inference_then_the_requested_warm_up_queries(null_runtime: Runtime) -> None:
    batches = spy_on_predict(null_runtime)
    cold = first_inference_and_warm_up(null_runtime, max_batch_size=16, queries=5, seconds=0.0)
    assert batch_sizes(batches) == [1] + [16] * 5  # one sample first, then full batches
    assert batches[0]["x"][:, 0].tolist() == [0.0]
    assert batches[1]["x"][:, 0].tolist() == [float(i) for i in range(16)]  # the dataset's first samples
    assert cold["first_inference_seconds"] > 0
    warmup = cold["warmup"]
    assert warmup == {"queries": 5, "samples": 80, "seconds": warmup["seconds"], "batch_size": 16,
                      "fastest_query_seconds": warmup["fastest_query_seconds"], "requested": {"queries": 5, "seconds": 0.0}}
    assert 0 < warmup["fastest_query_seconds"] <= warmup["seconds"] / 5
    assert null_runtime.staged.arrays == {}  # prepared directly: nothing was staged for LoadGen


def test_warm_up_runs_at_least_the_requested_seconds(null_runtime: Runtime) -> None:
    batches = spy_on_predict(null_runtime)
    cold = first_inference_and_warm_up(null_runtime, max_batch_size=4, queries=1, seconds=0.2)
    warmup = cold["warmup"]
    assert warmup["seconds"] >= 0.2 and warmup["queries"] >= 1
    assert batch_sizes(batches) == [1] + [4] * warmup["queries"]
    assert warmup["samples"] == 4 * warmup["queries"]


def test_the_fastest_warm_up_batch_is_kept_apart_from_a_stall(null_runtime: Runtime,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch stalls (a busy machine): the mean carries the stall, the fastest batch does not. The
    warm-up's clock is the test's own: each predict takes 1 ms of it, the stalled one 200 ms, so the
    figures are exact on any machine."""
    predict, calls, now = null_runtime.backend.predict, [], [100.0]

    def stalling(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(1)
        now[0] += 0.2 if len(calls) == 3 else 0.001  # the first inference, one warm-up batch, then the stall
        return predict(inputs)

    monkeypatch.setattr(warmup_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    null_runtime.backend.predict = stalling  # type: ignore[method-assign]
    cold = first_inference_and_warm_up(null_runtime, max_batch_size=4, queries=4, seconds=0.0)
    warmup = cold["warmup"]
    assert len(calls) == 5 and cold["first_inference_seconds"] == pytest.approx(0.001)
    assert warmup["queries"] == 4 and warmup["seconds"] == pytest.approx(0.203)  # the mean, 51 ms, carries it
    assert warmup["fastest_query_seconds"] == pytest.approx(0.001)


def test_zero_queries_and_seconds_skip_the_warm_up(null_runtime: Runtime) -> None:
    batches = spy_on_predict(null_runtime)
    cold = first_inference_and_warm_up(null_runtime, max_batch_size=16, queries=0, seconds=0.0)
    assert batch_sizes(batches) == [1]  # the first inference is still measured
    assert cold["first_inference_seconds"] > 0
    assert cold["warmup"]["queries"] == 0 and cold["warmup"]["samples"] == 0 and cold["warmup"]["seconds"] == 0.0


def test_a_dataset_smaller_than_the_batch_is_cycled() -> None:
    runtime = make_runtime(SPECS / "models" / "null.yaml", "null", "null-samples", dataset_limit=3)
    batches = spy_on_predict(runtime)
    first_inference_and_warm_up(runtime, max_batch_size=8, queries=1, seconds=0.0)
    assert batches[1]["x"][:, 0].tolist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0]


def test_resnet50_light_on_onnxruntime() -> None:
    runtime = make_runtime(SPECS / "models" / "resnet50-light.yaml", "onnxruntime", "synthetic-images")
    assert runtime.cold_start["load_seconds"] > 0 and runtime.cold_start["resolve_seconds"] > 0
    try:
        batches = spy_on_predict(runtime)
        cold = first_inference_and_warm_up(runtime, max_batch_size=8, queries=2, seconds=0.0)
    finally:
        runtime.backend.close()
    assert batch_sizes(batches) == [1, 8, 8]
    assert batches[1]["gpu_0/data_0"].shape == (8, 3, 224, 224)
    assert cold["first_inference_seconds"] > 0
    assert cold["warmup"]["queries"] == 2 and cold["warmup"]["samples"] == 16 and cold["warmup"]["batch_size"] == 8


FAILING_MODEL = """\
    kind: model
    name: flaky
    version: 1.0.0
    framework: {name: "null"}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: scores, type: scores, element_type: float32, shape: [batch, 10]}]
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          if sample == %(bad_pre)d:
              raise ValueError("cannot read this one")
          return np.array([sample], dtype=np.float32)
    postprocess: |
      def postprocess(outputs, ctx):
          if len(outputs["scores"]) > %(bad_post_over)d:
              raise RuntimeError("postprocess blew up")
          return outputs["scores"]
    attributes: {max_batch_size: 4}
    """


def flaky_runtime(folder: Path, bad_pre: int = -1, bad_post_over: int = 10**9) -> Runtime:
    path = write_manifest(folder, "flaky.yaml", FAILING_MODEL % {"bad_pre": bad_pre, "bad_post_over": bad_post_over})
    return make_runtime(path, "null", "null-samples")


def test_preprocess_failing_in_the_warm_up_names_the_sample(tmp_path: Path) -> None:
    runtime = flaky_runtime(tmp_path, bad_pre=2)
    with pytest.raises(SampleError, match="sample 2: preprocess raised ValueError: cannot read this one") as raised:
        first_inference_and_warm_up(runtime, max_batch_size=4, queries=1, seconds=0.0)
    assert raised.value.indices == [2] and raised.value.stage == "preprocess"
    # without a warm-up only sample 0 is prepared
    first_inference_and_warm_up(runtime, max_batch_size=4, queries=0, seconds=0.0)


def test_postprocess_failing_in_the_warm_up_names_the_samples(tmp_path: Path) -> None:
    runtime = flaky_runtime(tmp_path, bad_post_over=1)  # the first inference (one sample) passes, a batch fails
    with pytest.raises(SampleError, match=r"samples \[0, 1, 2, 3\]: postprocess raised RuntimeError") as raised:
        first_inference_and_warm_up(runtime, max_batch_size=4, queries=1, seconds=0.0)
    assert raised.value.stage == "postprocess"
    runtime = flaky_runtime(tmp_path, bad_post_over=0)
    with pytest.raises(SampleError, match="sample 0: postprocess raised RuntimeError: postprocess blew up"):
        first_inference_and_warm_up(runtime, max_batch_size=4, queries=0, seconds=0.0)


def test_a_result_without_one_row_per_sample_fails_like_in_the_sut(null_runtime: Runtime) -> None:
    null_runtime.postprocess = lambda outputs, ctx: outputs["scores"][:1]
    with pytest.raises(SampleError, match=r"postprocess raised ValueError: expected a result with 8 rows"):
        first_inference_and_warm_up(null_runtime, max_batch_size=8, queries=1, seconds=0.0)


COLD_START = {"resolve_seconds": 0.5, "enumerate_seconds": 0.01, "compile_seconds": 0.002, "load_seconds": 1.5,
              "first_inference_seconds": 0.04,
              "warmup": {"queries": 4, "samples": 32, "seconds": 0.2, "batch_size": 8,
                         "requested": {"queries": 4, "seconds": 0.0}},
              "peak_rss_bytes": 512 * 2**20,
              "device_memory": {"device": "cuda:0", "source": "torch.cuda", "peak_allocated_bytes": 2**30,
                                "peak_reserved_bytes": 2**31}}


def test_flatten_yields_cold_start_figures_lower_is_better() -> None:
    record = {"scenario": "Offline", "performance": {"samples_per_second": 100.0}, "cold_start": COLD_START}
    figures = flatten(record)
    cold = {name: value for name, value in figures.items() if name.startswith("coldstart.")}
    assert cold == {"coldstart.resolve_seconds": 0.5, "coldstart.enumerate_seconds": 0.01,
                    "coldstart.compile_seconds": 0.002, "coldstart.load_seconds": 1.5,
                    "coldstart.first_inference_seconds": 0.04, "coldstart.peak_rss_bytes": 512.0 * 2**20,
                    "coldstart.device_peak_allocated_bytes": 2.0**30, "coldstart.device_peak_reserved_bytes": 2.0**31}
    assert not any(higher_is_better(name) for name in cold)
    assert higher_is_better("offline.samples_per_second")
    # a token run's figures: time waiting for room in the batch down, goodput and occupancy up
    assert not higher_is_better("server.queue_share") and not higher_is_better("server.ttft_p99_ns")
    assert higher_is_better("server.goodput_fraction") and higher_is_better("server.batch_occupancy_mean")
    assert not any(name.startswith("coldstart.") for name in flatten({"scenario": "Offline", "cold_start": {}}))


def test_peak_rss_grows_with_touched_memory() -> None:
    code = ("import numpy as np, sys; from mlharness import resources;"
            "before = resources.peak_rss_bytes(); big = np.ones(256 * 2**20, np.uint8);"
            "after = resources.peak_rss_bytes(); current = resources.current_rss_bytes();"
            "print(before, after, current, resources.device_memory('cuda:0'), resources.device_memory('cpu'),"
            "'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    before, after, current, cuda, cpu, torch_imported = result.stdout.split()
    assert int(after) - int(before) >= 200 * 2**20 and int(current) >= 256 * 2**20
    assert (cuda, cpu, torch_imported) == ("None", "None", "False")  # never imports torch to ask


def test_device_memory_reports_torch_cuda_peaks() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from mlharness.resources import device_memory

    block = torch.ones(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    found = device_memory("cuda:0")
    assert found is not None and found["peak_allocated_bytes"] >= block.numel()
    assert found["peak_reserved_bytes"] >= found["peak_allocated_bytes"]
    assert device_memory("cpu") is None


def test_summary_and_report_show_cold_start(tmp_path: Path) -> None:
    from mlharness.commands.run import format_summary
    from mlharness.compare.report import write_report
    from mlharness.records.run_record import RunRecord

    record = RunRecord(run_id="r1", command="", model={"name": "null"}, dataset={}, backend="null",
                       scenario="Offline", mode="performance", status="ok", cold_start=COLD_START)
    summary = format_summary(record)
    assert "cold start : resolve 500 ms, load 1.50 s, first inference 40 ms, warm-up 4 queries of 8 samples" in summary
    assert "memory : peak RSS 512 MiB, peak cuda:0 1024 MiB allocated" in summary
    html = write_report([record], tmp_path, "t").read_text()
    assert "<h2>Cold start and memory</h2>" in html and "<td>512</td>" in html and "<td>40</td>" in html
    record = dataclasses.replace(record, cold_start={})
    assert "cold start" not in format_summary(record)
    assert "Cold start" not in write_report([record], tmp_path, "t").read_text()
