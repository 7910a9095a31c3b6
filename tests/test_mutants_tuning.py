"""Tests that mutation testing of the tuning module (tools/mutation/modules.toml, [tuning]) asked for:
each fails with the surviving mutant it names applied and passes without. The search's rules as its
documentation states them, on the functions themselves (pure functions of their arguments: no run,
no stand-in)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from mlharness.errors import RunFailed, UserError
from mlharness.records.payloads import Performance
from mlharness.running import tuning
from mlharness.running.request import RunRequest


@dataclass
class _Record:
    """What run_search reads of a run's record (its id and performance summary), as RunRecord has them."""
    run_id: str
    perf: Performance


def _settings_of(request: RunRequest) -> dict[str, str]:
    return dict(item.split("=", 1) for item in request.overrides)


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


def test_the_models_own_batch_size_is_a_candidate_and_the_walk_starts_from_it() -> None:
    """A manifest's max_batch_size of 128 or 48 is searched with the powers of two: the walk goes out from
    it (before, a start off the scale walked up from 1 and 128 was never tried)."""
    def batches(own: int | None) -> list[int]:
        found = dict((key, values) for key, values, _ in tuning.dimensions("Offline", "null", 2,
                                                                           {} if own is None else {"max_batch_size": own}))
        return found["max_batch_size"]

    assert batches(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert batches(48) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batches(None) == batches(1) == [1, 2, 4, 8, 16, 32, 64]
    assert tuning.outward(batches(128), 128) == [[64, 32, 16, 8, 4, 2, 1], []]


def test_an_offline_trial_is_sized_by_the_best_rate_before_it() -> None:
    """An Offline trial's one query is sized by `target_qps`: the highest rate of the trials before it
    (a failed one has none), as six significant figures, or for a configuration run before (the
    confirmation rounds) its own highest rate; the first trial keeps the manifest's. Each
    trial's seconds lie within the search's. (_Trials with the scenario compared wrongly, the rate
    not kept, kept as None, started from 1.0 instead of 0.0 (the rates here are below 1/s); seconds
    as monotonic() + start; the settings said joined by "XX, XX".)"""
    rates = {"1": 0.5, "2": 0.987654321, "4": 0.75}
    seen: list[tuple[str | None, float | None]] = []
    configurations: list[str] = []

    def run_trial(request: RunRequest) -> _Record:
        settings = _settings_of(request)
        value = rates.get(settings["max_batch_size"])
        seen.append((settings.get("target_qps"), value))
        configurations.append(json.dumps({k: v for k, v in settings.items() if k != "target_qps"}, sort_keys=True))
        if value is None:
            raise UserError("run failed: this batch size crashed")
        return _Record(f"run-{len(seen)}", Performance.from_dict({"samples_per_second": value}))

    lines: list[str] = []
    began = time.monotonic()
    search = tuning.run_search(RunRequest(model="m", scenario="Offline"), {"max_batch_size": 1}, "null", 1,
                               run_trial, say=lines.append)
    elapsed = time.monotonic() - began
    assert seen[0] == (None, 0.5) and len(seen) > 5 and any(value is None for _, value in seen)
    for at in range(1, len(seen)):
        own = [value for (_, value), c in zip(seen[:at], configurations) if c == configurations[at] and value]
        best_before = max(own or [value for _, value in seen[:at] if value is not None])
        assert seen[at][0] == f"{best_before:.6g}", (at, seen)
    assert len(set(configurations)) < len(configurations)  # some ran again, on their own rate
    assert "0.987654" in [rate for rate, _ in seen]  # after batch 2's trial
    assert all(0.0 <= trial.seconds <= elapsed for trial in search.trials)
    assert lines[1] == "  trial 2: intra_op_threads=1, max_batch_size=1 -> 0.5 samples_per_second"


def test_each_trial_is_said_in_one_line() -> None:
    """`trial N[ (confirm)]: settings (unset ones left out; none: defaults) -> figure` or the failure.
    (_Trials saying None, no settings, the unset ones only, " (confirm)" never, always, inverted or
    reworded, "defaults" lost, the figure never said.) The start runs with threads unset; one thread
    is a near-equal (within 5%), so the two are confirmed in three rounds; two threads fail, and the
    failed trial keeps the failed run's id (_Trials._attempt dropping the record's run_id)."""
    lines: list[str] = []
    p90 = {None: 1500.0, "1": 1520.0}

    def run_trial(request: RunRequest) -> _Record:
        threads = _settings_of(request).get("intra_op_threads")
        assert "target_qps" not in _settings_of(request)  # SingleStream: only Offline sizes its query
        if threads == "2":
            raise RunFailed("run failed: two threads crashed\nthe rest of the message",
                            _Record("failed-run", Performance.from_dict({})))
        return _Record("run", Performance.from_dict({"p90_latency_ns": p90[threads]}))

    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), {"intra_op_threads": None}, "null",
                               2, run_trial, say=lines.append)
    assert (search.trials[2].status, search.trials[2].run_id) == ("failed", "failed-run")
    start, one = "defaults -> 1,500 p90_latency_ns", "intra_op_threads=1 -> 1,520 p90_latency_ns"
    assert lines == [f"  trial 1: {start}", f"  trial 2: {one}",
                     "  trial 3: intra_op_threads=2 -> failed: run failed: two threads crashed",
                     f"  trial 4 (confirm): {start}", f"  trial 5 (confirm): {one}",
                     f"  trial 6 (confirm): {one}", f"  trial 7 (confirm): {start}",
                     f"  trial 8 (confirm): {start}", f"  trial 9 (confirm): {one}"]


def test_the_start_is_not_run_again_by_an_unordered_dimension_whatever_its_keys_order() -> None:
    """ONNX Runtime's session options are unordered: every value is a candidate, the start's own among
    them, which is not run a second time in the search, though the start's keys are not in sorted order.
    (run_search marking json.dumps(None) as tried, or the start unsorted.)"""
    runs: list[str] = []

    def run_trial(request: RunRequest) -> _Record:
        runs.append(json.dumps(_settings_of(request), sort_keys=True))
        return _Record("run", Performance.from_dict({"p90_latency_ns": 1_000_000.0}))

    start = {"intra_op_threads": 0, "graph_optimization": "all", "execution_mode": "sequential"}
    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), start, "onnxruntime", 1, run_trial,
                               say=lambda _: None)
    searched = runs[:len([t for t in search.trials if t.phase == "search"])]
    # the start, 1 thread, then graph_optimization extended and basic, then execution_mode parallel
    assert len(searched) == 5 and len(set(searched)) == 5


def test_a_run_without_the_objectives_figure_is_a_trial_without_one() -> None:
    """A run whose record has no performance summary, or one without the figure searched on, is a
    trial with status "no figure" and no value; the start stays best. (_Attempt reading a missing
    summary, or calling every trial "ok", or rewording "no figure".)"""
    def run_trial(request: RunRequest) -> _Record:
        threads = _settings_of(request).get("intra_op_threads")
        if threads == "1":
            return _Record("no-summary", None)
        if threads == "2":
            return _Record("other-figure", Performance.from_dict({"samples_per_second": 5.0}))
        return _Record("start", Performance.from_dict({"p90_latency_ns": 1_000_000.0}))

    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), {"intra_op_threads": 0}, "null", 2,
                               run_trial, say=lambda _: None)
    assert [(t.run_id, t.status, t.value) for t in search.trials] == [
        ("start", "ok", 1_000_000.0), ("no-summary", "no figure", None), ("other-figure", "no figure", None)]
    assert search.best is search.start and search.best.run_id == "start"


def test_an_unordered_dimension_tries_every_value_however_many_miss() -> None:
    """"An unordered one tries every value": no plateau ends it. With the session options left out of
    the start, all three graph optimization levels are tried though the first two are no better.
    From "basic" they are tried in their listed order, not outward from it: "all" first, which wins
    the tie with "extended". (walk_dimension walking every dimension outward, or listing None.)"""
    runs: list[dict[str, str]] = []

    def run_trial(request: RunRequest) -> _Record:
        runs.append(_settings_of(request))
        return _Record("run", Performance.from_dict({"p90_latency_ns": 1_000_000.0}))

    tuning.run_search(RunRequest(model="m", scenario="SingleStream"), {"intra_op_threads": 1}, "onnxruntime", 1,
                      run_trial, say=lambda _: None)
    # the start (one thread, the only value on one CPU), the three levels, the two modes
    assert [r.get("graph_optimization") for r in runs[:4]] == [None, "all", "extended", "basic"]
    assert [r.get("execution_mode") for r in runs[4:6]] == ["sequential", "parallel"]

    runs.clear()

    def run_trial_basic_slower(request: RunRequest) -> _Record:
        runs.append(_settings_of(request))
        slow = _settings_of(request)["graph_optimization"] == "basic"
        return _Record("run", Performance.from_dict({"p90_latency_ns": 1_000_000.0 if slow else 950_000.0}))

    start = {"intra_op_threads": 1, "graph_optimization": "basic", "execution_mode": "sequential"}
    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), start, "onnxruntime", 1,
                               run_trial_basic_slower, say=lambda _: None)
    assert [r["graph_optimization"] for r in runs[:3]] == ["basic", "all", "extended"]
    assert search.best.settings["graph_optimization"] == "all"


def test_a_configuration_found_in_one_dimension_is_not_run_again_by_the_next() -> None:
    """One thread wins the threads dimension; the session options' dimensions (unordered: every value)
    then reach that same configuration again, which is not run a second time. (walk_dimension not
    recording what it ran.)"""
    runs: list[str] = []

    def run_trial(request: RunRequest) -> _Record:
        settings = _settings_of(request)
        runs.append(json.dumps(settings, sort_keys=True))
        return _Record("run", Performance.from_dict({"p90_latency_ns": 900_000.0 if settings["intra_op_threads"] == "1"
                                                     else 1_000_000.0}))

    start = {"intra_op_threads": 0, "graph_optimization": "all", "execution_mode": "sequential"}
    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), start, "onnxruntime", 1, run_trial,
                               say=lambda _: None)
    searched = runs[:len([t for t in search.trials if t.phase == "search"])]
    assert search.best.settings["intra_op_threads"] == 1
    assert len(searched) == 5 and len(set(searched)) == 5  # start, 1 thread, extended, basic, parallel


def test_the_best_batch_sizes_neighbours_include_the_smallest_and_leave_out_a_failed_one() -> None:
    """Batch 2 wins from 8: its neighbours 1 (the first of the batch sizes) and 4 are confirmed with it.
    Batch 4 wins from 8 with the start's keys not in sorted order, and batch 2 failed: 2 is left out.
    (batch_neighbours skipping index 0, reading past the end, or keying the failed trials or the
    neighbours unsorted.)"""
    def searched(figures: dict[str, float | None], start: dict[str, int]) -> tuning.Search:
        def run_trial(request: RunRequest) -> _Record:
            settings = {k: v for k, v in _settings_of(request).items() if k != "target_qps"}
            alone = settings.keys() == start.keys() and settings.get("workers", "1") == "1"  # only batch varies
            value = figures.get(settings["max_batch_size"], 50.0) if alone else 50.0
            if value is None:
                raise UserError("run failed: this batch size crashed")
            return _Record("run", Performance.from_dict({"samples_per_second": value}))

        return tuning.run_search(RunRequest(model="m", scenario="Offline"), start, "null", 1, run_trial,
                                 say=lambda _: None)

    two = searched({"8": 100.0, "4": 130.0, "2": 160.0, "1": 120.0}, {"max_batch_size": 8})
    assert [c["settings"] for c in two.confirm_scores] == [{"max_batch_size": 8}, {"max_batch_size": 2},
                                                           {"max_batch_size": 1}, {"max_batch_size": 4}]
    four = searched({"8": 100.0, "4": 130.0, "2": None}, {"workers": 1, "max_batch_size": 8})
    assert four.best.settings == {"workers": 1, "max_batch_size": 4}
    assert [c["settings"]["max_batch_size"] for c in four.confirm_scores] == [8, 4]
    # the largest batch size has one neighbour (batch_neighbours reading past the end)
    largest = searched({"8": 100.0, "16": 110.0, "32": 120.0, "64": 130.0}, {"max_batch_size": 8})
    assert [c["settings"] for c in largest.confirm_scores] == [{"max_batch_size": 8}, {"max_batch_size": 64},
                                                               {"max_batch_size": 32}]


def test_the_runners_up_are_two_configurations_besides_the_start_and_the_best() -> None:
    """Within 5% of the best (970 ns): the start (1000), two threads (1005) and four (1010). The start
    is confirmed anyway; the two runners-up are the other two, not the start or the best again, though
    the start's keys are not in sorted order. (runners_up not counting the start or the best as seen.)"""
    p90 = {"0": 1000.0, "1": 970.0, "2": 1005.0, "4": 1010.0}

    def run_trial(request: RunRequest) -> _Record:
        return _Record("run", Performance.from_dict({"p90_latency_ns": p90[_settings_of(request)["intra_op_threads"]]}))

    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), {"workers": 1, "intra_op_threads": 0},
                               "null", 4, run_trial, say=lambda _: None)
    assert [c["settings"]["intra_op_threads"] for c in search.confirm_scores] == [0, 1, 2, 4]


def test_a_configuration_exactly_five_percent_off_the_best_is_a_runner_up() -> None:
    """"within RUNNER_UP_MARGIN of the best's": 1050 ns against 1000 is exactly 5% (as floats too) and
    is confirmed against the start; 1100 is not. (runners_up with < for <=.)"""
    assert abs(1050.0 - 1000.0) == tuning.RUNNER_UP_MARGIN * 1000.0
    p90 = {"0": 1000.0, "1": 1050.0, "2": 1100.0}

    def run_trial(request: RunRequest) -> _Record:
        return _Record("run", Performance.from_dict({"p90_latency_ns": p90[_settings_of(request)["intra_op_threads"]]}))

    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), {"intra_op_threads": 0}, "null", 2,
                               run_trial, say=lambda _: None)
    assert [c["settings"] for c in search.confirm_scores] == [{"intra_op_threads": 0}, {"intra_op_threads": 1}]
