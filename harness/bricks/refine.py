"""The composed estimate's confidence (mlharness.bricks.compose): the bricks that add most to its interval
take more calls until the interval is within the rule's tolerance of the estimate, or no brick may take
more time. Used for the estimate as executed and for the lower bound of the best variants."""
from __future__ import annotations

from typing import Any

from mlharness.bricks import compose
from mlharness.sut.brick_timing import ConfidenceRule, Sampler, calls_left, median_ci
from mlharness.sut.bricks import Brick


def whole_model_cap(rule: ConfidenceRule) -> float:
    """Seconds of timed calls the whole model may take to reach the rule, and the bricks together."""
    return max(rule.time_cap * 10, 5.0)


def refine(samplers: dict[str, Sampler], fixed: dict[str, dict[str, Any]], bricks: dict[str, Brick], empty: float,
           rule: ConfidenceRule, total_cap: float | None = None) -> float:
    """Extend the samplers until the estimate's 95% half-width (compose.estimate_halfwidth) is within
    rule.tolerance of the estimate; a brick stops taking calls at rule.time_cap seconds of timed calls,
    all of them together at `total_cap` (default whole_model_cap: the cap the whole model is measured with).
    `fixed` are stored measurements (rows), counted in the estimate but not extended.
    Returns the final half-width (ms)."""
    total_cap = whole_model_cap(rule) if total_cap is None else total_cap
    while True:
        current, weights = _terms(samplers, fixed, bricks)
        halfwidth = compose.estimate_halfwidth(current)
        if halfwidth <= rule.tolerance * compose.estimate_from_terms(current, empty):
            return halfwidth
        open_keys = [key for key in weights if samplers[key].timed < rule.time_cap]
        if not open_keys or sum(sampler.timed for sampler in samplers.values()) >= total_cap:
            return halfwidth
        # The brick whose interval, times its multiplicity, weighs most in the estimate's.
        key = max(open_keys, key=lambda k: weights[k])
        sampler = samplers[key]
        sampler.extend(max(1, min(max(rule.min_repeats, len(sampler.times) // 2), calls_left(sampler, rule.time_cap))))


def _terms(samplers: dict[str, Sampler], fixed: dict[str, dict[str, Any]],
           bricks: dict[str, Brick]) -> tuple[list[compose.Term], dict[str, float]]:
    """The estimate's terms as they stand, and each sampled brick's weight in its variance."""
    out, weights = [], {}
    for key, sampler in samplers.items():
        median, low, high = median_ci(sorted(sampler.times))
        out.append(compose.Term(bricks[key].multiplicity, median, low, high))
        weights[key] = (bricks[key].multiplicity * max(median - low, high - median)) ** 2
    for key, row in fixed.items():
        out.append(compose.Term(bricks[key].multiplicity, float(row["median_ms"]),
                                float(row.get("ci_low_ms") or row["median_ms"]),
                                float(row.get("ci_high_ms") or row["median_ms"])))
    return out, weights
