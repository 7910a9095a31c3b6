"""The Server searches' rate search (bench/qps_search.py), on a predicate with a known threshold: a
bench's highest VALID QPS is only as good as this search. No LoadGen: the predicate stands in for one
Server test (the benches run the real ones)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("qps_search", Path(__file__).resolve().parent.parent / "bench" / "qps_search.py")
qps_search = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qps_search)
highest_passing_rate = qps_search.highest_passing_rate


def below(threshold: float, tried: list[float]):
    def passes(rate: float) -> bool:
        tried.append(rate)
        return rate <= threshold
    return passes


def test_grows_from_the_start_then_bisects_towards_the_threshold() -> None:
    tried: list[float] = []
    low, high = highest_passing_rate(below(30.0, tried), 10.0, factor=2.0, bisections=3)
    assert tried == [10.0, 20.0, 40.0, 30.0, 35.0, 32.5]
    assert (low, high) == (30.0, 32.5)


def test_stops_at_the_cap_without_a_failure() -> None:
    tried: list[float] = []
    assert highest_passing_rate(below(1e9, tried), 10.0, factor=2.0, cap=50.0) == (40.0, None)
    assert tried == [10.0, 20.0, 40.0]


def test_a_failing_start_tries_the_lower_rates_then_bisects_above_the_first_that_passes() -> None:
    tried: list[float] = []
    low, high = highest_passing_rate(below(3.0, tried), 10.0, lower=(5.0, 2.5, 1.0), bisections=1)
    assert tried == [10.0, 5.0, 2.5, 3.75]
    assert (low, high) == (2.5, 3.75)


@pytest.mark.parametrize("lower", [(), (5.0, 2.0)])
def test_nothing_passes(lower: tuple[float, ...]) -> None:
    tried: list[float] = []
    low, high = highest_passing_rate(below(1.0, tried), 10.0, lower=lower)
    assert low is None
    assert high == (lower[-1] if lower else 10.0)
    assert tried == [10.0, *lower]


def test_bisections_stop_once_within_the_tolerance() -> None:
    tried: list[float] = []
    low, high = highest_passing_rate(below(30.0, tried), 10.0, factor=2.0, bisections=10, tolerance=0.1)
    # 20 passes, 40 fails; 30 passes (gap 10 of 40), 35 fails (gap 5 of 35), 32.5 fails: 2.5 <= 3.25, done
    assert tried == [10.0, 20.0, 40.0, 30.0, 35.0, 32.5]
    assert (low, high) == (30.0, 32.5)


@pytest.mark.parametrize("budget, expected", [(2, [10.0, 20.0]), (4, [10.0, 20.0, 40.0, 30.0])])
def test_the_budget_caps_the_tests_in_all(budget: int, expected: list[float]) -> None:
    tried: list[float] = []
    highest_passing_rate(below(30.0, tried), 10.0, factor=2.0, bisections=10, budget=budget)
    assert tried == expected


def test_the_budget_also_caps_the_lower_rates() -> None:
    tried: list[float] = []
    assert highest_passing_rate(below(1.0, tried), 10.0, lower=(5.0, 2.5, 1.25), budget=3) == (None, 2.5)
    assert tried == [10.0, 5.0, 2.5]
