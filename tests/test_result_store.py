"""The results database: every real run lands in it (ok or failed), the CLI queries it, older
schemas migrate forward and newer ones are refused."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.store.result_store import DB_ENV, ResultStore
from mlharness.store.schema import SCHEMA_VERSION, schema_version
from tests.support import newest_run, run_cli, write_manifest

# The first schema exactly as version 1 shipped it, kept here so the test does not depend on the
# module's own copy.
V1_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  started_at TEXT, finished_at TEXT,
  status TEXT NOT NULL, error TEXT,
  model TEXT, model_version TEXT, model_sha256 TEXT,
  dataset TEXT, dataset_sha256 TEXT,
  backend TEXT, scenario TEXT, mode TEXT,
  system_name TEXT, results_path TEXT,
  metric_name TEXT, metric_value REAL, result_valid INTEGER,
  record_schema_version INTEGER,
  record_json TEXT NOT NULL
);
CREATE INDEX runs_lookup ON runs (model, scenario, backend, status, started_at);
CREATE TABLE run_metrics (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  name TEXT NOT NULL, value REAL NOT NULL,
  PRIMARY KEY (run_id, name)
);
PRAGMA user_version = 1;
"""




@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A real null Offline performance run (max_batch_size 16) and a real accuracy run."""
    results = tmp_path_factory.mktemp("store")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "max_batch_size=16",
                   "--set", "target_qps=20000", "--results-dir", results) == 0
    perf = newest_run(results, "null", "Offline")
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", results) == 0
    acc = newest_run(results, "null", "Offline")
    assert acc["run_id"] != perf["run_id"]
    return results, [perf, acc]


def test_every_run_is_stored_with_its_record(two_runs: tuple[Path, list[dict]]) -> None:
    results, (perf, acc) = two_runs
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        assert schema_version(store.conn) == SCHEMA_VERSION
        rows = {r["run_id"]: r for r in store.list_runs()}
        assert set(rows) == {perf["run_id"], acc["run_id"]}
        row = rows[perf["run_id"]]
        assert (row["model"], row["backend"], row["scenario"], row["status"]) == ("null", "null", "Offline", "ok")
        assert row["model_sha256"] == perf["model"]["sha256"] and row["batch_size"] == 16
        assert row["metric_name"] == "offline.samples_per_second" and row["metric_value"] > 0
        stored = store.get_record(perf["run_id"][:-1])  # a unique prefix is enough
        assert stored.to_dict() == perf  # the full run.json: manifests, settings, system, software versions
        assert stored.software_versions["mlcommons-loadgen"]
        metrics = store.run_metrics(acc["run_id"])
        assert {k: v for k, v in metrics.items() if k.startswith("accuracy.")} == {"accuracy.top1": 0.5, "accuracy.top5": 1.0}
        # Cold start and memory are figures too (gates can use them).
        assert metrics["coldstart.peak_rss_bytes"] > 0 and metrics["coldstart.load_seconds"] >= 0
        assert set(metrics) - {"accuracy.top1", "accuracy.top5"} == {k for k in metrics if k.startswith("coldstart.")}


def test_cli_list_show_compare(two_runs: tuple[Path, list[dict]], capsys: pytest.CaptureFixture[str]) -> None:
    results, (perf, acc) = two_runs
    capsys.readouterr()
    assert run_cli("results", "list", "--results-dir", results, "--mode", "accuracy") == 0
    out = capsys.readouterr().out
    assert acc["run_id"] in out and perf["run_id"] not in out
    assert run_cli("results", "show", perf["run_id"], "--results-dir", results) == 0
    out = capsys.readouterr().out
    assert "offline.samples_per_second" in out and perf["model"]["sha256"][:12] in out
    assert run_cli("results", "compare", perf["run_id"], acc["run_id"], "--results-dir", results) == 0
    out = capsys.readouterr().out
    assert "harness.max_batch_size" in out and "accuracy.top1" in out
    assert "system and framework versions: same" in out


def test_failed_run_is_stored_with_its_error(tmp_path: Path, specs_copy: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "broken.yaml", """\
        kind: model
        name: broken
        version: 1.0.0
        framework: {name: "null"}
        dataset: null-samples
        inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
        outputs: [{name: scores, type: scores, element_type: float32, shape: [batch, 10]}]
        preprocess: |
          def preprocess(sample, ctx):
              raise ValueError("unreadable sample")
        attributes: {max_batch_size: 1}
        """)
    db = tmp_path / "elsewhere" / "runs.sqlite"
    monkeypatch.setenv(DB_ENV, str(db))  # the database path comes from $MLHARNESS_DB
    assert run_cli("run", "broken", "--scenario", "Offline", "--quick", "--results-dir", tmp_path / "r") == 1
    assert not (tmp_path / "r" / "mlharness.sqlite").exists()
    with ResultStore(db, create=False) as store:
        (row,) = store.list_runs()
        assert row["status"] == "failed" and "unreadable sample" in row["error"]
    capsys.readouterr()
    assert run_cli("results", "list", "--status", "failed", "--db", db) == 0
    assert row["run_id"] in capsys.readouterr().out


def test_migrates_a_version_1_database(two_runs: tuple[Path, list[dict]], tmp_path: Path) -> None:
    _, (perf, _) = two_runs
    path = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V1_DDL)
    conn.execute("INSERT INTO runs (run_id, status, model, backend, scenario, mode, record_json) "
                 "VALUES (?, 'ok', 'null', 'null', 'Offline', 'performance', ?)", (perf["run_id"], json.dumps(perf)))
    conn.execute("INSERT INTO run_metrics VALUES (?, 'offline.samples_per_second', 1.0)", (perf["run_id"],))
    conn.commit()
    conn.close()
    with ResultStore(path) as store:
        assert schema_version(store.conn) == SCHEMA_VERSION
        (row,) = store.list_runs()
        assert row["batch_size"] == 16 and row["sweep_id"] is None  # backfilled from the stored JSON
        assert store.get_record(perf["run_id"]).to_dict() == perf
        assert store.list_sweeps() == []


def test_refuses_a_newer_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "future.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UserError, match="newer than this mlharness supports"):
        ResultStore(path)
    assert run_cli("results", "list", "--db", path) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and f"version {SCHEMA_VERSION + 1}" in err
    conn = sqlite3.connect(path)
    assert schema_version(conn) == SCHEMA_VERSION + 1  # left untouched
    conn.close()


def test_missing_database_and_unknown_run_are_one_line_errors(two_runs: tuple[Path, list[dict]], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("results", "list", "--results-dir", tmp_path / "nothing") == 1
    assert "no results database" in capsys.readouterr().err
    assert run_cli("results", "show", "no-such-run", "--results-dir", two_runs[0]) == 1
    assert "no run with id 'no-such-run'" in capsys.readouterr().err


def test_import_run_json_files(two_runs: tuple[Path, list[dict]], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    results, (perf, acc) = two_runs
    db = tmp_path / "imported.sqlite"
    assert run_cli("results", "import", results, "--db", db) == 0  # every run.json below the folder
    # Each run keeps its own folder; the scenario's view links the chosen run's record: stored once.
    assert "2 run(s) stored" in capsys.readouterr().out
    with ResultStore(db) as store:
        assert sorted(r["run_id"] for r in store.list_runs()) == sorted([perf["run_id"], acc["run_id"]])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert run_cli("results", "import", bad, "--db", db) == 1
    assert f"{bad}: not valid JSON" in capsys.readouterr().err
