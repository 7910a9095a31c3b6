"""The search for a Server's highest passing rate, shared by the bench scripts that look for one: a
predicate `passes(qps)` runs one Server test (VALID, and whatever else the script asks) and says
whether it passed. Kept free of LoadGen so it is tested on its own (tests/test_bench_search.py)."""
from __future__ import annotations

from typing import Callable


def highest_passing_rate(passes: Callable[[float], bool], start: float, *, factor: float = 1.25,
                         cap: float | None = None, lower: tuple[float, ...] = (), bisections: int = 3,
                         tolerance: float | None = None, budget: int | None = None
                         ) -> tuple[float | None, float | None]:
    """(highest rate that passed, lowest rate that failed above it), either None when none was seen.
    From `start`, multiply by `factor` while the rate passes (never past `cap`); when `start` itself
    fails, try each of `lower` in turn until one passes; then up to `bisections` bisections between the
    highest pass and the lowest failure above it, stopping early once they are within `tolerance` (a
    fraction of the failure). `budget` caps the tests in all (each Server test costs its duration)."""
    low: float | None = None
    high: float | None = None
    tests = 0

    def test(rate: float) -> bool:
        nonlocal tests
        tests += 1
        return passes(rate)

    def spent() -> bool:
        return budget is not None and tests >= budget

    rate = start
    while (cap is None or rate <= cap) and not spent():
        if test(rate):
            low, rate = rate, rate * factor
        else:
            high = rate
            break
    if low is None:
        for rate in lower:
            if spent():
                break
            if test(rate):
                low = rate
                break
            high = rate
    if low is None or high is None:
        return low, high
    for _ in range(bisections):
        if spent() or (tolerance is not None and high - low <= tolerance * high):
            break
        middle = (low + high) / 2
        if test(middle):
            low = middle
        else:
            high = middle
    return low, high
