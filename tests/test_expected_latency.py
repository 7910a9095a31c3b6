"""A model manifest's expected latency comes from some machine; on a faster one LoadGen would run out
of pre-generated SingleStream/MultiStream queries (an error, so a failed run). The warm-up's measured
latency replaces a figure it beats by more than half; a figure the user set is kept."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlharness.running.resolve import expect_measured_latency
from mlharness.running.settings import Settings
from tests.support import REPO, run_cli


def slow_hint_null(folder: Path) -> Path:
    """The null model, expecting 10 ms a query: thousands of times slower than it answers."""
    text = (REPO / "specs" / "models" / "null.yaml").read_text()
    text = text.replace("SingleStream: {target_latency: 0.002}", "SingleStream: {target_latency: 10}")
    text = text.replace("MultiStream: {target_latency: 0.004}", "MultiStream: {target_latency: 10}")
    assert "{target_latency: 10}" in text and "SingleStream: {target_latency: 10}" in text and "MultiStream: {target_latency: 10}" in text
    path = folder / "null-slow-hint.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("scenario", ["SingleStream", "MultiStream"])
def test_warm_up_replaces_an_expected_latency_it_beats(tmp_path: Path, scenario: str) -> None:
    results = tmp_path / "results"
    assert run_cli("run", slow_hint_null(tmp_path), "--scenario", scenario, "--quick", "--results-dir", results) == 0
    record = json.loads(next(results.glob(f"*/null/{scenario}/run.json")).read_text())
    settings = record["settings"]
    assert settings["origin"]["target_latency"] == "measured" and "measured" in settings["layers"]
    assert float(settings["loadgen"]["target_latency"]) < 5
    assert not record["loadgen"]["performance"]["errors"]


def test_an_expected_latency_the_user_set_is_kept(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    code = run_cli("run", slow_hint_null(tmp_path), "--scenario", "SingleStream", "--quick",
                   "--set", "target_latency=10", "--results-dir", results)
    err = capfd.readouterr().err
    # LoadGen runs out of generated queries: its error fails the run, in one line.
    assert code == 1 and "Ran out of generated queries" in err and len(err.strip().splitlines()) == 1
    record = json.loads(next(results.glob("*/null/SingleStream/failed-*/run.json")).read_text())
    assert record["settings"]["origin"]["target_latency"] == "cli"


def test_the_fastest_warm_up_query_sets_the_expectation_not_the_mean() -> None:
    """A warm-up of 10 batches of 4 took 1 s, one stall included, and its fastest batch 2 ms: the run
    answers at the fast pace, so the expectation is half the fastest sample (0.25 ms), not half the
    mean (12.5 ms), which would leave LoadGen short of queries."""
    settings = Settings("SingleStream", "PerformanceOnly", "null")
    settings.set("target_latency", 100, "model", "the manifest")
    cold_start = {"warmup": {"queries": 10, "samples": 40, "seconds": 1.0, "batch_size": 4, "fastest_query_seconds": 0.002}}
    expect_measured_latency(settings, cold_start, "SingleStream")
    assert settings.origin["target_latency"] == "measured" and float(settings.loadgen["target_latency"]) == 0.25
