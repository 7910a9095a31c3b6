"""run.json files into the results database: `mlharness results import` and a single run's file.

Every file is read as RunRecord.load reads it (checked and migrated), so a bad file is one line that
names it."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from mlharness.records.run_record import RunRecord
from mlharness.store.result_store import ResultStore


def import_run_files(store: ResultStore, paths: Iterable[Path]) -> list[str]:
    """Add run.json files (or every run.json below a folder) to the database; returns their ids.
    Every file is read and checked first, so one bad file stores nothing."""
    records = load_run_files(paths)
    for record in records:
        store.add_run(record)
    return [record.run_id for record in records]


def load_run_files(paths: Iterable[Path]) -> list[RunRecord]:
    """The records of run.json files (or of every run.json below a folder), each read and checked."""
    records: dict[str, RunRecord] = {}
    for path in paths:
        files = sorted(Path(path).rglob("run.json")) if Path(path).is_dir() else [Path(path)]
        for file in files:
            record = RunRecord.load(file)
            # A scenario's view holds a link to its chosen run's own run.json: one run, stored once.
            records.setdefault(record.run_id, record)
    return list(records.values())


def store_record_file(store: ResultStore, path: Path) -> str:
    """Add one run.json to the database; returns its run id."""
    record = RunRecord.load(path)
    store.add_run(record)
    return record.run_id
