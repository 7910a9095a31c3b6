"""Profiling: every level yields valid spans on resnet50-light (ONNX Runtime) and on a PyTorch model,
through the real CLI, LoadGen and frameworks; the merged timeline is sound (valid JSON, timestamps
in order, spans nested, framework runs inside the model's predict spans); levels and counters that
cannot run here are reported unavailable with a reason, never filled in."""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.profiling import LEVELS, parse_levels
from mlharness.profiling.perf_stat import HARDWARE_EVENTS, parse
from mlharness.profiling.timeline import check
from tests.support import read_run, run_cli, scenario_root, tiny_torch_model, write_manifest


def _profile(results: Path, model: str, scenario: str) -> tuple[dict, dict]:
    folder = scenario_root(results, model, scenario) / "profile"
    timeline = json.loads((folder / "timeline.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    return timeline, summary


def _spans(timeline: dict, cat: str, name: str | None = None) -> list[dict]:
    return [e for e in timeline["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == cat and (name is None or e["name"] == name)]


def _assert_sound(timeline: dict) -> None:
    assert check(timeline) == []
    stamps = [e["ts"] for e in timeline["traceEvents"] if e.get("ph") != "M"]
    assert stamps == sorted(stamps)
    assert timeline["otherData"]["nesting"]["overlapping"] == 0


def _clock_slack_us(summary: dict) -> float:
    """How far a stamp moved over from the realtime clock may be off: the uncertainty the profile
    records for the clock offset (larger where reading a clock is slow, as on some VMs), plus 1 us
    for stamps kept in whole microseconds (ONNX Runtime) or as a double of microseconds since 1970
    (LoadGen's trace origin, 0.25 us steps). The margins checked against it are a few to tens of
    microseconds here, and a faster CPU shortens them: the checks allow the measurement's own error."""
    return summary["clock"]["offset_uncertainty_ns"] / 1e3 + 1.0


def _assert_framework_inside_predict(timeline: dict, summary: dict, run_name: str | None) -> None:
    """Every framework span sits inside one model-level predict span on the same thread: the
    framework's realtime stamps were moved onto the harness's monotonic clock correctly."""
    slack_us = _clock_slack_us(summary)
    predicts = _spans(timeline, "model", "predict")
    framework = _spans(timeline, "framework", run_name)
    assert predicts and framework
    for span in framework:
        assert any(p["pid"] == span["pid"] and p["tid"] == span["tid"] and p["ts"] - slack_us <= span["ts"]
                   and span["ts"] + span["dur"] <= p["ts"] + p["dur"] + slack_us for p in predicts), span


def _assert_system_honest(summary: dict) -> None:
    """Each part of the system level either measured or names why not; nothing is filled in."""
    system = summary["system"]
    assert system["samples"] >= 1 and "rss_mib" in system["series"]
    unavailable = system["unavailable"]
    assert all(isinstance(reason, str) and reason.strip() for reason in unavailable.values()), unavailable
    if "perf" in unavailable:  # perf cannot run here at all: no counter, no per-counter reason
        assert system["perf_stat"] == {} and not any(k.startswith("perf:") for k in unavailable)
    else:  # each hardware counter is a value or a reason, never both nor neither
        for event in HARDWARE_EVENTS:
            assert (event in system["perf_stat"]) != (f"perf:{event}" in unavailable), event
    gpu_series = any(key.startswith("gpu") for key in system["series"])
    assert ("nvml" in unavailable) != gpu_series  # GPU figures, or the reason there are none
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "nvml" in unavailable


def test_parse_levels() -> None:
    assert parse_levels("full") == list(LEVELS)
    assert parse_levels("model, harness,model") == ["model", "harness"]
    with pytest.raises(UserError, match="--profile: expected a comma list"):
        parse_levels("harness,gpu")


def test_resnet50_offline_full_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r"
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--quick", "--profile", "full",
                   "--results-dir", results) == 0
    timeline, summary = _profile(results, "resnet50-light", "Offline")
    _assert_sound(timeline)
    assert {level: info["status"] for level, info in summary["levels"].items()} == {level: "ok" for level in LEVELS}
    for level in ("harness", "model", "framework", "python"):
        assert _spans(timeline, level), level
    assert any(e.get("ph") == "C" for e in timeline["traceEvents"])  # system counters
    _assert_framework_inside_predict(timeline, summary, "model_run")
    assert summary["stages"]["predict"]["count"] >= 1 and summary["stages"]["query"]["p90_ms"] > 0
    top = summary["operators"]["top"]
    # Any CPU: convolutions are nearly all of ResNet-50's work, and ONNX Runtime's CPU layout rewrite
    # (NCHWc, on AVX2/AVX-512 only) keeps the op type Conv.
    assert top[0]["op"] == "Conv" and 0 < top[0]["share_of_predict"] <= 1
    assert set(summary["overhead"]["per_level"]) == set(LEVELS)
    assert (scenario_root(results, "resnet50-light", "Offline") / "profile" / "python.html").is_file()
    _assert_system_honest(summary)
    record = read_run(results, "resnet50-light", "Offline")
    assert record["profile"]["levels"]["framework"] == "ok" and record["profile"]["top_operators"][0]["op"] == "Conv"

    capsys.readouterr()
    assert run_cli("profile", "show", scenario_root(results, "resnet50-light", "Offline")) == 0
    shown = capsys.readouterr().out
    assert "stages (ms)" in shown and "Conv" in shown and "predict" in shown


@pytest.mark.parametrize("scenario", ["SingleStream", "Server"])
def test_resnet50_latency_scenarios_with_loadgen_trace(tmp_path: Path, scenario: str) -> None:
    results = tmp_path / "r"
    assert run_cli("run", "resnet50-light", "--scenario", scenario, "--quick", "--profile", "harness,model,framework",
                   "--set", "enable_trace=1", "--results-dir", results) == 0
    timeline, summary = _profile(results, "resnet50-light", scenario)
    _assert_sound(timeline)
    _assert_framework_inside_predict(timeline, summary, "model_run")
    assert summary["harness"]["loadgen_trace"]["status"] == "ok"
    queries = [e for e in timeline["traceEvents"] if e.get("ph") == "b" and e["name"] == "query"]
    samples = [e for e in timeline["traceEvents"] if e.get("ph") == "b" and e["name"] == "loadgen_sample"]
    assert len(samples) == summary["harness"]["samples"] and queries
    # LoadGen stamps a sample's issue before calling the SUT: on one clock, it comes first.
    assert min(e["ts"] for e in samples) <= min(e["ts"] for e in queries) + _clock_slack_us(summary)


def test_torch_model_full_profile(tmp_path: Path, specs_copy: Path) -> None:
    pytest.importorskip("torch")
    write_manifest(specs_copy / "models", "tiny-cnn.yaml", tiny_torch_model())
    results = tmp_path / "r"
    assert run_cli("run", "tiny-cnn", "--scenario", "Offline", "--quick", "--profile", "full",
                   "--results-dir", results) == 0
    timeline, summary = _profile(results, "tiny-cnn", "Offline")
    _assert_sound(timeline)
    assert all(info["status"] == "ok" for info in summary["levels"].values())
    assert summary["operators"]["framework"] == "torch"
    # torch picks oneDNN for a float32 convolution of more than one sample (the Offline batches of 8)
    # on any x86-64 CPU: the choice depends on shapes and the build, not on the CPU model.
    assert any(op["op"] == "aten::mkldnn_convolution" for op in summary["operators"]["top"])
    _assert_framework_inside_predict(timeline, summary, None)  # torch ops run on the SUT's worker thread
    assert {"harness", "model", "python"} <= {e.get("cat") for e in timeline["traceEvents"]}
    _assert_system_honest(summary)


def test_null_backend_framework_level_is_unavailable(tmp_path: Path) -> None:
    results = tmp_path / "r"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--profile", "framework,harness",
                   "--results-dir", results) == 0
    timeline, summary = _profile(results, "null", "Offline")
    assert summary["levels"]["framework"]["status"] == "unavailable"
    assert "null backend has no framework profiler" in summary["levels"]["framework"]["reason"]
    assert not _spans(timeline, "framework") and _spans(timeline, "harness", "batch")
    assert read_run(results, "null", "Offline")["profile"]["unavailable"]["framework"]


# A null model whose postprocess writes down, from inside the run's worker thread, what profiling
# has put in place there: the SUT's batch observer, the thread's profile hook, profiling modules.
PROBE_MODEL = """\
    kind: model
    name: probe
    version: 1.0.0
    framework: {name: "null"}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: scores, type: scores, element_type: float32, shape: [batch, 10]}]
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          return np.array([sample], dtype=np.float32)
    postprocess: |
      import json, sys
      def postprocess(outputs, ctx):
          frame, observer = sys._getframe(), "no SUT frame"
          while frame is not None:
              owner = frame.f_locals.get("self")
              if type(owner).__name__ == "SystemUnderTest":
                  observer = type(owner.observer).__name__
                  break
              frame = frame.f_back
          probe = {"observer": observer, "profile_hook": sys.getprofile() is not None,
                   "profiling_modules": sorted(m for m in sys.modules if m.startswith("mlharness.profiling"))}
          with open(%(out)r, "a") as out:
              out.write(json.dumps(probe) + "\\n")
          return outputs["scores"]
    attributes:
      max_batch_size: 64
      settings: {Offline: {target_qps: 100}}
    """


def _probes(path: Path) -> tuple[list[dict], collections.Counter]:
    """Every probe, and a count of (observer, profile hook, profiling imported) for messages."""
    probes = [json.loads(line) for line in path.read_text().splitlines()]
    return probes, collections.Counter((p["observer"], p["profile_hook"], bool(p["profiling_modules"])) for p in probes)


def test_profile_off_installs_nothing(tmp_path: Path, specs_copy: Path) -> None:
    """Without --profile the measured path is the plain one: every batch the SUT runs goes through
    no observer and no profile hook, the profiling package is never imported (in any postprocess
    call: the first inference and warm-up too), and no profile is recorded or written. The probe is
    checked on a profiled run first, so a probe that cannot see a tracer cannot pass."""
    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    write_manifest(specs_copy / "models", "probe.yaml", PROBE_MODEL % {"out": str(on)})
    assert run_cli("run", "probe", "--scenario", "Offline", "--quick", "--profile", "harness,python",
                   "--results-dir", tmp_path / "profiled") == 0
    probes, seen = _probes(on)
    # Calls outside the SUT (first inference, warm-up, the profile's overhead calibration) find no SUT.
    in_sut = [p for p in probes if p["observer"] != "no SUT frame"]
    assert in_sut and all(p["observer"] == "ProfileSession" and p["profile_hook"] for p in in_sut), seen
    assert all("mlharness.profiling.session" in p["profiling_modules"] for p in in_sut), seen

    write_manifest(specs_copy / "models", "probe.yaml", PROBE_MODEL % {"out": str(off)})
    plain = tmp_path / "plain"
    assert run_cli("run", "probe", "--scenario", "Offline", "--quick", "--results-dir", plain) == 0
    probes, seen = _probes(off)
    assert ("NoneType", False, False) in seen and set(seen) <= {("NoneType", False, False),
                                                                ("no SUT frame", False, False)}, seen
    assert read_run(plain, "probe", "Offline")["profile"] is None
    assert not (scenario_root(plain, "probe", "Offline") / "profile").exists()


def test_perf_counters_not_supported_are_unavailable() -> None:
    stderr = "5.2,msec,task-clock,5200000,100.00,0.9,CPUs utilized\n<not supported>,,cycles,0,100.00,,\n"
    parsed = parse(stderr, ("task-clock", "cycles", "instructions"), 0)
    assert parsed["counters"] == {"task-clock": {"value": 5.2, "unit": "msec"}}
    assert "not supported" in parsed["unavailable"]["cycles"]
    assert "exited 0" in parsed["unavailable"]["instructions"]


def test_nvml_without_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlharness.profiling import nvml

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    module, handles, reason = nvml.open_devices()
    assert module is None and handles == [] and reason


def test_timeline_check_finds_crossing_spans_and_disorder() -> None:
    bad = {"traceEvents": [
        {"name": "a", "ph": "X", "ts": 0.0, "dur": 10.0, "pid": 1, "tid": 1},
        {"name": "b", "ph": "X", "ts": 5.0, "dur": 10.0, "pid": 1, "tid": 1},
        {"name": "c", "ph": "X", "ts": 1.0, "dur": 1.0, "pid": 1, "tid": 2},
    ]}
    problems = check(bad)
    assert any("overlaps a" in p for p in problems) and any("before the previous" in p for p in problems)
