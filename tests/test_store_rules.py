"""The results database's rules, called in-process on a real SQLite file: what a run record stores
and reads back (index columns, figures, the JSON as given), upserts, id prefixes, filters, ordering
and limits, sweeps and their cells, migrations from older schemas (atomic, one step at a time),
the refusal of newer or damaged files in one line, writes that fail leaving nothing half-written,
and concurrent writers. One real null Offline run is the template every record is made from."""
from __future__ import annotations

import copy
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord
from mlharness.store import schema
from mlharness.store.result_store import (
    DB_ENV,
    ResultStore,
    RunFilter,
    default_db_path,
    record_run,
    resolve_db_path,
)
from mlharness.store.run_files import import_run_files, load_run_files, store_record_file
from mlharness.store.schema import SCHEMA_VERSION, migrate, schema_version
from tests.support import newest_run, run_cli
from tests.test_result_store import V1_DDL


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The run.json of one real null Offline --quick run (max_batch_size 4, intra_op_threads 3)."""
    results = tmp_path_factory.mktemp("rules")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "max_batch_size=4",
                   "--set", "intra_op_threads=3", "--set", "target_qps=20000", "--results-dir", results) == 0
    return newest_run(results, "null", "Offline")


def make(real: dict, run_id: str, **changes: object) -> dict:
    """A copy of the real record with another id and the given top-level fields changed."""
    record = copy.deepcopy(real)
    record["run_id"] = run_id
    record.update(changes)
    return record


def db(tmp_path: Path) -> ResultStore:
    return ResultStore(tmp_path / "runs.sqlite")


def ids(rows: list) -> list[str]:
    return [r["run_id"] for r in rows]


def one_line(exc: pytest.ExceptionInfo[UserError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# ---- what a run stores ------------------------------------------------------------------------

def test_index_columns_figures_and_json_of_a_real_run(real: dict, tmp_path: Path) -> None:
    record = RunRecord.from_dict(copy.deepcopy(real))
    assert (record.batch_size, record.threads) == (4, 3)
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(real))
        (row,) = store.list_runs()
        expected = {
            "run_id": real["run_id"], "started_at": real["started_at"], "finished_at": real["finished_at"],
            "status": "ok", "error": None, "model": "null", "model_version": real["model"]["version"],
            "model_sha256": real["model"]["sha256"], "dataset": real["dataset"]["name"],
            "dataset_sha256": real["dataset"]["sha256"], "backend": "null", "scenario": "Offline",
            "mode": "performance", "system_name": real["system_name"], "results_path": real["results_path"],
            "metric_name": "offline.samples_per_second",
            "metric_value": real["performance"]["samples_per_second"],
            "result_valid": int(bool(real["performance"]["valid"])), "record_schema_version": 3,
            "batch_size": 4, "threads": 3, "sweep_id": None, "cell_key": None, "repeat_index": None,
        }
        assert {k: row[k] for k in expected} == expected
        assert all(expected[k] is not None for k in ("model_version", "dataset", "dataset_sha256", "finished_at"))
        assert json.loads(row["record_json"]) == real
        assert store.run_metrics(real["run_id"]) == record.figures()
        assert store.run_metrics(real["run_id"])["offline.samples_per_second"] > 0
        assert store.run_metrics("no-such-run") == {}


def test_a_record_reads_back_equal_and_a_dict_is_refused(real: dict, tmp_path: Path) -> None:
    """add_run takes a RunRecord only (the dict form is gone); what it stored reads back equal, to its dict."""
    with ResultStore(tmp_path / "a.sqlite") as a:
        a.add_run(RunRecord.from_dict(copy.deepcopy(real)))
        assert a.get_record(real["run_id"]) == RunRecord.from_dict(copy.deepcopy(real))
        assert a.get_record(real["run_id"]).to_dict() == real
        with pytest.raises(TypeError, match="^add_run takes a RunRecord, got dict$"):
            a.add_run(make(real, "as-dict"))
        assert ids(a.list_runs()) == [real["run_id"]]


def test_missing_parts_store_as_empty_columns(real: dict, tmp_path: Path) -> None:
    bare = make(real, "bare", status=None, model=None, dataset=None, performance=None, accuracy=None,
                cold_start={}, settings={}, backend_info={})
    invalid = make(real, "invalid", status="failed", error="it broke",
                   performance={**real["performance"], "valid": False})
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(bare))
        store.add_run(RunRecord.from_dict(invalid))
        rows = {r["run_id"]: r for r in store.list_runs()}
        b, i = rows["bare"], rows["invalid"]
        assert b["status"] == "unknown"
        assert [b[k] for k in ("model", "model_version", "model_sha256", "dataset", "dataset_sha256",
                               "metric_value", "result_valid", "batch_size", "threads")] == [None] * 9
        assert b["metric_name"] == "offline.samples_per_second"
        assert store.run_metrics("bare") == {}
        assert (i["status"], i["error"], i["result_valid"]) == ("failed", "it broke", 0)


def test_unknown_fields_are_kept_and_old_records_migrated(real: dict, tmp_path: Path) -> None:
    newer = make(real, "extra", future_field={"x": 1})
    old = make(real, "old")
    del old["kind"]
    old["schema_version"] = 1
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(newer))
        store.add_run(RunRecord.from_dict(old))
        assert store.get_record("extra").extra == {"future_field": {"x": 1}}
        assert store.get_record("extra").to_dict()["future_field"] == {"x": 1}
        assert store.get_record("old").to_dict() == make(real, "old")
        with pytest.raises(UserError, match="run record: schema_version 99 is newer"):
            store.add_run(RunRecord.from_dict(make(real, "future", schema_version=99)))
        assert sorted(ids(store.list_runs())) == ["extra", "old"]


def test_adding_a_run_again_updates_it_and_keeps_its_sweep_cell(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(real))
        store.tag_run(real["run_id"], "sw", "cell-a", 2)
        changed = make(real, real["run_id"], status="failed", error="late failure",
                       performance={**real["performance"], "samples_per_second": 12.5, "extra_qps": 7},
                       cold_start={})
        store.add_run(RunRecord.from_dict(changed))
        (row,) = store.list_runs()
        assert (row["status"], row["error"], row["metric_value"]) == ("failed", "late failure", 12.5)
        assert (row["sweep_id"], row["cell_key"], row["repeat_index"]) == ("sw", "cell-a", 2)
        metrics = store.run_metrics(real["run_id"])
        assert metrics["offline.samples_per_second"] == 12.5 and metrics["offline.extra_qps"] == 7
        assert not any(k.startswith("coldstart.") for k in metrics)  # the old figures are gone
        assert store.get_record(real["run_id"]).to_dict() == changed


def test_deleting_a_run_deletes_its_figures(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(real))
        store.add_run(RunRecord.from_dict(make(real, "other")))
        store.conn.execute("DELETE FROM runs WHERE run_id = ?", (real["run_id"],))
        assert store.run_metrics(real["run_id"]) == {}
        assert store.run_metrics("other")
        with pytest.raises(sqlite3.IntegrityError):  # a figure of no run is refused
            store.conn.execute("INSERT INTO run_metrics VALUES ('ghost', 'x', 1.0)")


# ---- reading runs back ------------------------------------------------------------------------

def test_get_record_by_id_or_unique_prefix(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        for run_id in ("r1", "r10", "r2", "a_b", "axb", "p%q", "pzq", "s\\t", "sxt"):
            store.add_run(RunRecord.from_dict(make(real, run_id)))
        assert store.get_record("r1").run_id == "r1"  # an exact id wins over the longer one it prefixes
        assert store.get_record("r2").run_id == "r2"
        assert store.get_record("r10").run_id == "r10"
        assert store.get_record("a_").run_id == "a_b"  # _ % and \ are literal in a prefix
        assert store.get_record("p%").run_id == "p%q"
        assert store.get_record("s\\").run_id == "s\\t"
        with pytest.raises(UserError) as exc:
            store.get_record("r")
        assert one_line(exc) == f"{store.path}: run id prefix 'r' is ambiguous (r1, r10, r2, ...)"
        with pytest.raises(UserError) as exc:
            store.get_record("p")  # two matches are ambiguous too
        assert one_line(exc) == f"{store.path}: run id prefix 'p' is ambiguous (p%q, pzq, ...)"
        with pytest.raises(UserError) as exc:
            store.get_record("q")
        assert one_line(exc) == f"{store.path}: no run with id 'q'"


def test_a_stored_record_this_version_cannot_read_names_its_run(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(real))
        store.conn.execute("UPDATE runs SET record_json = ?", (json.dumps(make(real, real["run_id"], schema_version=7)),))
        with pytest.raises(UserError) as exc:
            store.get_record(real["run_id"])
        assert one_line(exc).startswith(f"{store.path}: run {real['run_id']}: schema_version 7 is newer")
        with pytest.raises(UserError, match=f"run {real['run_id']}: schema_version 7"):
            store.run_records()


def test_list_newest_first_with_ties_in_insertion_order(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(make(real, "b-old", started_at="2024-01-01T00:00:00+00:00")))
        store.add_run(RunRecord.from_dict(make(real, "c-tie1", started_at="2024-06-01T00:00:00+00:00")))
        store.add_run(RunRecord.from_dict(make(real, "a-tie2", started_at="2024-06-01T00:00:00+00:00")))
        store.add_run(RunRecord.from_dict(make(real, "d-new", started_at="2025-01-01T00:00:00+00:00")))
        order = ["d-new", "a-tie2", "c-tie1", "b-old"]
        assert ids(store.list_runs()) == order
        assert ids(store.list_runs(limit=2)) == order[:2]
        assert ids(store.list_runs(limit=1)) == order[:1]
        assert ids(store.list_runs(limit=None)) == order
        assert ids(store.list_runs(limit=0)) == order  # no limit
        assert [r.run_id for r in store.run_records()] == order
        assert [r.run_id for r in store.run_records(limit=3)] == order[:3]
        assert [r.run_id for r in store.run_records(limit=2)] == order[:2]
        assert [r.to_dict() for r in store.run_records(limit=1)] == [
            make(real, "d-new", started_at="2025-01-01T00:00:00+00:00")]


def test_every_filter_and_their_combination(real: dict, tmp_path: Path) -> None:
    base = dict(model={**real["model"], "name": "m1"}, scenario="Offline", backend="onnxruntime",
                status="ok", mode="performance", system_name="sysA")
    variants = {
        "base": {},
        "model": {"model": {**real["model"], "name": "m2"}},
        "scenario": {"scenario": "Server"},
        "backend": {"backend": "torch"},
        "status": {"status": "failed"},
        "mode": {"mode": "accuracy"},
        "system": {"system_name": "sysB"},
        "sweep": {},
    }
    with db(tmp_path) as store:
        for n, (run_id, change) in enumerate(variants.items()):
            store.add_run(RunRecord.from_dict(make(real, run_id, **{**base, **change}, started_at=f"2024-01-0{n + 1}T00:00:00+00:00")))
        store.tag_run("sweep", "sw1", "k", 0)
        everything = ["sweep", "system", "mode", "status", "backend", "scenario", "model", "base"]
        assert ids(store.list_runs(RunFilter())) == everything
        assert ids(store.list_runs(RunFilter(model="m2"))) == ["model"]
        assert ids(store.list_runs(RunFilter(scenario="Server"))) == ["scenario"]
        assert ids(store.list_runs(RunFilter(backend="torch"))) == ["backend"]
        assert ids(store.list_runs(RunFilter(status="failed"))) == ["status"]
        assert ids(store.list_runs(RunFilter(mode="accuracy"))) == ["mode"]
        assert ids(store.list_runs(RunFilter(system="sysB"))) == ["system"]
        assert ids(store.list_runs(RunFilter(sweep="sw1"))) == ["sweep"]
        assert ids(store.list_runs(RunFilter(model="m1"))) == [i for i in everything if i != "model"]
        both = RunFilter(model="m1", scenario="Offline", backend="onnxruntime", status="ok", mode="performance",
                         system="sysA")
        assert ids(store.list_runs(both)) == ["sweep", "base"]
        assert ids(store.list_runs(both, limit=1)) == ["sweep"]
        assert ids(store.list_runs(RunFilter(model="m2", scenario="Server"))) == []  # AND, not OR
        assert [r.run_id for r in store.run_records(RunFilter(mode="accuracy"))] == ["mode"]
        assert [r.run_id for r in store.run_records(RunFilter(backend="torch"))] == ["backend"]


# ---- sweeps -----------------------------------------------------------------------------------

def test_sweeps_and_their_cells(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        assert store.list_sweeps() == []
        with pytest.raises(UserError) as exc:
            store.get_sweep("nope")
        assert one_line(exc) == f"{store.path}: no sweep 'nope' (known: none)"
        store.start_sweep("s1", "first", "grid.yaml", {"b": [1, 2], "a": "x"}, "2024-01-01T00:00:00")
        store.start_sweep("s2", "second", "g2.yaml", {}, "2024-01-02T00:00:00")
        store.start_sweep("s1", "renamed", "grid2.yaml", {"c": Path("p")}, "2024-01-03T00:00:00")
        s1 = store.get_sweep("s1")
        assert (s1["name"], s1["grid_path"], s1["created_at"], s1["updated_at"]) == (
            "renamed", "grid2.yaml", "2024-01-01T00:00:00", "2024-01-03T00:00:00")
        assert s1["grid_json"] == '{"c": "p"}'
        assert json.loads(store.get_sweep("s2")["grid_json"]) == {}
        with pytest.raises(UserError) as exc:
            store.get_sweep("s3")
        assert one_line(exc) == f"{store.path}: no sweep 's3' (known: s1, s2)"

        store.add_run(RunRecord.from_dict(real))
        store.add_run(RunRecord.from_dict(make(real, "other")))
        cell = dict(status="ok", error=None, stderr=None, finished_at="t9", seconds=1.5)
        store.record_cell("s1", "k2", 0, {"z": 1, "a": 2}, run_id=real["run_id"], started_at="t2", **cell)
        store.record_cell("s1", "k1", 1, {}, run_id=None, started_at="t2", **{**cell, "status": "failed",
                                                                               "error": "boom", "stderr": "tb"})
        store.record_cell("s1", "k1", 0, {}, run_id=None, started_at="t2", **cell)
        store.record_cell("s1", "k3", 0, {}, run_id=None, started_at="t1", **{**cell, "status": "timeout"})
        store.record_cell("s2", "k1", 0, {}, run_id=None, started_at="t0", **cell)
        rows = store.sweep_cells("s1")
        assert [(r["cell_key"], r["repeat_index"]) for r in rows] == [("k3", 0), ("k1", 0), ("k1", 1), ("k2", 0)]
        k2 = rows[-1]
        assert (k2["params_json"], k2["status"], k2["run_id"], k2["started_at"], k2["finished_at"],
                k2["seconds"]) == ('{"a": 2, "z": 1}', "ok", real["run_id"], "t2", "t9", 1.5)
        assert (rows[2]["error"], rows[2]["stderr"]) == ("boom", "tb")
        assert store.finished_cells("s1") == {("k2", 0): "ok", ("k1", 1): "failed", ("k1", 0): "ok",
                                              ("k3", 0): "timeout"}
        assert store.finished_cells("nope") == {}
        # The cell's run is tagged with it; a cell without a run tags nothing.
        tagged = {r["run_id"]: (r["sweep_id"], r["cell_key"], r["repeat_index"]) for r in store.list_runs()}
        assert tagged == {real["run_id"]: ("s1", "k2", 0), "other": (None, None, None)}
        assert ids(store.list_runs(RunFilter(sweep="s1"))) == [real["run_id"]]

        # A cell run again replaces the old outcome (a --rerun).
        store.record_cell("s1", "k1", 1, {"n": 1}, run_id="other", started_at="t5", **cell)
        assert store.finished_cells("s1")[("k1", 1)] == "ok"
        again = [r for r in store.sweep_cells("s1") if (r["cell_key"], r["repeat_index"]) == ("k1", 1)]
        assert len(again) == 1 and again[0]["error"] is None and again[0]["run_id"] == "other"
        assert store.get_record("other") and store.list_runs(RunFilter(sweep="s1"), limit=5)

        listed = [(r["sweep_id"], r["cells"], r["ok"]) for r in store.list_sweeps()]
        assert listed == [("s1", 4, 3), ("s2", 1, 1)]  # most recently updated first


def test_sweeps_listed_by_last_update(tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.start_sweep("old", "o", "g", {}, "2024-01-01")
        store.start_sweep("new", "n", "g", {}, "2024-02-01")
        assert [r["sweep_id"] for r in store.list_sweeps()] == ["new", "old"]
        store.start_sweep("old", "o", "g", {}, "2024-03-01")
        assert [r["sweep_id"] for r in store.list_sweeps()] == ["old", "new"]


# ---- opening, migrating, refusing ------------------------------------------------------------

def test_a_new_database_and_its_folders_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "new.sqlite"
    with ResultStore(path) as store:
        assert schema_version(store.conn) == SCHEMA_VERSION == 4
        assert store.path == path
    assert path.is_file()
    with ResultStore(tmp_path / "flat.sqlite") as store:  # its folder exists already
        assert store.list_runs() == []


def test_missing_database_is_refused_when_not_creating(tmp_path: Path) -> None:
    path = tmp_path / "none" / "x.sqlite"
    with pytest.raises(UserError) as exc:
        ResultStore(path, create=False)
    assert one_line(exc) == f"{path}: no results database here (run something first, or pass --db)"
    assert not path.parent.exists()


def test_newer_schema_is_refused_in_one_line_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE keep (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UserError) as exc:
        ResultStore(path, create=False)
    assert one_line(exc) == (f"{path}: results database schema version {SCHEMA_VERSION + 1} is newer than this "
                             f"mlharness supports ({SCHEMA_VERSION}); upgrade mlharness or pass another --db")
    conn = sqlite3.connect(path)
    assert schema_version(conn) == SCHEMA_VERSION + 1
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["keep"]
    conn.close()


def test_a_damaged_file_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(UserError) as exc:
        ResultStore(path)
    assert one_line(exc).startswith(f"{path}: not a usable results database (")
    assert "file is not a database" in str(exc.value)


def test_an_empty_file_migrates_one_step_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "steps.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, path, target=1) == 1
    assert schema_version(conn) == 1
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"meta", "runs", "run_metrics"}
    assert migrate(conn, path, target=2) == 2
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"meta", "runs", "run_metrics", "sweeps", "sweep_cells"}
    assert migrate(conn, path, target=3) == 3
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"meta", "runs", "run_metrics", "sweeps", "sweep_cells", "brick_measurements"}
    assert migrate(conn, path) == 4
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"meta", "runs", "run_metrics", "sweeps", "sweep_cells", "brick_measurements", "tuned_configs"}
    assert migrate(conn, path) == 4  # nothing left to do
    conn.close()


def _v1_database(path: Path, rows: list[tuple[str, str]]) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(V1_DDL)
    for run_id, text in rows:
        conn.execute("INSERT INTO runs (run_id, status, record_json) VALUES (?, 'ok', ?)", (run_id, text))
    conn.commit()
    conn.close()


def test_version_1_rows_are_backfilled_and_unreadable_ones_left_empty(real: dict, tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    old = make(real, "old")
    del old["kind"]
    old["schema_version"] = 1
    _v1_database(path, [("good", json.dumps(make(real, "good"))), ("old", json.dumps(old)),
                        ("newer", json.dumps(make(real, "newer", schema_version=99))),
                        ("broken", json.dumps({"run_id": "broken"}))])
    with ResultStore(path) as store:
        assert schema_version(store.conn) == SCHEMA_VERSION
        got = {r["run_id"]: (r["batch_size"], r["threads"]) for r in store.list_runs()}
        assert got == {"good": (4, 3), "old": (4, 3), "newer": (None, None), "broken": (None, None)}


def test_a_failed_migration_step_changes_nothing(real: dict, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "v1.sqlite"
    _v1_database(path, [("good", json.dumps(make(real, "good")))])

    first, second, *later = schema.MIGRATIONS

    def half_then_fail(conn: sqlite3.Connection) -> None:
        second(conn)  # the whole step's work, then a failure before it is committed
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(schema, "MIGRATIONS", [first, half_then_fail, *later])
    with pytest.raises(RuntimeError, match="disk on fire"):
        ResultStore(path)
    monkeypatch.undo()
    conn = sqlite3.connect(path)
    assert schema_version(conn) == 1
    assert "batch_size" not in [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'sweeps'").fetchone()[0] == 0
    conn.close()
    with ResultStore(path) as store:  # the file is as it was: the real migration still works
        assert [(r["run_id"], r["batch_size"]) for r in store.list_runs()] == [("good", 4)]


def test_a_step_another_process_finished_meanwhile_is_not_run_again(tmp_path: Path) -> None:
    path = tmp_path / "race.sqlite"
    slow = sqlite3.connect(path, isolation_level=None)
    assert schema_version(slow) == 0
    ResultStore(path).close()  # another process migrates the file to the current version

    class Stale(sqlite3.Connection):
        """A connection that read version 0 before the other process migrated (its first read)."""
        reads = 0

        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
            if sql == "PRAGMA user_version" and Stale.reads == 0:
                Stale.reads += 1
                return super().execute("SELECT 0")
            return super().execute(sql, *args)

    slow.close()
    conn = sqlite3.connect(path, isolation_level=None, factory=Stale)
    assert migrate(conn, path) == SCHEMA_VERSION  # no "table meta already exists"
    conn.close()


# ---- atomic writes and concurrent writers ---------------------------------------------------------

def test_a_failed_write_leaves_nothing_half_written(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(real))
        before = ([dict(r) for r in store.list_runs()], store.run_metrics(real["run_id"]))
        # The figures are written after the row: make their insert fail, as a full disk would.
        store.conn.execute("CREATE TRIGGER no_figures BEFORE INSERT ON run_metrics "
                           "BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        with pytest.raises(sqlite3.IntegrityError, match="disk full"):
            store.add_run(RunRecord.from_dict(make(real, real["run_id"], status="failed", error="rewritten")))
        with pytest.raises(sqlite3.IntegrityError, match="disk full"):
            store.add_run(RunRecord.from_dict(make(real, "new-run")))
        assert ([dict(r) for r in store.list_runs()], store.run_metrics(real["run_id"])) == before
        assert not store.conn.in_transaction
        store.conn.execute("DROP TRIGGER no_figures")
        store.add_run(RunRecord.from_dict(make(real, "new-run")))  # the connection is still usable
        assert sorted(ids(store.list_runs())) == sorted([real["run_id"], "new-run"])
    # Another connection sees exactly the committed state.
    with ResultStore(tmp_path / "runs.sqlite", create=False) as again:
        assert again.get_record(real["run_id"]).to_dict() == real


def test_a_failed_cell_write_tags_no_run(real: dict, tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(real))
        store.start_sweep("s", "s", "g", {}, "t")
        store.conn.execute("CREATE TRIGGER no_tags BEFORE UPDATE OF sweep_id ON runs "
                           "BEGIN SELECT RAISE(ABORT, 'locked out'); END")
        with pytest.raises(sqlite3.IntegrityError, match="locked out"):
            store.record_cell("s", "k", 0, {}, "ok", real["run_id"], None, None, "t1", "t2", 1.0)
        assert store.sweep_cells("s") == []
        with pytest.raises(sqlite3.IntegrityError, match="locked out"):
            store.tag_run(real["run_id"], "s", "k", 0)
        assert not store.conn.in_transaction


def test_concurrent_writers_lose_nothing(real: dict, tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with ResultStore(path) as store:  # each its own connection; the first ones also migrate
                store.start_sweep("sw", "sweep", "grid.yaml", {}, f"t{n}")
                for i in range(15):
                    store.add_run(RunRecord.from_dict(make(real, f"w{n}-{i:02d}")))
                    store.record_cell("sw", f"w{n}", i, {}, "ok", f"w{n}-{i:02d}", None, None, "a", "b", 0.1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with ResultStore(path) as store:
        rows = store.list_runs()
        assert sorted(ids(rows)) == sorted(f"w{n}-{i:02d}" for n in range(4) for i in range(15))
        assert all(r["sweep_id"] == "sw" for r in rows)
        assert len(store.finished_cells("sw")) == 60
        assert all(store.run_metrics(r["run_id"]) for r in rows)


# ---- paths, files, the runner's hook ---------------------------------------------------------

def test_database_path_from_environment_or_results_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_db_path(tmp_path / "res") == tmp_path / "res" / "mlharness.sqlite"
    assert default_db_path(str(tmp_path)) == tmp_path / "mlharness.sqlite"
    assert resolve_db_path(None, tmp_path) == tmp_path / "mlharness.sqlite"
    assert resolve_db_path(str(tmp_path / "x.db"), tmp_path / "res") == tmp_path / "x.db"
    monkeypatch.setenv(DB_ENV, str(tmp_path / "env.db"))
    assert default_db_path(tmp_path / "res") == tmp_path / "env.db"
    assert resolve_db_path(None, tmp_path / "res") == tmp_path / "env.db"
    assert resolve_db_path(tmp_path / "given.db", tmp_path / "res") == tmp_path / "given.db"
    monkeypatch.setenv(DB_ENV, "")
    assert default_db_path(tmp_path / "res") == tmp_path / "res" / "mlharness.sqlite"


def test_record_run_stores_a_record_in_its_results_folders_database(real: dict, tmp_path: Path) -> None:
    results = tmp_path / "results"
    record_run(results, RunRecord.from_dict(make(real, "as-object")))
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        assert ids(store.list_runs()) == ["as-object"]
        assert store.get_record("as-object").to_dict() == make(real, "as-object")


def test_run_files_imported_once_each_and_all_or_nothing(real: dict, tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    for sub, run_id in (("b", "run-b"), ("a", "run-a"), ("a/deeper", "run-c")):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "run.json").write_text(json.dumps(make(real, run_id, note=sub)))
    (folder / "view").mkdir()  # a scenario's view: the chosen run's record again, read last (sorted paths)
    (folder / "view" / "run.json").write_text(json.dumps(make(real, "run-a", note="the view")))
    single = tmp_path / "single.json"
    single.write_text(json.dumps(make(real, "run-d")))
    loaded = load_run_files([folder, single])
    assert [r.run_id for r in loaded] == ["run-c", "run-a", "run-b", "run-d"]
    assert loaded[1].extra["note"] == "a"  # the first file read of a run is the one kept
    with db(tmp_path) as store:
        assert import_run_files(store, [folder, single]) == ["run-c", "run-a", "run-b", "run-d"]
        assert store.get_record("run-a").extra["note"] == "a"
        bad = tmp_path / "bad" / "run.json"
        bad.parent.mkdir()
        bad.write_text("{truncated")
        good = tmp_path / "good.json"
        good.write_text(json.dumps(make(real, "run-e")))
        with pytest.raises(UserError, match="not valid JSON"):
            import_run_files(store, [good, bad.parent])
        assert "run-e" not in ids(store.list_runs())  # the good file before it was not stored either
        assert store_record_file(store, good) == "run-e"
        assert store.get_record("run-e").to_dict() == make(real, "run-e")


def test_stored_json_is_canonical_and_takes_any_value(real: dict, tmp_path: Path) -> None:
    """The stored JSON does not depend on key order, and a value JSON lacks (a Path) is kept as text."""
    reordered = dict(reversed(list(make(real, "b").items())))
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(make(real, "a")))
        store.add_run(RunRecord.from_dict(reordered))
        store.add_run(RunRecord.from_dict(make(real, "c", artifacts={"weights": Path("/w/model.onnx")})))
        rows = {r["run_id"]: r["record_json"] for r in store.list_runs()}
        assert rows["a"].replace('"a"', '"b"', 1) == rows["b"]
        assert rows["a"] == json.dumps(make(real, "a"), sort_keys=True)
        assert store.get_record("c").artifacts == {"weights": "/w/model.onnx"}


def test_a_sweeps_grid_is_stored_canonical(tmp_path: Path) -> None:
    """The grid's stored JSON does not depend on the order its keys were written in."""
    with db(tmp_path) as store:
        store.start_sweep("s", "n", "grid.yaml", {"b": [2, 1], "a": {"y": 1, "x": Path("p")}}, "t")
        store.start_sweep("r", "n", "grid.yaml", {"a": {"x": Path("p"), "y": 1}, "b": [2, 1]}, "t")
        assert store.get_sweep("s")["grid_json"] == '{"a": {"x": "p", "y": 1}, "b": [2, 1]}'
        assert store.get_sweep("r")["grid_json"] == store.get_sweep("s")["grid_json"]


def test_a_writer_waits_for_another_writers_lock(real: dict, tmp_path: Path) -> None:
    """Another process (here a second connection) holds the write lock for 6 s, longer than SQLite's
    default 5 s wait: a run's record is still stored once the lock is released (the store waits up to
    60 s), rather than failing with "database is locked"."""
    path = tmp_path / "busy.sqlite"
    ResultStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(6.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        with ResultStore(path) as store:
            store.add_run(RunRecord.from_dict(make(real, "waited")))
            assert ids(store.list_runs()) == ["waited"]
    finally:
        release.join()
        holder.close()


# ---- brick measurements (schema 3) ----------------------------------------------------------------

def _brick(key: str, variant: str, median: object, **extra: object) -> dict:
    return {"brick_key": key, "variant": variant, "median_ms": median, **extra}


def _bricks_run(real: dict, run_id: str, measured: list, fingerprint: str | None = "fp-1", **changes: object) -> dict:
    summary = {"estimate_ms": 3.5} | ({"fingerprint": fingerprint} if fingerprint else {})
    return make(real, run_id, kind="bricks", bricks={"summary": summary, "measured": measured},
                finished_at="2026-01-02T03:04:05+00:00", **changes)


def test_a_bricks_runs_measurements_are_stored_for_reuse_by_fingerprint(real: dict, tmp_path: Path) -> None:
    full = _brick("conv-a", "threads=1,opt=all,ep=cpu", 2, op_type="Conv", label="Conv 3x3",
                  descriptor={"shape": [1, 3], "attrs": {"k": 3, "g": 1}, "path": Path("/m")}, ci_low_ms=1.5,
                  ci_high_ms=2.5, repeats=40, stable="yes", seconds=0.75)
    bare = _brick("relu-b", "threads=2,opt=basic,ep=cpu", "0.25")
    with db(tmp_path) as store:
        assert store.count_brick_measurements() == 0
        store.add_run(RunRecord.from_dict(_bricks_run(real, "b1", [full, bare])))
        assert store.count_brick_measurements() == 2
        found = store.brick_measurements("fp-1", ["conv-a", "relu-b", "conv-a", "absent"])
        assert found == {
            ("conv-a", "threads=1,opt=all,ep=cpu"): {
                "brick_key": "conv-a", "fingerprint": "fp-1", "variant": "threads=1,opt=all,ep=cpu", "op_type": "Conv",
                "label": "Conv 3x3", "descriptor_json": '{"attrs": {"g": 1, "k": 3}, "path": "/m", "shape": [1, 3]}',
                "median_ms": 2.0, "ci_low_ms": 1.5, "ci_high_ms": 2.5, "repeats": 40, "stable": 1, "seconds": 0.75,
                "run_id": "b1", "measured_at": "2026-01-02T03:04:05+00:00"},
            ("relu-b", "threads=2,opt=basic,ep=cpu"): {
                "brick_key": "relu-b", "fingerprint": "fp-1", "variant": "threads=2,opt=basic,ep=cpu", "op_type": None,
                "label": None, "descriptor_json": "null", "median_ms": 0.25, "ci_low_ms": None, "ci_high_ms": None,
                "repeats": None, "stable": 0, "seconds": None, "run_id": "b1",
                "measured_at": "2026-01-02T03:04:05+00:00"},
        }
        assert store.brick_measurements("fp-2", ["conv-a"]) == {}
        assert store.brick_measurements("fp-1", []) == {}
        assert store.run_metrics("b1")["bricks.estimate_ms"] == 3.5
        # Measured again under the same fingerprint and variant: replaced, not added.
        store.add_run(RunRecord.from_dict(_bricks_run(real, "b2", [_brick("conv-a", "threads=1,opt=all,ep=cpu", 1.25)])))
        assert store.count_brick_measurements() == 2
        again = store.brick_measurements("fp-1", ["conv-a"])[("conv-a", "threads=1,opt=all,ep=cpu")]
        assert (again["median_ms"], again["run_id"], again["op_type"]) == (1.25, "b2", None)
        # Another fingerprint is another measurement.
        store.add_run(RunRecord.from_dict(_bricks_run(real, "b3", [_brick("conv-a", "threads=1,opt=all,ep=cpu", 9)], fingerprint="fp-2")))
        assert store.count_brick_measurements() == 3
        assert store.brick_measurements("fp-2", ["conv-a"])[("conv-a", "threads=1,opt=all,ep=cpu")]["median_ms"] == 9.0


@pytest.mark.parametrize("why", ["failed", "no fingerprint", "nothing measured", "no bricks"])
def test_bricks_are_stored_only_from_an_ok_run_that_measured_them_under_a_fingerprint(
        real: dict, tmp_path: Path, why: str) -> None:
    rows = [_brick("k", "v", 1.0)]
    record = {"failed": lambda: _bricks_run(real, "x", rows, status="failed"),
              "no fingerprint": lambda: _bricks_run(real, "x", rows, fingerprint=None),
              "nothing measured": lambda: _bricks_run(real, "x", []),
              "no bricks": lambda: make(real, "x", bricks=None)}[why]()
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(record))
        assert store.get_record("x").run_id == "x"
        assert store.count_brick_measurements() == 0


def test_brick_lookup_beyond_sqlites_parameter_limit(real: dict, tmp_path: Path) -> None:
    keys = [f"k{i:04d}" for i in range(1234)]
    with db(tmp_path) as store:
        store.add_run(RunRecord.from_dict(_bricks_run(real, "many", [_brick(k, "v", 1.0) for k in keys])))
        found = store.brick_measurements("fp-1", reversed(keys + keys[:10]))
        assert sorted(found) == [(k, "v") for k in keys]


# ---- reading from a run's own process (read-only) ------------------------------------------------

def test_reading_opens_only_a_current_database_read_only(real: dict, tmp_path: Path) -> None:
    folder = tmp_path / "a folder with space#and hash"
    path = folder / "runs.sqlite"
    assert ResultStore.reading(path) is None, "no file"
    folder.mkdir()
    path.mkdir()
    assert ResultStore.reading(path) is None, "not a file"
    path.rmdir()
    with ResultStore(path) as store:
        store.add_run(RunRecord.from_dict(make(real, "r1")))
    reader = ResultStore.reading(str(path))
    assert reader is not None and reader.path == path
    try:
        assert ids(reader.list_runs()) == ["r1"] and reader.get_record("r1").run_id == "r1"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.add_run(RunRecord.from_dict(make(real, "r2")))
    finally:
        reader.close()
    with ResultStore(path) as store:
        assert ids(store.list_runs()) == ["r1"]
    assert sorted(p.name for p in folder.iterdir()) == ["runs.sqlite"], "nothing else created"


@pytest.mark.parametrize("version", [1, SCHEMA_VERSION + 1])
def test_reading_leaves_another_schema_version_alone(tmp_path: Path, version: int) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    before = path.read_bytes()
    assert ResultStore.reading(path) is None
    assert path.read_bytes() == before, "a reader never migrates"


def test_a_page_damaged_past_the_header_is_named_when_a_query_meets_it(tmp_path: Path) -> None:
    """The file opens (its header and schema page are whole) and a query then reads a smashed page: leaving
    the store's `with` block turns that into the same one line naming the database, and closes it."""
    path = tmp_path / "smashed.sqlite"
    ResultStore(path).close()
    size = path.stat().st_size
    with path.open("r+b") as handle:  # garbage over every page after the first
        handle.seek(4096)
        handle.write(bytes((i * 37 + 11) % 256 for i in range(size - 4096)))
    with pytest.raises(UserError) as exc:
        with ResultStore(path, create=False) as store:
            store.list_runs()
    assert one_line(exc) == f"{path}: not a usable results database (database disk image is malformed)"
    with pytest.raises(sqlite3.ProgrammingError):  # closed
        store.conn.execute("SELECT 1")


def test_reading_a_damaged_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "damaged.sqlite"
    path.write_bytes(b"not a database at all " * 50)
    with pytest.raises(UserError) as exc:
        ResultStore.reading(path)
    assert one_line(exc) == f"{path}: not a usable results database (file is not a database)"


# ---- tuned configurations (schema 4) --------------------------------------------------------------

TUNED_KEY = {"model": "null", "model_sha256": "a" * 64, "system_name": "sys", "backend": "onnxruntime",
             "software": "onnxruntime-1.0", "scenario": "Offline"}


def test_a_tuned_configuration_is_stored_replaced_and_found_by_its_key(tmp_path: Path) -> None:
    with db(tmp_path) as store:
        assert store.get_tuned(TUNED_KEY) is None and store.list_tuned() == []
        trials = [{"settings": {"threads": 2}, "value": 10.5, "path": Path("/p")}]
        store.put_tuned(TUNED_KEY, {"threads": 2, "batch": 8}, "offline.samples_per_second", 123.5, trials, "t1",
                        "2026-01-01T00:00:00")
        found = store.get_tuned(TUNED_KEY)
        assert found == {**TUNED_KEY, "settings": {"batch": 8, "threads": 2}, "figure_name": "offline.samples_per_second",
                         "figure_value": 123.5, "trials": [{"path": "/p", "settings": {"threads": 2}, "value": 10.5}],
                         "tuning_id": "t1", "created_at": "2026-01-01T00:00:00"}
        raw = store.conn.execute("SELECT settings_json, trials_json FROM tuned_configs").fetchone()
        assert raw["settings_json"] == '{"batch": 8, "threads": 2}'
        assert raw["trials_json"] == '[{"path": "/p", "settings": {"threads": 2}, "value": 10.5}]'
        # Every part of the key but the model's name decides; the name alone does not.
        for part in ("model_sha256", "system_name", "backend", "software", "scenario"):
            assert store.get_tuned(TUNED_KEY | {part: "other"}) is None, part
        assert store.get_tuned(TUNED_KEY | {"model": "renamed"})["tuning_id"] == "t1"
        # Tuned again: replaced.
        store.put_tuned(TUNED_KEY, {"threads": 4}, "offline.samples_per_second", None, [], "t2", "2026-01-02T00:00:00")
        again = store.get_tuned(TUNED_KEY)
        assert (again["settings"], again["figure_value"], again["trials"], again["tuning_id"]) == ({"threads": 4}, None, [], "t2")
        store.put_tuned(TUNED_KEY | {"scenario": "SingleStream"}, {"threads": 1}, "singlestream.p90_ms", 1.5, [], "t3",
                        "2026-01-03T00:00:00")
        listed = store.list_tuned()
        assert [(t["tuning_id"], t["settings"]) for t in listed] == [("t3", {"threads": 1}), ("t2", {"threads": 4})]
        assert listed[0]["scenario"] == "SingleStream" and listed[0]["figure_value"] == 1.5


def test_a_tuned_configuration_stored_without_trials_has_none(tmp_path: Path) -> None:
    with db(tmp_path) as store:
        store.conn.execute("INSERT INTO tuned_configs (model, model_sha256, system_name, backend, software, scenario, "
                           "settings_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           tuple(TUNED_KEY.values()) + ('{"threads": 3}',))
        assert store.get_tuned(TUNED_KEY)["trials"] == []


def test_a_reader_waits_for_a_writers_exclusive_lock(real: dict, tmp_path: Path) -> None:
    """A writer holding the database exclusively for 6 s (past SQLite's default 5 s wait): a run's
    own process reading it waits (up to 60 s) instead of failing with "database is locked"."""
    path = tmp_path / "busy.sqlite"
    with ResultStore(path) as store:
        store.add_run(RunRecord.from_dict(make(real, "r1")))
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(6.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        reader = ResultStore.reading(path)
        assert reader is not None
        with reader:
            assert ids(reader.list_runs()) == ["r1"]
    finally:
        release.join()
        holder.close()
