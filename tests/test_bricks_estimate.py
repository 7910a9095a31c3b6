"""`mlharness bricks MODEL --estimate-only` (issue 39, item 3) with real ONNX Runtime on a small user
graph: the model composed from the bricks stored for this system, measuring nothing when they are all
stored; a missing brick named in one line with a non-zero exit; `--measure-missing` measuring only it."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import run_cli
from tests.test_bricks import _bricks_json, _bricks_runs, _user_model, tiny_graph

FAST = ("--time-cap", "0.05", "--no-variants", "--quiet")


def _stored_keys(results: Path) -> list[str]:
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        return [row[0] for row in store.conn.execute("SELECT brick_key FROM brick_measurements ORDER BY brick_key")]


def test_estimate_only_composes_from_stored_bricks_names_what_is_missing_and_measures_only_that(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    manifest = _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"))
    results = tmp_path / "results"
    assert run_cli("bricks", manifest, "--results-dir", results, "--no-measure", *FAST) == 0
    measured = _bricks_json(_bricks_runs(results)[-1])
    stored = _stored_keys(results)
    assert "empty-call" in stored and len(stored) == measured["summary"]["unique_bricks"] + 1

    # Everything stored: the same composition as the run that measured the bricks, nothing measured.
    capfd.readouterr()
    assert run_cli("bricks", manifest, "--results-dir", results, "--estimate-only", *FAST) == 0
    out = capfd.readouterr().out
    composed = _bricks_json(_bricks_runs(results)[-1])
    summary = composed["summary"]
    assert summary["estimate_only"] and summary["new_measurements"] == summary["measured_bricks"] == 0
    assert summary["estimate_ms"] == pytest.approx(measured["summary"]["estimate_ms"], rel=1e-12)
    assert summary["empty_call_ms"] == pytest.approx(measured["summary"]["empty_call_ms"], rel=1e-12)
    assert {b["key"]: b["median_ms"] for b in composed["bricks"]} == {b["key"]: b["median_ms"] for b in measured["bricks"]}
    assert "0 new measurements" in out
    assert not list(results.glob("*/tiny-onnx/SingleStream/runs/*"))  # no LoadGen run of the model whole
    assert _stored_keys(results) == stored

    # One brick forgotten: named in one line (label, multiplicity, key), non-zero exit, nothing measured.
    shared = max(measured["bricks"], key=lambda b: b["multiplicity"])
    with sqlite3.connect(results / "mlharness.sqlite") as db:
        db.execute("DELETE FROM brick_measurements WHERE brick_key = ?", (shared["key"],))
    runs_before = len(_bricks_runs(results))
    assert run_cli("bricks", manifest, "--results-dir", results, "--estimate-only", *FAST) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mlharness: error: ")
    assert (f"tiny-onnx: --estimate-only: 1 of {len(measured['bricks'])} bricks are not stored for this system" in err
            and f"{shared['label']} (x{shared['multiplicity']}, key {shared['key']})" in err
            and "--measure-missing" in err)
    assert len(_bricks_runs(results)) == runs_before

    # --measure-missing: that brick, and only it, is measured, stored again, and the estimate composed.
    assert run_cli("bricks", manifest, "--results-dir", results, "--estimate-only", "--measure-missing", *FAST) == 0
    again = _bricks_json(_bricks_runs(results)[-1])
    assert (again["summary"]["measured_bricks"], again["summary"]["new_measurements"]) == (1, 1)
    assert [b["key"] for b in again["bricks"] if not b["reused"]] == [shared["key"]]
    assert _stored_keys(results) == stored
    others = {b["key"]: b["median_ms"] for b in again["bricks"] if b["reused"]}
    assert others == {b["key"]: b["median_ms"] for b in measured["bricks"] if b["key"] != shared["key"]}


def test_estimate_only_on_an_empty_database_names_the_empty_call_and_counts_the_rest(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    manifest = _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"))
    assert run_cli("bricks", manifest, "--results-dir", tmp_path / "r", "--estimate-only", *FAST) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert "bricks and the empty call are not stored for this system" in err and "the empty session call; " in err
    # The empty call and the first five bricks named, the rest counted (8 bricks with onnxruntime 1.31).
    import re

    missing, total = map(int, re.search(r"--estimate-only: (\d+) of (\d+) bricks", err).groups())
    assert missing == total > 5 and err.count(", key ") == 5
    assert f"; and {total - 5} more (add --measure-missing to measure only those" in err


def test_the_estimate_mode_crosses_to_the_run_in_its_request_and_an_unknown_one_is_refused() -> None:
    """The run's process reads the mode from its request (which it gets whole), not from its environment."""
    from mlharness.errors import UserError
    from mlharness.running.request import RunRequest

    request = RunRequest(model="m", scenario="SingleStream", kind="bricks", brick_estimate="measure-missing")
    assert RunRequest.from_json(request.to_json()).brick_estimate == "measure-missing"
    assert RunRequest(model="m", scenario="SingleStream", kind="bricks").brick_estimate is None  # a full run
    with pytest.raises(UserError, match=r"^brick estimate: expected one of only, measure-missing, got 'al'$"):
        RunRequest(model="m", scenario="SingleStream", kind="bricks", brick_estimate="al")
