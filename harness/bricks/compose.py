"""Composing a model from its bricks (DLBricks) and its lower bound (Benanza); pure arithmetic on
measured figures, no runtime.

- Estimate: the sum over the model's nodes of its brick's net median (the brick's median less the
  cost of an empty session call, never below 0) plus one empty call (the model is one session call
  too): sum(net_median x multiplicity) + empty.
- Lower bound: the same sum with each brick at its best variant (threads, optimization level,
  execution provider), each variant net of the empty call at its own thread count.
- Error: (estimate - measured) / measured, in percent."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class BrickFigures:
    key: str
    op_type: str
    label: str
    multiplicity: int
    median_ms: float  # as executed
    empty_ms: float  # an empty session call at the as-executed thread count
    best_ms: float | None = None  # best variant's net time, None without variants
    best_variant: str | None = None

    @property
    def net_ms(self) -> float:
        return max(self.median_ms - self.empty_ms, 0.0)

    @property
    def total_ms(self) -> float:
        return self.net_ms * self.multiplicity

    @property
    def lower_ms(self) -> float:
        return (self.net_ms if self.best_ms is None else min(self.best_ms, self.net_ms)) * self.multiplicity


@dataclass(frozen=True)
class Term:
    """One brick in the estimate while it is being measured: multiplicity, median and its 95% CI (ms)."""
    multiplicity: int
    median_ms: float
    low_ms: float
    high_ms: float


def estimate_from_terms(terms: Iterable[Term], empty_ms: float) -> float:
    return sum(max(t.median_ms - empty_ms, 0.0) * t.multiplicity for t in terms) + empty_ms


def estimate_halfwidth(terms: Iterable[Term]) -> float:
    """The 95% half-width of the estimate: each brick's half-width (the larger side of its median's CI)
    times its multiplicity, combined as independent errors (root of the sum of squares)."""
    return math.sqrt(sum((t.multiplicity * max(t.median_ms - t.low_ms, t.high_ms - t.median_ms)) ** 2 for t in terms))


def estimate_ms(bricks: Iterable[BrickFigures], empty_ms: float) -> float:
    """The composed latency of one model call."""
    return sum(b.total_ms for b in bricks) + empty_ms


def lower_bound_ms(bricks: Iterable[BrickFigures], empty_ms: float) -> float:
    """Each brick at its best variant, plus one empty call."""
    return sum(b.lower_ms for b in bricks) + empty_ms


def error_pct(estimate: float, measured: float | None) -> float | None:
    if not measured:
        return None
    return 100.0 * (estimate - measured) / measured


def net_variant_ms(median_ms: float, empty_ms: float) -> float:
    return max(median_ms - empty_ms, 0.0)


def best_variant(variants: Mapping[str, float], empties: Mapping[str, float], threads_of: Mapping[str, str]) -> tuple[str, float] | None:
    """(variant, net ms) of the fastest variant; `threads_of` names each variant's thread count, whose
    empty call is subtracted."""
    best = None
    for name, median in variants.items():
        net = net_variant_ms(median, empties.get(threads_of.get(name, ""), 0.0))
        if best is None or net < best[1]:
            best = (name, net)
    return best


def by_op_type(bricks: Iterable[BrickFigures]) -> list[dict[str, Any]]:
    """Per op type: measured and lower-bound time and share of the model, and the gap; largest first."""
    measured: dict[str, float] = defaultdict(float)
    lower: dict[str, float] = defaultdict(float)
    nodes: dict[str, int] = defaultdict(int)
    for b in bricks:
        measured[b.op_type] += b.total_ms
        lower[b.op_type] += b.lower_ms
        nodes[b.op_type] += b.multiplicity
    total_measured = sum(measured.values()) or 1.0
    total_lower = sum(lower.values()) or 1.0
    rows = [{"op_type": op, "nodes": nodes[op], "measured_ms": measured[op], "lower_bound_ms": lower[op],
             "measured_share": measured[op] / total_measured, "lower_bound_share": lower[op] / total_lower,
             "gap_ms": measured[op] - lower[op]} for op in measured]
    return sorted(rows, key=lambda r: -r["measured_ms"])


def top_bricks(bricks: Iterable[BrickFigures], count: int = 10) -> list[BrickFigures]:
    """The bricks that take the most of the model's time (net median x multiplicity)."""
    return sorted(bricks, key=lambda b: -b.total_ms)[:count]


def time_to_confidence_speedup(whole_seconds: float, brick_seconds: float) -> float | None:
    """How many times less benchmarking time the bricks took than the whole model at equal confidence."""
    return whole_seconds / brick_seconds if brick_seconds > 0 else None
