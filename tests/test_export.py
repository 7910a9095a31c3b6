"""`mlharness results export`: CSV and JSON lines of real runs read back and compared with the database,
and the MLCommons-shaped summary (newest ok performance figure and accuracy per system, benchmark, scenario)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import NULL_OFFLINE, null_offline_pair, run_cli, run_new


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("export") / "r"
    ids = null_offline_pair(root)
    # Verdicts no machine can flip: 64 SingleStream queries with no minimum duration are VALID by count
    # alone (LoadGen's early stopping needs 64); Offline at target_qps 10 issues one query of 11 samples,
    # which ends long before the preset's minimum duration: INVALID.
    ids["singlestream"] = run_new(root, "null", "--scenario", "SingleStream", "--quick", "--set", "min_duration=0",
                                  "--set", "min_query_count=64")
    ids["newer"] = run_new(root, *NULL_OFFLINE, "--set", "max_batch_size=8", "--set", "target_qps=10")
    return {"root": root, "ids": ids}


def _stored(root: Path) -> dict[str, dict]:
    """Each stored run's index row, its figures, and LoadGen's verdict from its stored record."""
    with ResultStore(root / "mlharness.sqlite", create=False) as store:
        return {row["run_id"]: dict(row) | {"figures": store.run_metrics(row["run_id"]),
                                            "loadgen_result": store.get_record(row["run_id"]).loadgen_result}
                for row in store.list_runs()}


def test_csv_and_jsonl_read_back_as_the_database(results: dict, tmp_path: Path) -> None:
    stored = _stored(results["root"])
    assert run_cli("results", "export", "--format", "csv", "--out", tmp_path / "runs.csv",
                   "--results-dir", results["root"]) == 0
    with open(tmp_path / "runs.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert run_cli("results", "export", "--format", "jsonl", "--out", tmp_path / "runs.jsonl",
                   "--results-dir", results["root"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["run_id"] for r in rows] == [r["run_id"] for r in lines] == list(stored)  # newest first
    for row, line in zip(rows, lines):
        db = stored[row["run_id"]]
        for key in ("status", "model", "backend", "scenario", "mode", "system_name", "metric_name"):
            assert row[key] == line[key] == db[key], key
        if db["metric_value"] is None:
            assert row["metric_value"] == "" and line["metric_value"] is None
        else:
            assert float(row["metric_value"]) == line["metric_value"] == db["metric_value"]
        assert line["accuracy.top1"] == db["figures"].get("accuracy.top1")
        assert line["batch_size"] == db["batch_size"]
        assert line["loadgen_result"] == db["loadgen_result"] and row["loadgen_result"] == (db["loadgen_result"] or "")
    accuracy = next(line for line in lines if line["run_id"] == results["ids"]["accuracy"])
    assert (accuracy["accuracy.top1"], accuracy["mode"]) == (0.5, "accuracy")

    # --all-figures: a column per figure; filters as `results list`
    assert run_cli("results", "export", "--format", "jsonl", "--all-figures", "--scenario", "SingleStream",
                   "--out", tmp_path / "ss.jsonl", "--results-dir", results["root"]) == 0
    (line,) = [json.loads(x) for x in (tmp_path / "ss.jsonl").read_text().splitlines()]
    assert line["run_id"] == results["ids"]["singlestream"]
    assert line["singlestream.p90_latency_ns"] == stored[line["run_id"]]["figures"]["singlestream.p90_latency_ns"]


def test_summary_in_mlcommons_shape(results: dict, capsys: pytest.CaptureFixture[str]) -> None:
    stored, ids = _stored(results["root"]), results["ids"]
    assert run_cli("results", "export", "--summary", "--format", "jsonl", "--results-dir", results["root"]) == 0
    rows = {row["scenario"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    assert sorted(rows) == ["Offline", "SingleStream"]
    offline, single = rows["Offline"], rows["SingleStream"]
    # the newest ok performance run (the batch-8 one), with the accuracy run's accuracy beside it
    assert offline["performance_run"] == ids["newer"] and offline["accuracy_run"] == ids["accuracy"]
    assert offline["value"] == stored[ids["newer"]]["figures"]["offline.samples_per_second"]
    assert (offline["units"], offline["benchmark"], offline["system"]) == (
        "Samples/s", "null", stored[ids["newer"]]["system_name"])
    assert offline["accuracy"] == "top1=0.5 top5=1"
    # SingleStream as MLPerf reports it: the 90th percentile latency in milliseconds
    assert single["units"] == "Latency (ms)" and single["accuracy_run"] is None
    assert single["value"] == pytest.approx(stored[ids["singlestream"]]["figures"]["singlestream.p90_latency_ns"] / 1e6)
    # the verdict LoadGen gave each run, as stored: the record's and the database's agree with the summary row
    for row, run_id, verdict in ((offline, ids["newer"], "INVALID"), (single, ids["singlestream"], "VALID")):
        assert row["valid"] == stored[run_id]["loadgen_result"] == verdict
        assert stored[run_id]["result_valid"] == (verdict == "VALID")

    assert run_cli("results", "export", "--summary", "--format", "table", "--results-dir", results["root"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["system", "benchmark", "model", "backend", "scenario", "metric"]
    assert len(table) == 4


def test_export_refuses_bad_output(results: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("results", "export", "--out", tmp_path, "--results-dir", results["root"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}: --out is a folder" in err
    assert run_cli("results", "export", "--format", "table", "--results-dir", results["root"]) == 1
    assert "--format table: only with --summary" in capsys.readouterr().err
