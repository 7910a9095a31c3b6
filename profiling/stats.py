"""Latency percentiles (nearest rank, as LoadGen reports them) and operator tables."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[int], pct: float) -> int:
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def stage_stats(durations_ns: Iterable[int]) -> dict[str, Any]:
    values = sorted(int(d) for d in durations_ns)
    if not values:
        return {"count": 0}
    stats: dict[str, Any] = {"count": len(values), "mean_ms": round(sum(values) / len(values) / 1e6, 4)}
    for pct in PERCENTILES:
        stats[f"p{pct}_ms"] = round(percentile(values, pct) / 1e6, 4)
    stats["max_ms"] = round(values[-1] / 1e6, 4)
    stats["total_ms"] = round(sum(values) / 1e6, 3)
    return stats


def self_times(spans: Iterable[tuple[int, int, int, Any]]) -> list[tuple[Any, int]]:
    """(tid, start, end, key) spans that nest per thread -> (key, exclusive time) pairs, so nested
    operators (aten::conv2d > aten::convolution > ...) are not counted twice."""
    out: list[tuple[Any, int]] = []
    by_tid: dict[int, list[tuple[int, int, Any]]] = defaultdict(list)
    for tid, start, end, key in spans:
        by_tid[tid].append((start, end, key))
    for items in by_tid.values():
        items.sort(key=lambda s: (s[0], -s[1]))
        stack: list[list[Any]] = []  # [start, end, key, time in direct children]
        for start, end, key in items:
            while stack and stack[-1][1] <= start:
                done = stack.pop()
                out.append((done[2], max(0, done[1] - done[0] - done[3])))
            if stack:
                stack[-1][3] += min(end, stack[-1][1]) - start
            stack.append([start, end, key, 0])
        while stack:
            done = stack.pop()
            out.append((done[2], max(0, done[1] - done[0] - done[3])))
    return out


def top_operators(pairs: Iterable[tuple[str, int]], predict_total_ns: int, limit: int = 15) -> list[dict[str, Any]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for key, ns in pairs:
        totals[key][0] += ns
        totals[key][1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:limit]
    return [{"op": key, "calls": calls, "self_ms": round(ns / 1e6, 3),
             "share_of_predict": round(ns / predict_total_ns, 4) if predict_total_ns else None}
            for key, (ns, calls) in ranked]
