"""LoadGen's own trace (mlperf_log_trace.json, written when LogSettings.enable_trace is on): times
in microseconds after `otherData.ts`, a realtime-clock origin, moved onto the profile clock."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mlharness.profiling.clock import ClockAnchor
from mlharness.profiling.stats import stage_stats
from mlharness.profiling.tracer import AsyncSpan, Span

# LoadGen's query-path spans; its logging and IO-thread spans stay in its own file.
KEPT_SPANS = frozenset({"IssueQuery", "QuerySamplesComplete", "GenerateQueries"})
TRACK = "loadgen"


def _events(text: str) -> tuple[list[dict[str, Any]], int]:
    """LoadGen writes one event per line but does not escape quotes inside args (`"key":""name""`),
    so the file is not valid JSON as a whole: parse it line by line and count what does not parse."""
    events, skipped = [], 0
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if not line.startswith('{"name"'):
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            skipped += 1
    return events, skipped


def read(path: Path, anchor: ClockAnchor) -> tuple[list[Span], list[AsyncSpan], dict[str, Any]]:
    text = path.read_text(errors="replace")
    origin = re.search(r'"otherData"\s*:\s*\{\s*"ts"\s*:\s*([0-9.]+)', text)
    if origin is None:
        return [], [], {"status": "unreadable", "reason": f"{path.name}: no otherData.ts (the trace's time origin)"}
    origin_us = float(origin.group(1))
    raw_events, skipped = _events(text)

    def ns(ts_us: float) -> int:
        return anchor.from_realtime(round((origin_us + float(ts_us)) * 1000))

    spans: list[Span] = []
    begins: dict[int, dict[str, Any]] = {}
    samples: list[AsyncSpan] = []
    for raw in raw_events:
        ph, name = raw.get("ph"), raw.get("name")
        if ph == "X" and name in KEPT_SPANS:
            start = ns(raw["ts"])
            spans.append(Span(name, start, start + round(float(raw["dur"]) * 1000), int(raw.get("tid", 0)),
                              {}, TRACK))
        elif name == "Sample" and ph == "b":
            begins[int(raw["id"])] = raw
        elif name == "Sample" and ph == "e" and int(raw["id"]) in begins:
            begin = begins.pop(int(raw["id"]))
            args = {k: begin.get("args", {}).get(k) for k in ("sample_idx", "query_seq")}
            samples.append(AsyncSpan("loadgen_sample", ns(begin["ts"]), ns(raw["ts"]), int(raw["id"]), args, TRACK))
    summary = {"status": "ok", "file": path.name, "spans": len(spans), "unparsed_lines": skipped,
               "sample_latency": stage_stats(s.end_ns - s.start_ns for s in samples)}
    return spans, samples, summary
