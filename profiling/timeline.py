"""The merged timeline: every level's spans in one Chrome trace (opens in Perfetto and
chrome://tracing), on one clock, microseconds after the profile's origin. Spans on one thread are
nested: a span that overruns its parent by less than the clock-alignment tolerance is trimmed to
it (counted in otherData), since frameworks stamp whole microseconds on another clock."""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Iterable

from mlharness.profiling.clock import CLOCK_NAME
from mlharness.profiling.tracer import LevelResult, Span

TIMELINE_SCHEMA_VERSION = 1
ALIGN_TOLERANCE_NS = 20_000
# Process groups in the trace: the real process (harness, model, framework on real thread ids),
# then groups that have their own notion of threads.
TRACKS = {"process": 0, "device": 1, "loadgen": 2, "python": 3, "system": 4, "sequences": 5}
TRACK_LABELS = {"process": "mlharness (harness, model, framework)", "device": "device (framework kernels)",
                "loadgen": "LoadGen trace", "python": "python (pyinstrument samples)", "system": "system",
                "sequences": "LLM sequences (prefill, decode per batch slot; engine steps; scheduler)"}
SORT_INDEX = {"process": 0, "sequences": 1, "device": 2, "loadgen": 3, "python": 4, "system": 5}


def _pid(track: str) -> int:
    base = os.getpid()
    return base if track == "process" else 10_000_000 + TRACKS[track]


def nest(spans: list[tuple[Span, str]]) -> tuple[list[tuple[Span, str, int]], dict[str, int]]:
    """Per (track, tid): sort, then trim children that overrun their parent by <= the tolerance.
    Returns (span, level, end_ns) and counts of trimmed and still-overlapping spans."""
    out: list[tuple[Span, str, int]] = []
    stats = {"trimmed": 0, "max_trim_ns": 0, "overlapping": 0}
    groups: dict[tuple[str, int], list[tuple[Span, str]]] = defaultdict(list)
    for span, level in spans:
        groups[(span.track, span.tid)].append((span, level))
    for items in groups.values():
        items.sort(key=lambda item: (item[0].start_ns, -item[0].end_ns))
        stack: list[int] = []  # open parents' end times
        for span, level in items:
            end = span.end_ns
            while stack and stack[-1] <= span.start_ns:
                stack.pop()
            if stack and end > stack[-1]:
                overrun = end - stack[-1]
                if overrun <= ALIGN_TOLERANCE_NS:
                    end = stack[-1]
                    stats["trimmed"] += 1
                    stats["max_trim_ns"] = max(stats["max_trim_ns"], overrun)
                else:
                    stats["overlapping"] += 1
            stack.append(end)
            out.append((span, level, end))
    return out, stats


def _us(ns: int, origin: int) -> float:
    return round((ns - origin) / 1000, 3)


def build(results: Iterable[LevelResult], origin_ns: int, other: dict[str, Any]) -> dict[str, Any]:
    results = list(results)
    events: list[dict[str, Any]] = []
    thread_names: dict[tuple[int, int], str] = {}
    spans = [(s, r.level) for r in results for s in r.spans]
    nested, nest_stats = nest(spans)
    for span, level, end in nested:
        events.append({"name": span.name, "cat": level, "ph": "X", "ts": _us(span.start_ns, origin_ns),
                       "dur": round((end - span.start_ns) / 1000, 3), "pid": _pid(span.track), "tid": span.tid,
                       **({"args": span.args} if span.args else {})})
    for result in results:
        for a in result.async_spans:
            common = {"name": a.name, "cat": result.level, "id": a.id, "pid": _pid(a.track), "tid": 0}
            events.append({**common, "ph": "b", "ts": _us(a.start_ns, origin_ns), **({"args": a.args} if a.args else {})})
            events.append({**common, "ph": "e", "ts": _us(a.end_ns, origin_ns)})
        for c in result.counters:
            events.append({"name": c.name, "cat": result.level, "ph": "C", "ts": _us(c.ts_ns, origin_ns),
                           "pid": _pid(c.track), "args": c.values})
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    used = {(e["pid"], e.get("tid")) for e in events}
    meta: list[dict[str, Any]] = []
    for track in TRACKS:
        pid = _pid(track)
        if any(p == pid for p, _ in used):
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": TRACK_LABELS[track]}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": SORT_INDEX[track]}})
    for pid, tid in sorted(used, key=lambda k: (k[0], k[1] or 0)):
        if tid is not None and pid == _pid("process"):
            thread_names[(pid, tid)] = _thread_name(tid)
    for result in results:
        thread_names.update({(_pid(track), tid): name for (track, tid), name in result.thread_names.items()})
    meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
             for (pid, tid), name in thread_names.items()]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"schema_version": TIMELINE_SCHEMA_VERSION, "clock": CLOCK_NAME, "origin_ns": origin_ns,
                          "nesting": nest_stats, **other}}


def _thread_name(tid: int) -> str:
    import threading

    for thread in threading.enumerate():
        if thread.native_id == tid:
            return f"{thread.name} ({tid})"
    return f"thread {tid}" + (" (main)" if tid == os.getpid() else "")


def check(trace: dict[str, Any]) -> list[str]:
    """Problems with a timeline: timestamps out of order, spans of one thread that do not nest,
    async spans without an end. Empty when the timeline is sound."""
    problems: list[str] = []
    last = float("-inf")
    open_async: dict[tuple[Any, ...], float] = {}
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    for i, ev in enumerate(trace.get("traceEvents", [])):
        ph = ev.get("ph")
        if ph == "M":
            continue
        ts = float(ev["ts"])
        if ts < last:
            problems.append(f"event {i} ({ev.get('name')}): ts {ts} before the previous {last}")
        last = ts
        if ph == "X":
            if float(ev["dur"]) < 0:
                problems.append(f"event {i} ({ev.get('name')}): negative dur")
            by_thread[(ev["pid"], ev["tid"])].append((ts, ts + float(ev["dur"]), ev["name"]))
        elif ph == "b":
            open_async[(ev["pid"], ev["cat"], ev["name"], ev["id"])] = ts
        elif ph == "e":
            begin = open_async.pop((ev["pid"], ev["cat"], ev["name"], ev["id"]), None)
            if begin is None or begin > ts:
                problems.append(f"event {i} ({ev.get('name')}): async end without a matching begin")
    problems += [f"async span {key[2]} id {key[3]}: no end" for key in open_async]
    for key, spans in by_thread.items():
        stack: list[tuple[float, str]] = []
        for start, end, name in spans:  # already sorted by ts, longest first
            while stack and stack[-1][0] <= start + 1e-6:
                stack.pop()
            if stack and end > stack[-1][0] + 1e-3:
                problems.append(f"pid {key[0]} tid {key[1]}: {name} [{start}, {end}] overlaps {stack[-1][1]} "
                                f"ending {stack[-1][0]}")
            stack.append((end, name))
    return problems
