"""`mlharness results list`: every filter the command offers (--model, --scenario, --backend,
--status, --mode, --sweep, --limit) and --json, over a database of real short runs: two models
and two backends, two scenarios, two modes, a failed run and a sweep's run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlharness.records.run_record import RunRecord
from mlharness.store.result_store import ResultStore
from tests.support import REPO, failing_null_model, linear_torch_model, run_cli



INDEX_COLUMNS = {"run_id", "started_at", "finished_at", "status", "error", "model", "model_version", "model_sha256",
                 "dataset", "dataset_sha256", "backend", "scenario", "mode", "system_name", "results_path",
                 "metric_name", "metric_value", "result_valid", "record_schema_version", "sweep_id", "cell_key",
                 "repeat_index", "batch_size", "threads"}


def _ids(db: Path) -> set[str]:
    if not db.exists():
        return set()
    with ResultStore(db) as store:
        return {row["run_id"] for row in store.list_runs()}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Seven runs, oldest first: null Offline performance, null Offline accuracy, null SingleStream
    performance, flaky Offline (failed), tiny-torch Offline (torch), and a sweep's null Offline run."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("results-list")
    specs = root / "specs"
    shutil.copytree(REPO / "specs", specs)
    (specs / "models" / "flaky.yaml").write_text(failing_null_model(postprocess_calls=0))
    (specs / "models" / "tiny-torch.yaml").write_text(linear_torch_model("tiny-torch", accuracy=False))
    results = root / "results"
    path = results / "mlharness.sqlite"
    runs: dict[str, str] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLHARNESS_SPECS", str(specs))
        for name, code, args in [
            ("offline", 0, ("null", "--scenario", "Offline", "--set", "target_qps=20000", "--set", "max_batch_size=8")),
            ("accuracy", 0, ("null", "--scenario", "Offline", "--mode", "accuracy")),
            ("singlestream", 0, ("null", "--scenario", "SingleStream")),
            ("failed", 1, ("flaky", "--scenario", "Offline")),
            ("torch", 0, ("tiny-torch", "--scenario", "Offline")),
        ]:
            before = _ids(path)
            assert run_cli("run", *args, "--quick", "--results-dir", results) == code
            (runs[name],) = _ids(path) - before
        grid = root / "grid.yaml"
        grid.write_text("name: s1\nquick: true\nmodels: ['null']\nscenarios: [Offline]\nset: {target_qps: 20000}\n")
        before = _ids(path)
        assert run_cli("sweep", grid, "--results-dir", results) == 0
        (runs["sweep"],) = _ids(path) - before
    order = ["offline", "accuracy", "singlestream", "failed", "torch", "sweep"]
    return {"results": results, "runs": runs, "newest_first": [runs[n] for n in reversed(order)]}


def listed(db: dict, capsys: pytest.CaptureFixture[str], *filters: str) -> list[dict]:
    capsys.readouterr()
    assert run_cli("results", "list", "--results-dir", db["results"], "--json", *filters) == 0
    return json.loads(capsys.readouterr().out)


def names(db: dict, rows: list[dict]) -> list[str]:
    by_id = {run_id: name for name, run_id in db["runs"].items()}
    return [by_id[row["run_id"]] for row in rows]


@pytest.mark.parametrize("filters, expected", [
    ((), ["sweep", "torch", "failed", "singlestream", "accuracy", "offline"]),
    (("--model", "null"), ["sweep", "singlestream", "accuracy", "offline"]),
    (("--model", "flaky"), ["failed"]),
    (("--scenario", "SingleStream"), ["singlestream"]),
    (("--scenario", "Offline"), ["sweep", "torch", "failed", "accuracy", "offline"]),
    (("--backend", "torch"), ["torch"]),
    (("--backend", "null"), ["sweep", "failed", "singlestream", "accuracy", "offline"]),
    (("--status", "failed"), ["failed"]),
    (("--status", "ok"), ["sweep", "torch", "singlestream", "accuracy", "offline"]),
    (("--status", "running"), []),
    (("--mode", "accuracy"), ["accuracy"]),
    (("--mode", "performance"), ["sweep", "torch", "failed", "singlestream", "offline"]),
    (("--sweep", "s1"), ["sweep"]),
    (("--sweep", "no-such-sweep"), []),
    (("--model", "null", "--scenario", "Offline", "--mode", "performance"), ["sweep", "offline"]),
    (("--model", "null", "--scenario", "Offline", "--mode", "performance", "--sweep", "s1"), ["sweep"]),
    (("--backend", "null", "--status", "ok", "--scenario", "Offline"), ["sweep", "accuracy", "offline"]),
    (("--limit", "2"), ["sweep", "torch"]),
    (("--limit", "0"), ["sweep", "torch", "failed", "singlestream", "accuracy", "offline"]),
    (("--model", "null", "--limit", "3"), ["sweep", "singlestream", "accuracy"]),
])
def test_each_filter_selects_exactly_its_runs_newest_first(db: dict, capsys: pytest.CaptureFixture[str],
                                                            filters: tuple[str, ...], expected: list[str]) -> None:
    assert names(db, listed(db, capsys, *filters)) == expected


def test_the_default_limit_is_fifty(db: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fifty-one copies of one record in another database: the listing stops at fifty unless told."""
    with ResultStore(db["results"] / "mlharness.sqlite") as store:
        record = store.get_record(db["runs"]["offline"]).to_dict()
    with ResultStore(tmp_path / "many.sqlite") as store:
        for i in range(51):
            store.add_run(RunRecord.from_dict({**record, "run_id": f"copy-{i:02d}", "started_at": f"2030-01-01T00:00:{i:02d}Z"}))
    capsys.readouterr()
    assert run_cli("results", "list", "--db", tmp_path / "many.sqlite", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == [f"copy-{i:02d}" for i in range(50, 0, -1)]


def test_json_rows_hold_the_index_columns(db: dict, capsys: pytest.CaptureFixture[str]) -> None:
    rows = {row["run_id"]: row for row in listed(db, capsys)}
    assert all(set(row) == INDEX_COLUMNS for row in rows.values())  # everything but the stored record_json
    runs = db["runs"]
    with ResultStore(db["results"] / "mlharness.sqlite") as store:
        for run_id, row in rows.items():
            record = store.get_record(run_id).to_dict()
            assert (row["model"], row["backend"], row["scenario"], row["mode"], row["status"]) == (
                record["model"]["name"], record["backend"], record["scenario"], record["mode"], record["status"])
            assert (row["results_path"], row["started_at"]) == (record["results_path"], record["started_at"])
    offline = rows[runs["offline"]]
    record = json.loads((Path(offline["results_path"]) / "run.json").read_text())
    assert offline["metric_name"] == "offline.samples_per_second"
    assert offline["metric_value"] == record["performance"]["samples_per_second"] > 0
    assert offline["result_valid"] == 0 and offline["sweep_id"] is None and offline["batch_size"] == 8
    assert rows[runs["accuracy"]]["batch_size"] is None  # not set: the column says so rather than guessing
    singlestream = rows[runs["singlestream"]]
    assert singlestream["metric_name"] == "singlestream.p90_latency_ns" and singlestream["metric_value"] > 0
    failed = rows[runs["failed"]]
    assert failed["status"] == "failed" and "postprocess blew up" in failed["error"]
    sweep = rows[runs["sweep"]]
    assert sweep["sweep_id"] == "s1" and sweep["repeat_index"] == 0 and len(sweep["cell_key"]) == 16
    with ResultStore(db["results"] / "mlharness.sqlite") as store:
        (cell,) = store.sweep_cells("s1")
    assert cell["cell_key"] == sweep["cell_key"] and cell["run_id"] == sweep["run_id"]


def test_the_table_shows_the_filtered_runs(db: dict, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run_cli("results", "list", "--results-dir", db["results"], "--model", "null", "--mode", "performance") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "id", "started"]
    body = [line.split() for line in lines[2:]]
    assert [row[0] for row in body] == [db["runs"]["sweep"], db["runs"]["singlestream"], db["runs"]["offline"]]
    assert [row[-1] for row in body] == ["s1", "-", "-"]  # the sweep column
    assert all(row[2:4] == ["null", "null"] and "performance" in row for row in body)


def test_a_missing_database_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("results", "list", "--results-dir", tmp_path / "none") == 1
    err = capsys.readouterr().err.strip()
    assert err == f"mlharness: error: {tmp_path / 'none' / 'mlharness.sqlite'}: no results database here " \
                  "(run something first, or pass --db)"
    assert not (tmp_path / "none").exists()
