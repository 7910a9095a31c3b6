"""The composed estimate's confidence (mlharness.bricks.compose): the bricks that add most to its interval
take more calls until the interval is within the rule's tolerance of the estimate, or no brick may take
more time. Used for the estimate as executed and for the lower bound of the best variants.

A stored brick (reused from the results database) is measured again when its interval is the widest
left, the run may measure (`reopen`) and the row had only its first look (`reopenable`): a row stored
by a run whose own estimate needed few calls of it can be too wide for this model's, and before this
rule the loop spent its whole cap extending bricks already narrow (docs/notes/bricks-2026-11-27.md).
The loop also stops once the bricks that may take more calls are together within the tolerance: the
rest of the interval is what cannot be narrowed."""
from __future__ import annotations

import math
from typing import Any, Callable

from mlharness.bricks import compose
from mlharness.sut.brick_timing import ConfidenceRule, Sampler, calls_left, median_ci
from mlharness.sut.bricks import Brick

Reopen = Callable[[str], Sampler]  # brick key -> a new sampler of that stored brick (warmed up, first calls made)


def whole_model_cap(rule: ConfidenceRule) -> float:
    """Seconds of timed calls the whole model may take to reach the rule, and the bricks together."""
    return max(rule.time_cap * 10, 5.0)


def refine(samplers: dict[str, Sampler], fixed: dict[str, dict[str, Any]], bricks: dict[str, Brick], empty: float,
           rule: ConfidenceRule, total_cap: float | None = None, reopen: Reopen | None = None) -> float:
    """Extend the samplers until the estimate's 95% half-width (compose.estimate_halfwidth) is within
    rule.tolerance of the estimate; a brick stops taking calls at rule.time_cap seconds of timed calls,
    all of them together at `total_cap` (default whole_model_cap: the cap the whole model is measured with).
    `fixed` are stored measurements (rows), counted in the estimate; with `reopen`, the widest of them is
    measured again (moved from `fixed` into `samplers`, both changed in place) when it weighs most.
    Returns the final half-width (ms)."""
    total_cap = whole_model_cap(rule) if total_cap is None else total_cap
    while True:
        current, weights = _terms(samplers, fixed, bricks)
        halfwidth = compose.estimate_halfwidth(current)
        target = rule.tolerance * compose.estimate_from_terms(current, empty)
        if halfwidth <= target or sum(sampler.timed for sampler in samplers.values()) >= total_cap:
            return halfwidth
        movable = {key: weight for key, weight in weights.items()
                   if (key in samplers and samplers[key].timed < rule.time_cap)
                   or (key in fixed and reopen is not None and reopenable(fixed[key], rule))}
        if math.sqrt(sum(movable.values())) <= target:
            return halfwidth  # what may take more calls is within the tolerance: the rest cannot narrow
        # The brick whose interval, times its multiplicity, weighs most in the estimate's.
        key = max(movable, key=lambda k: movable[k])
        if key in fixed:
            assert reopen is not None
            del fixed[key]
            samplers[key] = reopen(key)
            continue
        sampler = samplers[key]
        sampler.extend(max(1, min(max(rule.min_repeats, len(sampler.times) // 2), calls_left(sampler, rule.time_cap))))


def reopenable(row: dict[str, Any], rule: ConfidenceRule) -> bool:
    """A stored row that only had its first look (rule.min_repeats calls, the first pass's sample): the
    estimate of the run that stored it did not need more of it. A row a run's estimate refined had its
    chance and is reused as it is, so a model benchmarked twice is measured once."""
    return not row.get("stable") and int(row.get("repeats") or 0) <= rule.min_repeats


def _terms(samplers: dict[str, Sampler], fixed: dict[str, dict[str, Any]],
           bricks: dict[str, Brick]) -> tuple[list[compose.Term], dict[str, float]]:
    """The estimate's terms as they stand, and each brick's weight in its variance (the square of its
    half-width times its multiplicity)."""
    terms: dict[str, compose.Term] = {}
    for key, sampler in samplers.items():
        median, low, high = median_ci(sorted(sampler.times))
        terms[key] = compose.Term(bricks[key].multiplicity, median, low, high)
    for key, row in fixed.items():
        median = float(row["median_ms"])
        terms[key] = compose.Term(bricks[key].multiplicity, median, float(row.get("ci_low_ms") or median),
                                  float(row.get("ci_high_ms") or median))
    weights = {key: (t.multiplicity * max(t.median_ms - t.low_ms, t.high_ms - t.median_ms)) ** 2
               for key, t in terms.items()}
    return list(terms.values()), weights
