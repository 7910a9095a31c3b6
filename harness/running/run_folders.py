"""The results folder's housekeeping around a run's process: checks before a run, the staging folder's
owner, abandoned runs turned into failed ones, the record stored in the database, and what the child
wrote when it started (where it staged, when)."""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord, utc_now
from mlharness.running.request import RunRequest

STAGING_PREFIX = ".staging-"


def check_results_dir(results_dir: Path) -> None:
    """A results directory that can hold runs (created by the run when it is missing), or one line
    saying why not. Nothing is created here: a run refused later must leave nothing behind."""
    if results_dir.exists():
        if not results_dir.is_dir():
            raise UserError(f"--results-dir {results_dir}: exists and is not a directory")
        if not os.access(results_dir, os.W_OK | os.X_OK):
            raise UserError(f"--results-dir {results_dir}: not writable")
        return
    parent = results_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--results-dir {results_dir}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--results-dir {results_dir}: cannot be created ({parent} is not writable)")


def owner_alive(staging: Path) -> bool:
    try:
        owner = json.loads((staging / "owner.json").read_text())
        pid, started = int(owner["pid"]), float(owner["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        # No owner file: a run from before owners were written, or one killed before it wrote it.
        # Only a staging folder untouched for an hour counts as abandoned then.
        try:
            return time.time() - staging.stat().st_mtime < 3600
        except OSError:
            return False
    import psutil

    try:
        process = psutil.Process(pid)
        # The same process (not a reused pid), and not a zombie nobody reaped (as in a container
        # whose init does not reap orphans).
        return abs(process.create_time() - started) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def finalize_abandoned(staging: Path, error: str) -> RunRecord | None:
    """Turn a staging folder whose process is gone into failed-<run id>/ with a failed run.json
    (from the preliminary record the run wrote when it started); returns that record."""
    run_id = staging.name[len(STAGING_PREFIX):]
    target = staging.with_name(f"failed-{run_id}")
    try:
        record = RunRecord.load(staging / "run.json")
    except UserError:  # missing, truncated or not a record: the folder is closed with an ERROR.txt instead
        record = None
    try:
        os.replace(staging, target)
    except FileNotFoundError:
        return None  # another process finalized it first
    (target / "owner.json").unlink(missing_ok=True)
    if record is None:
        write_text(target / "ERROR.txt", error + "\n")
        return None
    record = replace(record, status="failed", error=error, finished_at=utc_now(), results_path=str(target))
    write_json(target / "run.json", record.to_dict())
    return record


def clean_stale_staging(results_dir: Path, store: Callable[[RunRecord], None]) -> list[Path]:
    """Failed-run folders for staging folders of runs whose process is gone (a SIGKILL, a power cut)."""
    cleaned = []
    for staging in sorted(results_dir.glob(f"*/*/*/{STAGING_PREFIX}*")):
        if staging.is_dir() and not owner_alive(staging):
            record = finalize_abandoned(staging, "abandoned: the run's process ended without finishing it "
                                                 "(found and closed by a later run)")
            if record is not None:
                store(record)
            cleaned.append(staging)
    return cleaned


def store_record(record: RunRecord, db_path: Path | None = None) -> None:
    """Add a finished run (ok or failed) to the results database (`db_path`, else its results
    directory's). A database that cannot take it is one line; the run's files stay in place."""
    import sqlite3

    from mlharness.store import result_store

    try:
        if db_path is not None:
            with result_store.ResultStore(db_path) as store:
                store.add_run(record)
        else:
            result_store.record_run(Path(record_results_dir(record)), record)
    except (UserError, sqlite3.Error) as exc:
        raise UserError(f"the run's results are in {record.results_path}, but storing its record failed: "
                        f"{exc}") from None


def record_results_dir(record: RunRecord) -> Path:
    """The results directory a record's folder lives in: <results>/<system>/<model>/<Scenario>/
    runs/<run id>, failed-<run id> or .staging-<run id>."""
    path = Path(record.results_path)
    return path.parents[4] if path.parent.name == "runs" else path.parents[3]


def started_staging(workdir: Path) -> Path | None:
    try:
        return Path(json.loads((workdir / "started.json").read_text())["staging"])
    except (OSError, ValueError, KeyError):
        return None


def timed_out(workdir: Path, request: RunRequest) -> bool:
    try:
        started = json.loads((workdir / "started.json").read_text())["monotonic"]
    except (OSError, ValueError, KeyError):
        return True
    return time.monotonic() - float(started) >= request.timeout

