"""The results database's schema: the SQL of each version and the stepwise migrations between them.

The version is SQLite's `user_version`; an older file is migrated forward one step at a time, each
in its own transaction, and a newer one refused rather than guessed at (mlharness.store.result_store
opens the file and calls `migrate`)."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Callable

from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord

# Version 1: runs, their figures, and a key/value table.
_V1 = """
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
"""

# Version 2: sweeps. Runs gain the sweep cell they ran for and their batch size and thread count
# (backfilled from the stored JSON), so sweep tables and plots need no JSON parsing.
_V2 = """
ALTER TABLE runs ADD COLUMN sweep_id TEXT;
ALTER TABLE runs ADD COLUMN cell_key TEXT;
ALTER TABLE runs ADD COLUMN repeat_index INTEGER;
ALTER TABLE runs ADD COLUMN batch_size INTEGER;
ALTER TABLE runs ADD COLUMN threads INTEGER;
CREATE INDEX runs_sweep ON runs (sweep_id, cell_key);
CREATE TABLE sweeps (
  sweep_id TEXT PRIMARY KEY, name TEXT, grid_path TEXT, grid_json TEXT,
  created_at TEXT, updated_at TEXT
);
CREATE TABLE sweep_cells (
  sweep_id TEXT NOT NULL REFERENCES sweeps (sweep_id) ON DELETE CASCADE,
  cell_key TEXT NOT NULL, repeat_index INTEGER NOT NULL,
  params_json TEXT NOT NULL, status TEXT NOT NULL, run_id TEXT,
  error TEXT, stderr TEXT, started_at TEXT, finished_at TEXT, seconds REAL,
  PRIMARY KEY (sweep_id, cell_key, repeat_index)
);
"""


# Version 3: brick measurements (mlharness.bricks). One row per brick key, fingerprint (the system and
# runtime it was measured on) and variant (threads, optimization level, execution provider), so a later
# model or invocation on the same fingerprint reuses it instead of measuring it again.
_V3 = """
CREATE TABLE brick_measurements (
  brick_key TEXT NOT NULL, fingerprint TEXT NOT NULL, variant TEXT NOT NULL,
  op_type TEXT, label TEXT, descriptor_json TEXT,
  median_ms REAL NOT NULL, ci_low_ms REAL, ci_high_ms REAL, repeats INTEGER, stable INTEGER, seconds REAL,
  run_id TEXT, measured_at TEXT,
  PRIMARY KEY (brick_key, fingerprint, variant)
);
"""


# Version 4: tuned configurations (`mlharness tune`): the best settings found for a model manifest on
# a system, backend and software, per scenario; a later run there starts from them (settings layer
# "tuned"), and the search's trials are kept as JSON beside them.
_V4 = """
CREATE TABLE tuned_configs (
  model TEXT NOT NULL, model_sha256 TEXT NOT NULL, system_name TEXT NOT NULL, backend TEXT NOT NULL,
  software TEXT NOT NULL, scenario TEXT NOT NULL,
  settings_json TEXT NOT NULL, figure_name TEXT, figure_value REAL, trials_json TEXT,
  tuning_id TEXT, created_at TEXT,
  PRIMARY KEY (model_sha256, system_name, backend, software, scenario)
);
"""


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    """Statement by statement: executescript() would commit the migration's open transaction."""
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _migrate_v2(conn: sqlite3.Connection) -> None:
    _run_script(conn, _V2)
    for run_id, text in conn.execute("SELECT run_id, record_json FROM runs").fetchall():
        try:
            record = RunRecord.from_json_dict(json.loads(text), f"run {run_id}")
            batch, threads = record.batch_size, record.threads
        except UserError:  # a record this mlharness cannot read keeps empty columns, not a failed migration
            batch, threads = None, None
        conn.execute("UPDATE runs SET batch_size = ?, threads = ? WHERE run_id = ?", (batch, threads, run_id))


# MIGRATIONS[n] takes a version-n database to version n+1; version 0 is an empty file.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    lambda conn: _run_script(conn, _V1),
    _migrate_v2,
    lambda conn: _run_script(conn, _V3),
    lambda conn: _run_script(conn, _V4),
]
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, path: Path, target: int = SCHEMA_VERSION) -> int:
    """Bring the database up to `target`, one transaction per step; refuse a newer file."""
    version = schema_version(conn)
    if version > SCHEMA_VERSION:
        raise UserError(f"{path}: results database schema version {version} is newer than this mlharness "
                        f"supports ({SCHEMA_VERSION}); upgrade mlharness or pass another --db")
    while version < target:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if schema_version(conn) == version:  # another process may have migrated it meanwhile
                MIGRATIONS[version](conn)
                conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        version = schema_version(conn)
    return version
