"""The `model` level: the manifest's stages. Preprocess (and the dataset's load) per sample as
LoadQuerySamples runs them, predict and postprocess per batch with its size and sample indices."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from mlharness.profiling.harness_tracer import sample_list
from mlharness.profiling.stats import stage_stats
from mlharness.profiling.tracer import LevelResult, Span, Tracer


def _timed(func: Callable[[Any, Any], Any], log: list[tuple[int, int, int]]) -> Callable[[Any, Any], Any]:
    def timed(raw: Any, ctx: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return func(raw, ctx)
        finally:
            log.append((threading.get_native_id(), start, time.perf_counter_ns()))
    return timed


class ModelTracer(Tracer):
    level = "model"

    @classmethod
    def unavailable(cls, ctx: Any) -> str | None:
        if getattr(ctx.runtime, "generative", False):
            return ("a generative model has no manifest stages to time; its prefill and decode per sequence are "
                    "in the harness level")
        return None

    def start(self) -> None:
        self.batches: list[tuple[int, Any]] = []
        self.preprocessed: list[tuple[int, int, int]] = []
        self.loaded: list[tuple[int, int, int]] = []
        # The user's per-sample functions are wrapped only while profiling; the SUT is untouched.
        staged = self.ctx.runtime.staged
        self._originals = (staged.preprocess, staged.load_raw)
        if staged.preprocess is not None:
            staged.preprocess = _timed(staged.preprocess, self.preprocessed)
        if staged.load_raw is not None:
            staged.load_raw = _timed(staged.load_raw, self.loaded)

    def stop(self) -> None:
        staged = self.ctx.runtime.staged
        staged.preprocess, staged.load_raw = self._originals

    def batch(self, times: Any) -> None:
        self.batches.append((threading.get_native_id(), times))

    def collect(self, window: tuple[int, int]) -> LevelResult:
        spans = [Span("load", start, end, tid) for tid, start, end in self.loaded]
        spans += [Span("preprocess", start, end, tid) for tid, start, end in self.preprocessed]
        for tid, t in self.batches:
            args = {"batch_size": len(t.sample_indices), "samples": sample_list(t.sample_indices)}
            spans.append(Span("predict", t.gathered_ns, t.predicted_ns, tid, args))
            spans.append(Span("postprocess", t.predicted_ns, t.postprocessed_ns, tid, args))
        sizes = [len(t.sample_indices) for _, t in self.batches]
        summary = {
            "batches": len(self.batches),
            "mean_batch_size": round(sum(sizes) / len(sizes), 3) if sizes else 0,
            "predict_total_ms": round(sum(t.predicted_ns - t.gathered_ns for _, t in self.batches) / 1e6, 3),
            "stages": {
                "load": stage_stats(end - start for _, start, end in self.loaded),
                "preprocess": stage_stats(end - start for _, start, end in self.preprocessed),
                "predict": stage_stats(t.predicted_ns - t.gathered_ns for _, t in self.batches),
                "postprocess": stage_stats(t.postprocessed_ns - t.predicted_ns for _, t in self.batches),
            },
        }
        if not self.loaded:
            del summary["stages"]["load"]
        return LevelResult(self.level, "ok", spans=spans, summary=summary)
