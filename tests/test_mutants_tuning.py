"""Tests that mutation testing of the tuning module (tools/mutation/modules.toml, [tuning]) asked for:
each fails with the surviving mutant it names applied and passes without. The search's rules as its
documentation states them, on the functions themselves (pure functions of their arguments: no run,
no stand-in)."""
from __future__ import annotations

from mlharness.running import tuning


def test_a_gain_of_exactly_min_gain_is_not_better() -> None:
    """"better by more than MIN_GAIN": 102 against 100 is exactly 2% (as floats too), not more.
    (Search.better with >= for >.)"""
    assert (102.0 - 100.0) / 100.0 == tuning.MIN_GAIN
    assert not tuning.Search("Offline", "offline.samples_per_second", True).better(102.0, 100.0)
    assert tuning.Search("Offline", "offline.samples_per_second", True).better(102.5, 100.0)


def test_a_lower_figure_is_better_by_its_fraction_of_the_best_not_by_its_distance() -> None:
    """Latency (lower is better): 1% below the best is noise whatever the unit; 3% below is a gain.
    (Search.better multiplying by the best's figure where it divides: in nanoseconds, any step down
    looked better.)"""
    search = tuning.Search("SingleStream", "singlestream.p90_latency_ns", False)
    assert not search.better(990_000.0, 1_000_000.0)
    assert search.better(970_000.0, 1_000_000.0)
    assert not search.better(1_030_000.0, 1_000_000.0)


def test_contenders_within_exactly_min_gain_of_the_top_are_tied() -> None:
    """"come within MIN_GAIN of the top score": 1.275 over 1.25 is exactly 1.02 (as floats too), so
    batch 4 at 1.25 is tied with batch 16 at 1.275 and, the smaller batch, kept.
    (parsimonious_choice with < for <=.)"""
    assert 1.275 / 1.25 == 1.0 + tuning.MIN_GAIN
    contenders = [{"max_batch_size": 8}, {"max_batch_size": 16}, {"max_batch_size": 4}]
    assert tuning.parsimonious_choice(contenders, [1.0, 1.275, 1.25]) == 2
    assert tuning.parsimonious_choice(contenders, [1.0, 1.2751, 1.25]) == 1  # past the margin: the top


def test_the_threads_searched_are_one_the_cpu_count_and_the_powers_of_two_below_it_up_to_64() -> None:
    """(dimensions with 2 * k for 2 ** k, which 16 CPUs tell apart: 6 for 8; with range(1, 8), which
    256 CPUs tell apart: 128 is not a candidate.)"""
    def threads(cpus: int) -> list[int]:
        (key, values, ordered), *_ = tuning.dimensions("SingleStream", "null", cpus, {})
        assert key == "intra_op_threads" and ordered
        return values

    assert threads(1) == [1] and threads(2) == [1, 2] and threads(6) == [1, 2, 4, 6]
    assert threads(16) == [1, 2, 4, 8, 16]
    assert threads(256) == [1, 2, 4, 8, 16, 32, 64, 256]


def test_each_scenario_searches_its_dimensions_in_order() -> None:
    """Batch sizes 1 to 64 (Offline, Server), workers 1 and 2 (Offline, Server, MultiStream), ONNX
    Runtime's session options last. (dimensions with 65 for 64, with < for <=, and without
    MultiStream's workers.)"""
    batches = [1, 2, 4, 8, 16, 32, 64]

    def searched(scenario: str, backend: str) -> list[tuple[str, list, bool]]:
        return tuning.dimensions(scenario, backend, 2, {"max_batch_size": 8})

    assert searched("Offline", "onnxruntime") == [
        ("intra_op_threads", [1, 2], True), ("max_batch_size", batches, True), ("workers", [1, 2], True),
        ("graph_optimization", ["all", "extended", "basic"], False), ("execution_mode", ["sequential", "parallel"], False)]
    assert searched("Server", "torch") == [("intra_op_threads", [1, 2], True), ("max_batch_size", batches, True),
                                           ("workers", [1, 2], True)]
    assert searched("MultiStream", "null") == [("intra_op_threads", [1, 2], True), ("workers", [1, 2], True)]
    assert searched("SingleStream", "null") == [("intra_op_threads", [1, 2], True)]
