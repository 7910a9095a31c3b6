"""The results database: every run's record in one SQLite file (results/mlharness.sqlite by default).

The full run.json is stored as JSON beside indexed columns for queries, and its numeric figures in
`run_metrics`; callers give and get RunRecords. Opening a file migrates it to this version
(mlharness.store.schema: the SQL of each version, the stepwise migrations); run.json files are
imported by mlharness.store.run_files."""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord, migrate_record
from mlharness.store.schema import SCHEMA_VERSION, migrate, schema_version

DB_FILENAME = "mlharness.sqlite"
DB_ENV = "MLHARNESS_DB"


def default_db_path(results_dir: Path | str) -> Path:
    """$MLHARNESS_DB when set, else mlharness.sqlite under the results directory."""
    env = os.environ.get(DB_ENV)
    return Path(env) if env else Path(results_dir) / DB_FILENAME


def resolve_db_path(db: str | Path | None, results_dir: Path | str) -> Path:
    return Path(db) if db else default_db_path(results_dir)


@dataclass(frozen=True)
class RunFilter:
    model: str | None = None
    scenario: str | None = None
    backend: str | None = None
    status: str | None = None
    mode: str | None = None
    sweep: str | None = None
    system: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        columns = {"model": "model", "scenario": "scenario", "backend": "backend", "status": "status",
                   "mode": "mode", "sweep": "sweep_id", "system": "system_name"}
        clauses, params = [], []
        for field_name, column in columns.items():
            value = getattr(self, field_name)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class ResultStore:
    """One open results database; use as a context manager."""

    def __init__(self, path: Path | str, create: bool = True):
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise UserError(f"{self.path}: no results database here (run something first, or pass --db)")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: transactions are explicit, so a migration is one atomic step.
            self.conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA foreign_keys = ON")
            migrate(self.conn, self.path)
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: not a usable results database ({exc})") from None

    @classmethod
    def reading(cls, path: Path | str) -> "ResultStore | None":
        """The database opened read-only, as a run's own process reads it (only the launching process
        writes): None when there is no file, or when it is at another schema version than this
        mlharness's (an older one is migrated by the next writer, never by a reader)."""
        path = Path(path)
        if not path.is_file():
            return None
        store = cls.__new__(cls)
        store.path = path
        try:
            store.conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
            store.conn.row_factory = sqlite3.Row
            if schema_version(store.conn) != SCHEMA_VERSION:
                store.conn.close()
                return None
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{path}: not a usable results database ({exc})") from None
        return store

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close()
        # The header opened, but a page read while querying is damaged (or the file is locked, or full):
        # the database is named, in one line, whichever query met it.
        if isinstance(exc, sqlite3.DatabaseError):
            raise UserError(f"{self.path}: not a usable results database ({exc})") from None

    def _transaction(self) -> "_Transaction":
        return _Transaction(self.conn)

    # ---- runs ---------------------------------------------------------------------------------

    def add_run(self, record: RunRecord) -> None:
        """Insert or update one run record, checked and migrated first as a record read from a file is
        (a record built by hand can hold an old version or a wrong shape); its sweep columns are kept.
        Its unknown keys (`extra`) are stored with it."""
        if not isinstance(record, RunRecord):  # the dict form is gone: a caller still passing one is a bug
            raise TypeError(f"add_run takes a RunRecord, got {type(record).__name__}")
        data = migrate_record(record.to_dict(), "run record")
        run = RunRecord.from_dict(data)
        metric_name, metric_value = run.headline()
        batch, threads = run.batch_size, run.threads
        row = {
            "run_id": run.run_id, "started_at": run.started_at, "finished_at": run.finished_at,
            "status": run.status or "unknown", "error": run.error, "model": run.model_name,
            "model_version": run.model_ref.version, "model_sha256": run.model_ref.sha256,
            "dataset": run.dataset_ref.name, "dataset_sha256": run.dataset_ref.sha256,
            "backend": run.backend, "scenario": run.scenario, "mode": run.mode,
            "system_name": run.system_name, "results_path": run.results_path,
            "metric_name": metric_name, "metric_value": metric_value,
            "result_valid": None if run.valid is None else int(run.valid),
            "record_schema_version": run.schema_version,
            "record_json": json.dumps(data, default=str, sort_keys=True),
            "batch_size": batch, "threads": threads,
        }
        columns = ", ".join(row)
        updates = ", ".join(f"{c} = excluded.{c}" for c in row if c != "run_id")
        with self._transaction():
            self.conn.execute(f"INSERT INTO runs ({columns}) VALUES ({', '.join('?' * len(row))}) "
                              f"ON CONFLICT (run_id) DO UPDATE SET {updates}", list(row.values()))
            self.conn.execute("DELETE FROM run_metrics WHERE run_id = ?", (run.run_id,))
            self.conn.executemany("INSERT INTO run_metrics (run_id, name, value) VALUES (?, ?, ?)",
                                  [(run.run_id, k, v) for k, v in run.figures().items()])
            self._add_brick_measurements(run)

    def _add_brick_measurements(self, run: RunRecord) -> None:
        """The bricks a layer-benchmark run measured (not those it reused), keyed for reuse."""
        bricks = run.bricks_result
        rows = bricks.measured if bricks else ()
        fingerprint = bricks.summary.fingerprint if bricks and bricks.summary else None
        if not rows or not fingerprint or run.status != "ok":
            return
        self.conn.executemany(
            "INSERT OR REPLACE INTO brick_measurements (brick_key, fingerprint, variant, op_type, label, "
            "descriptor_json, median_ms, ci_low_ms, ci_high_ms, repeats, stable, seconds, run_id, measured_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r["brick_key"], fingerprint, r["variant"], r.get("op_type"), r.get("label"),
              json.dumps(r.get("descriptor"), sort_keys=True, default=str), float(r["median_ms"]), r.get("ci_low_ms"),
              r.get("ci_high_ms"), r.get("repeats"), int(bool(r.get("stable"))), r.get("seconds"), run.run_id,
              run.finished_at) for r in rows])

    def brick_measurements(self, fingerprint: str, keys: Iterable[str]) -> dict[tuple[str, str], dict[str, Any]]:
        """{(brick key, variant): measurement} stored for these keys under this fingerprint."""
        keys = list(dict.fromkeys(keys))
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for start in range(0, len(keys), 500):  # SQLite's limit on bound parameters
            chunk = keys[start:start + 500]
            rows = self.conn.execute(
                f"SELECT * FROM brick_measurements WHERE fingerprint = ? AND brick_key IN ({', '.join('?' * len(chunk))})",
                [fingerprint, *chunk]).fetchall()
            for row in rows:
                found[(row["brick_key"], row["variant"])] = dict(row)
        return found

    # ---- tuned configurations ------------------------------------------------------------------

    def put_tuned(self, key: Mapping[str, str], settings: Mapping[str, Any], figure_name: str,
                  figure_value: float | None, trials: list[dict[str, Any]], tuning_id: str, created_at: str) -> None:
        """Store (replace) the tuned configuration for key {model, model_sha256, system_name, backend,
        software, scenario}."""
        with self._transaction():
            self.conn.execute(
                "INSERT OR REPLACE INTO tuned_configs (model, model_sha256, system_name, backend, software, scenario, "
                "settings_json, figure_name, figure_value, trials_json, tuning_id, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key["model"], key["model_sha256"], key["system_name"], key["backend"], key["software"],
                 key["scenario"], json.dumps(dict(settings), sort_keys=True), figure_name, figure_value,
                 json.dumps(trials, sort_keys=True, default=str), tuning_id, created_at))

    def get_tuned(self, key: Mapping[str, str]) -> dict[str, Any] | None:
        """The tuned configuration for this key, with its settings and trials decoded, or None."""
        row = self.conn.execute(
            "SELECT * FROM tuned_configs WHERE model_sha256 = ? AND system_name = ? AND backend = ? AND software = ? "
            "AND scenario = ?", (key["model_sha256"], key["system_name"], key["backend"], key["software"],
                                 key["scenario"])).fetchone()
        if row is None:
            return None
        found = dict(row)
        found["settings"] = json.loads(found.pop("settings_json"))
        found["trials"] = json.loads(found.pop("trials_json") or "[]")
        return found

    def list_tuned(self) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT * FROM tuned_configs ORDER BY created_at DESC").fetchall()
        return [dict(row) | {"settings": json.loads(row["settings_json"])} for row in rows]

    def count_brick_measurements(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM brick_measurements").fetchone()[0])

    def get_record(self, run_id: str) -> RunRecord:
        """The record of a run by id or a unique id prefix, migrated to this version (unknown keys in
        its `extra`, so it can be written back whole)."""
        rows = self.conn.execute("SELECT run_id, record_json FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' "
                                 "ORDER BY run_id LIMIT 3", (run_id, _like_prefix(run_id))).fetchall()
        exact = [r for r in rows if r["run_id"] == run_id]
        if exact:
            rows = exact
        if not rows:
            raise UserError(f"{self.path}: no run with id {run_id!r}")
        if len(rows) > 1:
            raise UserError(f"{self.path}: run id prefix {run_id!r} is ambiguous "
                            f"({', '.join(r['run_id'] for r in rows)}, ...)")
        return self.record_of(rows[0])

    def record_of(self, row: sqlite3.Row) -> RunRecord:
        """The record of one index row (list_runs'), migrated; a UserError naming the run when this
        mlharness cannot read it, so a reader of many runs can skip it with the reason."""
        return RunRecord.from_json_dict(json.loads(row["record_json"]), f"{self.path}: run {row['run_id']}")

    def list_runs(self, flt: RunFilter = RunFilter(), limit: int | None = None) -> list[sqlite3.Row]:
        """Index rows, newest first."""
        where, params = flt.where()
        sql = f"SELECT * FROM runs{where} ORDER BY started_at DESC, rowid DESC"  # rowid: insertion order within a second
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self.conn.execute(sql, params).fetchall()

    def run_records(self, flt: RunFilter = RunFilter(), limit: int | None = None) -> list[RunRecord]:
        """Records of the matching runs, newest first, each migrated as get_record's."""
        return [self.record_of(row) for row in self.list_runs(flt, limit)]

    def run_metrics(self, run_id: str) -> dict[str, float]:
        rows = self.conn.execute("SELECT name, value FROM run_metrics WHERE run_id = ?", (run_id,))
        return {r["name"]: r["value"] for r in rows}

    def tag_run(self, run_id: str, sweep_id: str, cell_key: str, repeat_index: int) -> None:
        with self._transaction():
            self.conn.execute("UPDATE runs SET sweep_id = ?, cell_key = ?, repeat_index = ? WHERE run_id = ?",
                              (sweep_id, cell_key, repeat_index, run_id))

    # ---- sweeps -------------------------------------------------------------------------------

    def start_sweep(self, sweep_id: str, name: str, grid_path: str, grid: Mapping[str, Any], now: str) -> None:
        with self._transaction():
            self.conn.execute(
                "INSERT INTO sweeps (sweep_id, name, grid_path, grid_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (sweep_id) DO UPDATE SET name = excluded.name, "
                "grid_path = excluded.grid_path, grid_json = excluded.grid_json, updated_at = excluded.updated_at",
                (sweep_id, name, grid_path, json.dumps(grid, sort_keys=True, default=str), now, now))

    def record_cell(self, sweep_id: str, cell_key: str, repeat_index: int, params: Mapping[str, Any],
                    status: str, run_id: str | None, error: str | None, stderr: str | None,
                    started_at: str, finished_at: str, seconds: float) -> None:
        with self._transaction():
            self.conn.execute(
                "INSERT OR REPLACE INTO sweep_cells (sweep_id, cell_key, repeat_index, params_json, status, run_id, "
                "error, stderr, started_at, finished_at, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sweep_id, cell_key, repeat_index, json.dumps(params, sort_keys=True), status, run_id, error,
                 stderr, started_at, finished_at, seconds))
            if run_id:
                self.conn.execute("UPDATE runs SET sweep_id = ?, cell_key = ?, repeat_index = ? WHERE run_id = ?",
                                  (sweep_id, cell_key, repeat_index, run_id))

    def finished_cells(self, sweep_id: str) -> dict[tuple[str, int], str]:
        rows = self.conn.execute("SELECT cell_key, repeat_index, status FROM sweep_cells WHERE sweep_id = ?",
                                 (sweep_id,))
        return {(r["cell_key"], r["repeat_index"]): r["status"] for r in rows}

    def sweep_cells(self, sweep_id: str) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM sweep_cells WHERE sweep_id = ? ORDER BY started_at, cell_key, "
                                 "repeat_index", (sweep_id,)).fetchall()

    def get_sweep(self, sweep_id: str) -> sqlite3.Row:
        row = self.conn.execute("SELECT * FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()
        if row is None:
            known = ", ".join(r["sweep_id"] for r in self.list_sweeps()) or "none"
            raise UserError(f"{self.path}: no sweep {sweep_id!r} (known: {known})")
        return row

    def list_sweeps(self) -> list[sqlite3.Row]:
        return self.conn.execute(
            "SELECT s.*, (SELECT COUNT(*) FROM sweep_cells c WHERE c.sweep_id = s.sweep_id) AS cells, "
            "(SELECT COUNT(*) FROM sweep_cells c WHERE c.sweep_id = s.sweep_id AND c.status = 'ok') AS ok "
            "FROM sweeps s ORDER BY updated_at DESC").fetchall()


class _Transaction:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def record_run(results_dir: Path, record: RunRecord) -> None:
    """Store a finished run (ok or failed) in its results directory's database."""
    with ResultStore(default_db_path(results_dir)) as store:
        store.add_run(record)
