"""A profile of one LoadGen test: the chosen levels' tracers around the test (and the SUT's batch
observer while it runs), then the merged timeline.json and summary.json in the profile folder and
a short summary for run.json."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mlharness.atomic_io import write_json
from mlharness.profiling.clock import CLOCK_NAME, ClockAnchor, now_ns
from mlharness.profiling.framework_tracer import operator_table
from mlharness.profiling.registry import tracer_class
from mlharness.profiling.overhead import calibrate as calibrate_overhead
from mlharness.profiling.timeline import build as build_timeline
from mlharness.profiling.tracer import LevelResult, TraceContext, Tracer

SUMMARY_SCHEMA_VERSION = 1
# The built-in levels start in this order (the tracers are profiling's registry), levels of entry
# points after them, and all stop in reverse: the system sampler's thread exists before the python
# level starts following new threads, and python stops first so it never samples the others' exit.
START_ORDER = ("system", "framework", "harness", "model", "python")
GENERATIVE_OVERHEAD = ("not measured for a generative model: its harness level is derived after the test from "
                       "stamps the token SUT keeps anyway (nothing runs on the token path); the other levels' cost "
                       "is not calibrated")


class ProfileSession:
    def __init__(self, levels: list[str], out_dir: Path, scenario: str = "", calibrate: bool = True):
        self.levels = [level for level in START_ORDER if level in levels] + \
            [level for level in dict.fromkeys(levels) if level not in START_ORDER]
        self.requested = list(levels)
        self.out_dir = Path(out_dir)
        self.scenario = scenario
        self.calibrate = calibrate
        self.results: dict[str, LevelResult] = {}
        self.overhead: dict[str, Any] = {}
        self.window = (0, 0)
        self._tracers: list[Tracer] = []
        self._hooks: list[Any] = []
        self._ctx: TraceContext | None = None

    # The SUT's BatchObserver: fans each batch out to the tracers that want it.
    def batch(self, times: Any) -> None:
        for hook in self._hooks:
            hook(times)

    @contextmanager
    def measuring(self, runtime: Any, sut: Any = None) -> Iterator["ProfileSession"]:
        """The levels around the test of `sut` (kept for tracers that read the SUT's own records after it)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ctx = self._ctx = TraceContext(runtime, self.out_dir, ClockAnchor.measure(), self.scenario, sut=sut)
        if getattr(runtime, "generative", False):
            self.overhead = {"method": GENERATIVE_OVERHEAD, "per_level": {}}
        elif self.calibrate:
            self.overhead = calibrate_overhead(self.levels, runtime, self._scratch_tracer)
        for level in self.levels:
            tracer = tracer_class(level)(ctx)
            reason = tracer.unavailable(ctx)
            if reason:
                self.results[level] = LevelResult(level, "unavailable", reason)
                continue
            try:
                tracer.start()
            except Exception as exc:  # a level that cannot start is reported; the run goes on
                self.results[level] = LevelResult(level, "failed", f"start: {type(exc).__name__}: {exc}")
                continue
            self._tracers.append(tracer)
        self._hooks = [t.batch for t in self._tracers if hasattr(t, "batch")]
        start = now_ns()
        try:
            yield self
        finally:
            self.window = (start, now_ns())
            self._hooks = []
            for tracer in reversed(self._tracers):
                try:
                    tracer.stop()
                except Exception as exc:
                    self.results[tracer.level] = LevelResult(tracer.level, "failed", f"stop: {type(exc).__name__}: {exc}")
            self._tracers = [t for t in self._tracers if t.level not in self.results]

    def _scratch_tracer(self, level: str, scratch: Path) -> Tracer | None:
        assert self._ctx is not None
        ctx = TraceContext(self._ctx.runtime, scratch, self._ctx.anchor, self.scenario)
        tracer = tracer_class(level)(ctx)
        return None if tracer.unavailable(ctx) else tracer

    def finish(self, loadgen_trace: Path | None = None) -> dict[str, Any]:
        """Collect every level, write timeline.json and summary.json; returns run.json's profile entry."""
        assert self._ctx is not None, "finish() after measuring()"
        self._ctx.loadgen_trace = loadgen_trace
        for tracer in self._tracers:
            try:
                self.results[tracer.level] = tracer.collect(self.window)
            except Exception as exc:
                self.results[tracer.level] = LevelResult(tracer.level, "failed", f"collect: {type(exc).__name__}: {exc}")
        results = [self.results[level] for level in self.levels if level in self.results]
        summary = self._summary(results)
        timeline = build_timeline([r for r in results if r.status == "ok"], self.window[0],
                                  {"levels": {r.level: r.status for r in results}, "scenario": self.scenario})
        summary["timeline"] = {"file": "timeline.json", "events": len(timeline["traceEvents"]),
                               "nesting": timeline["otherData"]["nesting"]}
        write_json(self.out_dir / "timeline.json", timeline)
        write_json(self.out_dir / "summary.json", summary)
        return record_entry(summary)

    def _summary(self, results: list[LevelResult]) -> dict[str, Any]:
        assert self._ctx is not None
        anchor = self._ctx.anchor
        by_level = {r.level: r for r in results}
        stages: dict[str, Any] = {}
        for r in results:
            stages.update(r.summary.pop("stages", {}) if r.status == "ok" else {})
        summary: dict[str, Any] = {
            "schema_version": SUMMARY_SCHEMA_VERSION, "scenario": self.scenario, "levels_requested": self.requested,
            "levels": {r.level: {"status": r.status, **({"reason": r.reason} if r.reason else {})} for r in results},
            "clock": {"name": CLOCK_NAME, "realtime_minus_monotonic_ns": anchor.realtime_minus_monotonic_ns,
                      "offset_uncertainty_ns": anchor.uncertainty_ns},
            "window": {"start_ns": self.window[0], "end_ns": self.window[1],
                       "seconds": round((self.window[1] - self.window[0]) / 1e9, 3)},
            "stages": stages,
        }
        framework = by_level.get("framework")
        if framework is not None and framework.status == "ok":
            model = by_level.get("model")
            if model is not None and model.status == "ok":
                basis, total = "model level predict spans", int(model.summary["predict_total_ms"] * 1e6)
            else:  # the framework's own runs (ONNX Runtime), else the device's predict spans (torch on a GPU)
                stage = "device_predict" if "framework_run" not in stages and "device_predict" in stages else "framework_run"
                basis = {"framework_run": "framework runs", "device_predict": "device_predict spans"}[stage]
                total = int(stages.get(stage, {}).get("total_ms", 0) * 1e6)
            summary["operators"] = {"framework": framework.summary["framework"], "predict_basis": basis,
                                    **operator_table(framework.summary, total)}
        for r in results:
            if r.status == "ok":
                summary[r.level] = r.summary
        summary["overhead"] = self.overhead or {"method": "not measured (calibration off)", "per_level": {}}
        summary["files"] = sorted({"timeline.json", "summary.json", *(p.name for r in results for p in r.files)})
        return summary


def record_entry(summary: dict[str, Any]) -> dict[str, Any]:
    """The short form kept in run.json (RunRecord.profile); summary.json has the rest."""
    stages = {name: {k: v for k, v in stats.items() if k in ("count", "p50_ms", "p90_ms", "p99_ms")}
              for name, stats in summary.get("stages", {}).items() if stats.get("count")}
    unavailable = {level: info["reason"] for level, info in summary["levels"].items() if info["status"] != "ok"}
    unavailable.update({f"system:{k}": v for k, v in summary.get("system", {}).get("unavailable", {}).items()})
    return {
        "schema_version": summary["schema_version"], "dir": "profile", "files": summary["files"],
        "levels": {level: info["status"] for level, info in summary["levels"].items()},
        "stages": stages,
        "top_operators": summary.get("operators", {}).get("top", [])[:5],
        "overhead_pct": {level: fig["overhead_pct"] for level, fig in summary["overhead"].get("per_level", {}).items()},
        "unavailable": unavailable,
        **({"time_split": _split_entry(summary["harness"]["time_split"])}
           if "time_split" in summary.get("harness", {}) else {}),
    }


def _split_entry(split: dict[str, Any]) -> dict[str, Any]:
    """run.json's form of a generative test's time split: total and share of each part."""
    return {"samples": split["samples"], "sample_total_ms": split["sample_total_ms"],
            **{part: {k: split[part][k] for k in ("total_ms", "share", "p50_ms", "p90_ms", "p99_ms") if k in split[part]}
               for part in ("prefill", "decode", "harness")}}
