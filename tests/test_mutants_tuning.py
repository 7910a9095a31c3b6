"""Tests that mutation testing of the tuning module (tools/mutation/modules.toml, [tuning]) asked for:
each fails with the surviving mutant it names applied and passes without. The search's rules as its
documentation states them, on the functions themselves (pure functions of their arguments: no run,
no stand-in). Then what only slow end-to-end tests reached: the starting configuration, a trial's run
request and description, the tuned configuration's key, lookup, note and table text (mlharness.running.
tuned), each alone with the shipped manifests and a real results database; and `tune` itself, in a
real Offline tune of a null-backend model that works in its first two runs only, pinned to one CPU:
the start (two runs, --repeats' default), then one thread, batch sizes 64 and 32 and two workers, each
failing; nothing to confirm, nothing timing-dependent.
One test reads all that tune said, returned, stored and drew: mutation testing runs, for a mutant, only
the tests that called its function, so a tune shared by a module fixture would be checked by the first
test alone."""
from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterator

import pytest

from mlharness.errors import RunFailed, UserError
from mlharness.records.payloads import Performance
from mlharness.running import tuned, tuning
from mlharness.running.request import RunRequest
from mlharness.specs.index import SpecIndex
from mlharness.specs.manifests import load_manifest
from mlharness.store.result_store import ResultStore
from mlharness.store.schema import SCHEMA_VERSION
from tests.support import REPO, null_model_with, sha256, write_manifest

INDEX = SpecIndex(REPO / "specs")


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


def test_a_confirmation_round_runs_each_contender_once_whatever_the_repeats() -> None:
    """--repeats 2: each searched configuration runs twice (its best counts); the confirmation, in
    max(CONFIRM_ROUNDS, repeats) = 3 rounds, runs the start and its near-equal (one thread, 1% faster)
    once each a round. (_Trials running a confirmation trial `repeats` times.)"""
    calls: list[str] = []

    def run_trial(request: RunRequest) -> _Record:
        calls.append(_settings_of(request)["intra_op_threads"])
        return _Record("run", Performance.from_dict({"p90_latency_ns": 1000.0 if calls[-1] == "0" else 990.0}))

    search = tuning.run_search(RunRequest(model="m", scenario="SingleStream"), {"intra_op_threads": 0}, "null", 1,
                               run_trial, say=lambda _: None, repeats=2)
    assert calls == ["0", "0", "1", "1", "0", "1", "1", "0", "0", "1"]
    assert [t.phase for t in search.trials] == ["search"] * 2 + ["confirm"] * 6


def test_an_offline_configuration_run_again_is_sized_by_its_best_rate_not_its_last() -> None:
    """The start ran at 100/s, then at 50/s in its first confirmation run (a slow spell): its later
    runs are still sized to 100/s, its best. (_Trials keeping a configuration's last rate.)"""
    start_rates = iter([100.0, 50.0, 100.0, 100.0])
    start_sized: list[str | None] = []

    def run_trial(request: RunRequest) -> _Record:
        settings = _settings_of(request)
        rate = settings.pop("target_qps", None)
        if settings == {"max_batch_size": "1"}:
            start_sized.append(rate)
            value = next(start_rates)
        else:  # batch 2 within 5% of the start (a runner-up, and its neighbour); the rest far behind
            value = 99.0 if settings == {"max_batch_size": "2"} else 10.0
        return _Record("run", Performance.from_dict({"samples_per_second": value}))

    search = tuning.run_search(RunRequest(model="m", scenario="Offline"), {"max_batch_size": 1}, "null", 1,
                               run_trial, say=lambda _: None)
    assert [c["settings"] for c in search.confirm_scores] == [{"max_batch_size": 1}, {"max_batch_size": 2}]
    assert start_sized == [None, "100", "100", "100"]


# ---- the starting configuration, a trial's run and description ------------------------------------

def test_the_search_starts_where_an_untuned_run_does(tmp_path: Path) -> None:
    """Threads 0 (the framework's own) everywhere; the manifest's batch size in Offline and Server (1
    without one); the harness's one worker in Offline, Server and MultiStream; ONNX Runtime's session
    options at its defaults. (starting_settings with a scenario or backend compared wrongly, the batch
    size defaulting to another number, threads or the options' values changed.)"""
    null = INDEX.find("model", "null")  # max_batch_size 1024
    assert tuning.starting_settings(null, "null", "SingleStream") == {"intra_op_threads": 0}
    assert tuning.starting_settings(null, "null", "MultiStream") == {"intra_op_threads": 0, "workers": 1}
    for scenario in ("Offline", "Server"):
        assert tuning.starting_settings(null, "torch", scenario) == {"intra_op_threads": 0, "max_batch_size": 1024,
                                                                     "workers": 1}
    assert tuning.starting_settings(null, "onnxruntime", "SingleStream") == {
        "intra_op_threads": 0, "graph_optimization": "all", "execution_mode": "sequential"}
    assert tuning.starting_settings(null, "onnxruntime", "Offline") == {
        "intra_op_threads": 0, "max_batch_size": 1024, "workers": 1, "graph_optimization": "all",
        "execution_mode": "sequential"}
    text = (REPO / "specs" / "models" / "null.yaml").read_text().replace("  max_batch_size: 1024\n", "")
    unbatched = load_manifest(write_manifest(tmp_path, "m.yaml", text), "model")
    assert tuning.starting_settings(unbatched, "null", "Server") == {"intra_op_threads": 0, "max_batch_size": 1,
                                                                     "workers": 1}


def test_a_trial_is_described_whole_with_its_seconds_to_the_millisecond() -> None:
    """What tune returns and stores of each trial. (Trial.describe with a key renamed or a field
    dropped, the seconds rounded to another number of places.)"""
    trial = tuning.Trial({"workers": 2}, 88.5, "run-1", "failed", "it broke", 1.23456, "confirm")
    assert trial.describe() == {"settings": {"workers": 2}, "value": 88.5, "run_id": "run-1", "status": "failed",
                                "error": "it broke", "seconds": 1.235, "phase": "confirm"}
    assert tuning.Trial({}, None, None, "no figure").describe() == {
        "settings": {}, "value": None, "run_id": None, "status": "no figure", "error": None, "seconds": 0.0,
        "phase": "search"}


def test_a_trials_run_is_the_tunes_request_with_its_settings_recording_the_run_that_repeats_it() -> None:
    """The trial's settings after the tune's own overrides; its command is the `mlharness run` line
    (with the environment settings it carries), not the tune's. (trial_request dropping either
    overrides, or keeping the base's command.)"""
    base = RunRequest(model="null", scenario="Offline", overrides=("min_duration=1",), use_tuned=False,
                      handoff="python", command="mlharness tune null --scenario Offline")
    assert tuning.trial_request(base, ["max_batch_size=8", "workers=2"]) == replace(
        base, overrides=("min_duration=1", "max_batch_size=8", "workers=2"),
        command="MLHARNESS_HANDOFF=python mlharness run null --scenario Offline --mode performance "
                "--set min_duration=1 --set max_batch_size=8 --set workers=2 --no-tuned")


def test_a_configurations_identity_is_its_settings_as_json_in_key_order() -> None:
    """(settings_key without sort_keys.)"""
    assert tuning.settings_key({"workers": 2, "max_batch_size": None, "intra_op_threads": 0}) == \
        '{"intra_op_threads": 0, "max_batch_size": null, "workers": 2}'


# ---- mlharness.running.tuned: the key, lookup, the note, the table's text ---------------------------

def test_the_software_key_is_the_backend_loadgens_version_and_the_frameworks_own() -> None:
    """JSON: the backend, LoadGen's version and, for ONNX Runtime and torch, that package's version
    under its own name (null when not installed); other packages do not count. (software_key with a
    key renamed, another package's version, or the framework's left out.)"""
    versions = {"mlcommons-loadgen": "6.0.17", "onnxruntime": "1.20.1", "torch": "2.5.0", "numpy": "2.1.0"}
    assert tuned.software_key("onnxruntime", versions) == \
        '{"backend": "onnxruntime", "loadgen": "6.0.17", "onnxruntime": "1.20.1"}'
    assert tuned.software_key("torch", versions) == '{"backend": "torch", "loadgen": "6.0.17", "torch": "2.5.0"}'
    assert tuned.software_key("null", versions) == '{"backend": "null", "loadgen": "6.0.17"}'
    assert tuned.software_key("torch", {}) == '{"backend": "torch", "loadgen": null, "torch": null}'


def test_the_tuning_key_is_the_model_by_name_and_sha256_the_system_backend_software_and_scenario() -> None:
    """(tuning_key with a key renamed or another field's value under it.)"""
    null = INDEX.find("model", "null")
    assert tuned.tuning_key(null, "box_2c", "onnxruntime", {"mlcommons-loadgen": "6.0.17", "onnxruntime": "1.2"},
                            "Server") == {
        "model": "null", "model_sha256": sha256(null.path), "system_name": "box_2c", "backend": "onnxruntime",
        "software": '{"backend": "onnxruntime", "loadgen": "6.0.17", "onnxruntime": "1.2"}', "scenario": "Server"}


def test_lookup_reads_the_configuration_stored_under_its_key_and_nothing_else(tmp_path: Path) -> None:
    """No database, another key, a file that is not a database or one at another schema version: no
    tuning (None), and the run goes on. (lookup returning the store, reading a missing database, or
    letting a damaged one's error out.)"""
    key = {"model": "null", "model_sha256": "abc", "system_name": "box_2c", "backend": "null",
           "software": '{"backend": "null", "loadgen": "6.0.17"}', "scenario": "Offline"}
    assert tuned.lookup(tmp_path, key) is None
    with ResultStore(tmp_path / "mlharness.sqlite") as store:
        store.put_tuned(key, {"workers": 2}, "offline.samples_per_second", 88.5, [{"status": "ok"}], "tune-1",
                        "2026-01-01T00:00:00+00:00")
    assert tuned.lookup(tmp_path, key) == {**key, "settings": {"workers": 2},
                                           "figure_name": "offline.samples_per_second", "figure_value": 88.5,
                                           "trials": [{"status": "ok"}], "tuning_id": "tune-1",
                                           "created_at": "2026-01-01T00:00:00+00:00"}
    assert tuned.lookup(tmp_path, dict(key, scenario="Server")) is None
    older = sqlite3.connect(tmp_path / "mlharness.sqlite")
    older.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    older.close()
    assert tuned.lookup(tmp_path, key) is None
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "mlharness.sqlite").write_bytes(b"not a results database\n" * 100)
    assert tuned.lookup(damaged, key) is None


def test_the_untuned_note_names_the_model_scenario_and_system_and_the_command_that_tunes_it() -> None:
    assert tuned.untuned_note("resnet50-light", "Server", "box_2c") == (
        "note: resnet50-light is untuned for Server on this system (box_2c); `mlharness tune resnet50-light "
        "--scenario Server` searches its batch size, threads and session options and later runs here start from "
        "what it finds")


def test_a_stored_trials_status_marks_a_confirmation_run() -> None:
    """(trial_status marking every trial, none, or reworded.)"""
    assert tuned.trial_status({"status": "ok", "phase": "confirm"}) == "ok (confirm)"
    assert tuned.trial_status({"status": "failed", "phase": "search"}) == "failed"
    assert tuned.trial_status({"status": "ok"}) == "ok"  # stored before trials had a phase


def test_tuned_settings_are_shown_as_key_equals_value_sorted_by_key() -> None:
    """(settings_text unsorted, joined otherwise.)"""
    assert tuned.settings_text({"workers": 2, "intra_op_threads": 0, "max_batch_size": 8}) == \
        "intra_op_threads=0, max_batch_size=8, workers=2"
    assert tuned.settings_text({}) == ""


# ---- tune: real tunes ------------------------------------------------------------------------------

# The null model's preprocess, working in the first two runs' processes only: each process leaves a
# mark named by its id, and fails on its first sample once two others have left theirs.
WORKS_TWICE = '''import os

import numpy as np

MARKS = {marks!r}
os.makedirs(MARKS, exist_ok=True)
open(os.path.join(MARKS, str(os.getpid())), "a").close()
WORKS = len([mark for mark in os.listdir(MARKS) if mark != str(os.getpid())]) < 2


def preprocess(sample, ctx):
    if not WORKS:
        raise RuntimeError("this model runs twice")
    return np.array([sample], dtype=np.float32)
'''
SHORT = ("min_duration=1", "min_query_count=1")  # a trial of a few queries


@contextlib.contextmanager
def _stderr_into(path: Path) -> Iterator[None]:
    """sys.stderr and file descriptor 2 (which the runs' processes inherit) into `path`."""
    with open(path, "w") as sink, contextlib.redirect_stderr(sink):
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def _on_one_cpu() -> Iterator[None]:
    """This process (and the runs it starts) on one of its CPUs: the only thread count searched is 1."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _failure(record: Any, why: str) -> str:
    """A failed run's error as the run says it, first line."""
    return (f"run failed: sample 0: preprocess raised RuntimeError: {why} (logs kept in {record.results_path}); "
            f"traceback in {record.results_path}/traceback.txt")


def test_a_tune_says_returns_stores_and_draws_its_search_and_runs_each_trial_quietly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One Offline tune with --repeats' default (2), on one CPU, with the progress display on and drawn
    every 10 ms, of a model whose first two runs work: the start (the manifest's batch size 1024, one
    worker) runs twice (its better run counts); one thread, batch 64 and 32 (a plateau) and two workers
    fail (once each: a failure is not retried); nothing near the start, so nothing to confirm.
    Everything here reads that one tune: mutation testing selects by the tests that call a function,
    so the tune is not shared by a fixture between tests. (tune's say lines reworded or naming other
    fields; a returned or stored field renamed, dropped or another's value; the start taken from
    another model or scenario; the unset settings kept or the set ones dropped; repeats defaulting to
    another number; trials run without quiet; the ticker labelled or counted otherwise, the run
    numbered wrong, the count not kept.)"""
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    monkeypatch.setenv("MLHARNESS_PROGRESS_INTERVAL", "0.01")
    model = null_model_with(tmp_path / "models", preprocess=WORKS_TWICE.format(marks=str(tmp_path / "marks")))
    results, said = tmp_path / "results", []
    with _on_one_cpu(), _stderr_into(tmp_path / "stderr.txt"):
        found = tuning.tune(RunRequest(model=str(model), scenario="Offline", overrides=SHORT,
                                       results_dir=results, use_tuned=False), say=said.append)
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        runs = sorted((store.record_of(row) for row in store.list_runs()), key=lambda r: r.run_id)  # in run order
        (listed,) = store.list_tuned()
        stored = store.get_tuned(found["key"])

    # Each trial is runs of its own: the start's two, then the others', each recorded with the `mlharness
    # run` line that repeats it: the tune's request (no tuned layer), the trial's settings and, after the
    # first, its one query sized by the best rate so far (the start's).
    start = max(runs[:2], key=lambda r: r.perf.figure("samples_per_second"))
    value, system = start.perf.figure("samples_per_second"), start.system_name
    command = (f"mlharness run {model} --scenario Offline --mode performance --set min_duration=1 --set "
               "min_query_count=1 --set intra_op_threads={} --set max_batch_size={} --set workers={}{} --no-tuned")
    sized = f" --set target_qps={value:.6g}"
    tried = [(0, 1024, 1), (1, 1024, 1), (0, 64, 1), (0, 32, 1), (0, 1024, 2)]
    assert [(r.status, r.command) for r in runs] == [
        ("ok", command.format(0, 1024, 1, "")), ("ok", command.format(0, 1024, 1, "")),
        *(("failed", command.format(*t, sized)) for t in tried[1:])]
    errors = [_failure(r, "this model runs twice") for r in runs[2:]]

    assert said == [f"tuning null (null) Offline on {system}: a coordinate search in short runs",
                    f"  trial 1: intra_op_threads=0, max_batch_size=1024, workers=1 -> {value:,.4g} samples_per_second",
                    *(f"  trial {i}: intra_op_threads={t}, max_batch_size={b}, workers={w} -> failed: {error}"
                      for i, (t, b, w), error in zip(range(2, 6), tried[1:], errors))]

    # What it returns: the key (this model file's sha256, this system, the backend, LoadGen's version),
    # the best (the start, with its better run's figure), every trial, no confirmation.
    seconds = [t["seconds"] for t in found["trials"]]
    assert all(isinstance(s, float) and s > 0 for s in seconds)
    assert re.fullmatch(r"\d{8}T\d{12}Z-[0-9a-f]{6}", found["tuning_id"])
    key = {"model": "null", "model_sha256": sha256(model), "system_name": system, "backend": "null",
           "software": json.dumps({"backend": "null", "loadgen": version("mlcommons-loadgen")}), "scenario": "Offline"}
    best = {"intra_op_threads": 0, "max_batch_size": 1024, "workers": 1}
    trials = [{"settings": best, "value": value, "run_id": start.run_id, "status": "ok", "error": None,
               "seconds": seconds[0], "phase": "search"},
              *({"settings": {"intra_op_threads": t, "max_batch_size": b, "workers": w}, "value": None,
                 "run_id": record.run_id, "status": "failed", "error": error, "seconds": took, "phase": "search"}
                for (t, b, w), record, error, took in zip(tried[1:], runs[2:], errors, seconds[1:]))]
    assert found == {"key": key, "settings": best, "figure": "offline.samples_per_second", "value": value,
                     "start_value": value, "trials": trials, "confirm_scores": [], "confirmed_gain": None,
                     "tuning_id": found["tuning_id"]}

    # What it stores, under that key, in the results directory's database, where later runs look it up.
    assert stored is not None and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", stored["created_at"])
    assert stored == {**key, "settings": best, "figure_name": "offline.samples_per_second", "figure_value": value,
                      "trials": trials, "tuning_id": found["tuning_id"], "created_at": stored["created_at"]}
    assert listed["tuning_id"] == found["tuning_id"] and tuned.lookup(results, key) == stored

    # What it draws: only its own progress, `[progress] tune MODEL SCENARIO: N trials, elapsed ...,
    # ETA ?, trial N+1 running for ...`, each run drawn while it ran (its "trials" count runs: the
    # start's two are its trials 1 and 2); none of a run's own ("[run]" plan lines: the runs are quiet).
    drawn = re.compile(r"\[progress\] tune null Offline: (\d) trials, elapsed \d+:\d\d, ETA \?"
                       r"(?:, trial (\d) running for \d+:\d\d)?")
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    assert not [line for line in lines if line.startswith("[run]")], lines
    progress = [line for line in lines if line.startswith("[progress]")]
    assert progress and all(drawn.fullmatch(line) for line in progress), progress
    running = {(int(m[1]), int(m[2])) for m in map(drawn.fullmatch, progress) if m and m[2]}
    assert running == {(done, done + 1) for done in range(6)}


def test_a_quiet_tune_draws_nothing_and_one_whose_start_fails_stores_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--quiet turns the display off though the environment has it on. A tune whose starting
    configuration fails says so, in one line, and stores no configuration; what it says goes to
    stdout unless told otherwise. (tune's quiet as `--quiet and the environment`, its say defaulting to
    something else than print.)"""
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    monkeypatch.setenv("MLHARNESS_PROGRESS_INTERVAL", "0.01")
    model = null_model_with(tmp_path, preprocess="def preprocess(sample, ctx):\n    raise RuntimeError('never')\n")
    with pytest.raises(UserError) as caught:
        tuning.tune(RunRequest(model=str(model), scenario="SingleStream", overrides=SHORT, results_dir=tmp_path / "r",
                               use_tuned=False, quiet=True))
    out, err = capfd.readouterr()
    assert err == ""
    with ResultStore(tmp_path / "r" / "mlharness.sqlite", create=False) as store:
        assert store.list_tuned() == []
        (row,) = store.list_runs()
        record = store.record_of(row)
    error = _failure(record, "never")
    assert str(caught.value) == f"tune: the starting configuration failed: {error}"
    assert out == (f"tuning null (null) SingleStream on {record.system_name}: a coordinate search in short runs\n"
                   f"  trial 1: intra_op_threads=0 -> failed: {error}\n")
