"""The `python` level: pyinstrument's stack sampler on every thread that runs the harness's hot path
(the LoadGen-calling main thread, SUT workers started during the test) and so the user's pre- and
post-processing. Kept as pyinstrument's HTML, drawn as a sampled flame chart, summarised as the
functions that held the most samples."""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any

from mlharness.atomic_io import write_text
from mlharness.profiling.tracer import LevelResult, Span, TraceContext, Tracer

INTERVAL_S = 0.001
MAX_DEPTH = 64
TRACK = "python"


def frame_label(identifier: str) -> tuple[str, str]:
    """pyinstrument's frame identifier "function\\x00file\\x00line[\\x01attributes]" -> (name, where)."""
    parts = identifier.split("\x00")
    name = parts[0]
    where = f"{parts[1]}:{parts[2].split(chr(1))[0]}" if len(parts) > 2 else ""
    return name, where


class PythonTracer(Tracer):
    level = "python"

    @classmethod
    def unavailable(cls, ctx: TraceContext) -> str | None:
        try:
            import pyinstrument.stack_sampler  # noqa: F401
        except ImportError:
            return "pyinstrument is not installed (pip install 'mlharness[profiling]')"
        return None

    def start(self) -> None:
        self.samples: dict[int, list[tuple[int, float, list[str]]]] = {}
        self._active = True
        self._started_wall = time.time()
        self._main_target = self._subscribe()
        threading.setprofile(self._bootstrap)  # threads started during the test subscribe themselves

    def _bootstrap(self, frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        if self._active:
            self._subscribe()

    def _subscribe(self) -> Any:
        from pyinstrument.stack_sampler import get_stack_sampler

        records = self.samples.setdefault(threading.get_native_id(), [])
        clock = time.perf_counter_ns

        def saw(call_stack: list[str], since_last: float, async_state: Any) -> None:
            if self._active:
                records.append((clock(), since_last, call_stack))

        get_stack_sampler().subscribe(saw, desired_interval=INTERVAL_S, use_async_context=False)
        return saw

    def stop(self) -> None:
        from pyinstrument.stack_sampler import get_stack_sampler

        self._active = False
        threading.setprofile(None)
        # Worker threads have ended with the test; the main thread's sampler is removed here.
        get_stack_sampler().unsubscribe(self._main_target)
        self._duration = time.time() - self._started_wall

    def collect(self, window: tuple[int, int]) -> LevelResult:
        spans: list[Span] = []
        leaf_time: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = 0.0
        for tid, records in self.samples.items():
            spans += _flame(tid, records)
            for _, since_last, stack in records:
                total += since_last
                leaf_time[stack[-1]] += since_last
                for ident in set(stack[1:]):
                    inclusive[ident] += since_last
        html = self._write_html()
        top = [{"function": frame_label(i)[0], "where": frame_label(i)[1], "self_ms": round(t * 1e3, 3),
                "share": round(t / total, 4) if total else None} for i, t in leaf_time.most_common(15)]
        user = sum(t for i, t in inclusive.items() if ".yaml:" in frame_label(i)[1])
        summary = {"interval_ms": INTERVAL_S * 1e3, "threads": len(self.samples),
                   "samples": sum(len(r) for r in self.samples.values()), "sampled_ms": round(total * 1e3, 3),
                   "manifest_code_ms": round(user * 1e3, 3), "top_functions": top,
                   "html": html.name if html else None}
        return LevelResult(self.level, "ok", spans=spans, summary=summary, files=[html] if html else [])

    def _write_html(self) -> Any:
        from pyinstrument.renderers import HTMLRenderer
        from pyinstrument.session import Session

        records = [(stack, since_last) for recs in self.samples.values() for _, since_last, stack in recs]
        if not records:
            return None
        session = Session(frame_records=records, start_time=self._started_wall, duration=self._duration,
                          min_interval=INTERVAL_S, max_interval=INTERVAL_S, sample_count=len(records),
                          start_call_stack=["mlharness\x00<profile>\x000"],  # matches no frame: no trimming
                          target_description="mlharness LoadGen test",
                          cpu_time=0.0, sys_path=sys.path, sys_prefixes=Session.current_sys_prefixes())
        path = self.ctx.out_dir / "python.html"
        write_text(path, HTMLRenderer().render(session))
        return path


def _flame(tid: int, records: list[tuple[int, float, list[str]]]) -> list[Span]:
    """Consecutive samples that share a stack prefix become one span per frame: a flame chart
    accurate to the sampling interval. Sample i covers (stamp_i - since_last_i, stamp_i]."""
    spans: list[Span] = []
    open_frames: list[tuple[str, int]] = []  # (identifier, start_ns)
    last_end = 0
    for stamp, since_last, stack in records:
        begin = last_end or stamp - int(since_last * 1e9)
        stack = stack[:MAX_DEPTH]
        common = 0
        while common < min(len(stack), len(open_frames)) and open_frames[common][0] == stack[common]:
            common += 1
        while len(open_frames) > common:
            ident, start = open_frames.pop()
            spans.append(_span(ident, start, begin, tid))
        for ident in stack[common:]:
            open_frames.append((ident, begin))
        last_end = max(stamp, begin)
    while open_frames:
        ident, start = open_frames.pop()
        spans.append(_span(ident, start, max(start, last_end), tid))
    return spans


def _span(identifier: str, start: int, end: int, tid: int) -> Span:
    name, where = frame_label(identifier)
    return Span(name, start, end, tid, {"where": where} if where else {}, TRACK)
