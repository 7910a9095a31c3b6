"""The `harness` level: per-query spans from issue to completion, queue wait and batch formation,
from the SUT's own perf_counter_ns stamps; LoadGen's per-sample trace is added when its trace
option (--set enable_trace=1) was on. For a generative model, the token timeline instead: prefill and
decode per sequence, the engine's steps and batch size, the scheduler's waits (mlharness.profiling.token_timeline).
On a GPU backend (one with `start_device_timing`), CUDA events around each predict give the device's
own time per batch, drawn on the device track."""
from __future__ import annotations

import threading
from typing import Any

from mlharness.profiling import loadgen_trace
from mlharness.profiling.stats import stage_stats
from mlharness.profiling.tracer import AsyncSpan, LevelResult, Span, Tracer

MAX_LISTED_SAMPLES = 16  # sample indices kept per span; the full count is in batch_size


def sample_list(indices: Any) -> list[int]:
    return [int(i) for i in list(indices)[:MAX_LISTED_SAMPLES]]


class HarnessTracer(Tracer):
    level = "harness"

    def start(self) -> None:
        self.batches: list[tuple[int, Any]] = []
        self.device_timings: list[Any] = []
        backend = self.ctx.runtime.backend
        self._device_timed = (getattr(backend, "start_device_timing", None) is not None
                              and getattr(backend, "device_timing_unavailable", "no device timing") is None)
        if self._device_timed:
            backend.start_device_timing()

    def stop(self) -> None:
        if self._device_timed:
            self.device_timings = self.ctx.runtime.backend.end_device_timing()

    def batch(self, times: Any) -> None:
        self.batches.append((threading.get_native_id(), times))

    def collect(self, window: tuple[int, int]) -> LevelResult:
        if getattr(self.ctx.runtime, "generative", False) and self.ctx.sut is not None:
            from mlharness.profiling import token_timeline

            return self._with_loadgen_trace(token_timeline.collect(self.ctx.sut, self.level))
        spans, queued = [], []
        waits, formation, completion, queries = [], [], [], []
        for n, (tid, t) in enumerate(self.batches):
            args = {"batch_size": len(t.sample_indices), "samples": sample_list(t.sample_indices), "worker": t.worker}
            queued.append(AsyncSpan("query", t.issued_ns, t.completed_ns, n, args))
            if t.started_ns > t.issued_ns:
                queued.append(AsyncSpan("queue_wait", t.issued_ns, t.started_ns, n, args))
            spans.append(Span("batch", t.started_ns, t.completed_ns, tid, args))
            spans.append(Span("batch_formation", t.started_ns, t.gathered_ns, tid))
            spans.append(Span("complete", t.postprocessed_ns, t.completed_ns, tid))
            waits.append(t.started_ns - t.issued_ns)
            formation.append(t.gathered_ns - t.started_ns)
            completion.append(t.completed_ns - t.postprocessed_ns)
            queries.extend([t.completed_ns - t.issued_ns] * len(t.sample_indices))
        summary: dict[str, Any] = {
            "batches": len(self.batches),
            "samples": sum(len(t.sample_indices) for _, t in self.batches),
            "stages": {"query": stage_stats(queries), "queue_wait": stage_stats(waits),
                       "batch_formation": stage_stats(formation), "complete": stage_stats(completion)},
        }
        if self._device_timed:
            spans += device_spans(self.device_timings)
            summary["stages"]["device_predict"] = stage_stats([t.device_ns for t in self.device_timings])
            summary["device_timing"] = "CUDA events around each predict (the device's clock)"
        else:
            summary["device_timing"] = "off (the backend runs on the CPU)"
        return self._with_loadgen_trace(LevelResult(self.level, "ok", spans=spans, async_spans=queued, summary=summary))

    def _with_loadgen_trace(self, result: LevelResult) -> LevelResult:
        """LoadGen's own spans added, when its trace was on."""
        trace = self.ctx.loadgen_trace
        if trace is not None and trace.is_file():
            lg_spans, lg_async, lg_summary = loadgen_trace.read(trace, self.ctx.anchor)
            result.spans += lg_spans
            result.async_spans += lg_async
            result.summary["loadgen_trace"] = lg_summary
        else:
            result.summary["loadgen_trace"] = {"status": "off",
                                               "reason": "LoadGen's trace is off (--set enable_trace=1 turns it on)"}
        return result


def device_spans(timings: Any) -> list[Span]:
    """Each predict's device time (CUDA events) as a span on the device track, from the host stamp
    taken when its start event was recorded: the device clock's length at the host clock's place."""
    return [Span("device_predict", t.host_start_ns, t.host_start_ns + t.device_ns, t.tid,
                 {"rows": t.rows, "clock": "cuda events"}, "device") for t in timings]
