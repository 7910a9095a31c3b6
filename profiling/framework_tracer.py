"""The `framework` level: the backend's own profiler (ONNX Runtime's per-node times, torch.profiler's
operators and, on a GPU, CUDA kernels through CUPTI), moved onto the profile clock and drawn on the
OS thread that ran them, so a run's nodes nest inside the model level's predict span."""
from __future__ import annotations

from typing import Any

from mlharness.profiling.stats import self_times, stage_stats, top_operators
from mlharness.profiling.tracer import LevelResult, Span, TraceContext, Tracer

MAX_SPANS = 200_000  # timeline cap for long runs; the operator table still counts every event


class FrameworkTracer(Tracer):
    level = "framework"

    @classmethod
    def unavailable(cls, ctx: TraceContext) -> str | None:
        return ctx.runtime.backend.profiling_unavailable()

    def start(self) -> None:
        self.profile: Any = None
        self.ctx.runtime.backend.start_profiling(self.ctx.out_dir)

    def stop(self) -> None:
        self.profile = self.ctx.runtime.backend.end_profiling()

    def collect(self, window: tuple[int, int]) -> LevelResult:
        profile, anchor = self.profile, self.ctx.anchor
        lo, hi = window
        events = []
        for ev in profile.events:
            start = anchor.convert(ev.start_ns, profile.clock)
            if lo <= start <= hi:  # drop what ran before the test (session start-up, warm-up)
                events.append((ev, start))
        ops = [(ev.thread, start, start + ev.dur_ns, ev.op_type) for ev, start in events if ev.category == "op"]
        runs = [ev.dur_ns for ev, _ in events if ev.category == "session" and ev.op_type in ("model_run",)]
        spans = []
        for ev, start in events[:MAX_SPANS]:
            track = "process" if ev.device == "cpu" else "device"
            args = {"op": ev.op_type, **ev.args} if ev.category == "op" else dict(ev.args)
            spans.append(Span(ev.name, start, start + ev.dur_ns, ev.thread, args, track))
        summary = {
            "framework": profile.framework,
            "events": len(events),
            "timeline_capped": len(events) > MAX_SPANS,
            "clock": f"{profile.clock} converted with offset {anchor.realtime_minus_monotonic_ns} ns "
                     f"(+/- {anchor.uncertainty_ns} ns)" if profile.clock != "monotonic" else "monotonic",
            "files": [p.name for p in profile.files],
            "op_self_pairs": self_times(ops),  # replaced by the session once predict time is known
        }
        kernels = [ev.dur_ns for ev, _ in events if ev.device != "cpu"]
        if kernels:  # device work the framework's profiler saw (CUDA kernels and copies through CUPTI)
            summary["device_kernels"] = {"count": len(kernels), "total_ms": round(sum(kernels) / 1e6, 3)}
        if runs:
            summary["stages"] = {"framework_run": stage_stats(runs)}
        return LevelResult(self.level, "ok", spans=spans, summary=summary, files=list(profile.files))


def operator_table(summary: dict[str, Any], predict_total_ns: int) -> dict[str, Any]:
    pairs = summary.pop("op_self_pairs", [])
    total = sum(ns for _, ns in pairs)
    return {"predict_total_ms": round(predict_total_ns / 1e6, 3), "operator_total_ms": round(total / 1e6, 3),
            "top": top_operators(pairs, predict_total_ns)}
