"""What a gate's --baseline/--candidate REF names: run records.

REF is a run id (or unique prefix) in the results database, a run.json file, a folder (every run
record below it), `sweep:ID` (the runs of a sweep), or a query `latest:key=value,...` over the
database with keys model, scenario, backend, mode, status (default ok), sweep, system and n (how
many of the newest runs, default 1; more than one gives repeats for the noise-aware test)."""
from __future__ import annotations

from pathlib import Path

from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord, read_saved_record
from mlharness.store.result_store import ResultStore, RunFilter

QUERY_KEYS = frozenset({"model", "scenario", "backend", "mode", "status", "sweep", "system", "n"})


def _records_below(folder: Path) -> list[RunRecord]:
    """Every run.json below the folder (a damaged one is an error), and any other JSON file that
    holds a run record (a saved `results show --json`); each checked and migrated by RunRecord."""
    found = []
    for path in sorted(folder.rglob("*.json")):
        record = RunRecord.load(path) if path.name == "run.json" else read_saved_record(path)
        if record is not None:
            found.append(record)
    if not found:
        raise UserError(f"{folder}: no run records (run.json) below this folder")
    return found


def _query(store: ResultStore, text: str, ref: str) -> list[RunRecord]:
    terms: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in QUERY_KEYS:
            raise UserError(f"{ref!r}: expected latest:key=value,... with keys {', '.join(sorted(QUERY_KEYS))}")
        terms[key] = value
    try:
        count = int(terms.pop("n", "1"))
    except ValueError:
        raise UserError(f"{ref!r}: n: expected a whole number of runs") from None
    if count < 1:
        raise UserError(f"{ref!r}: n: expected at least 1")
    flt = RunFilter(model=terms.get("model"), scenario=terms.get("scenario"), backend=terms.get("backend"),
                    mode=terms.get("mode"), status=terms.get("status", "ok"), sweep=terms.get("sweep"),
                    system=terms.get("system"))
    records = store.run_records(flt, limit=count)
    if not records:
        raise UserError(f"{ref!r}: no run in {store.path} matches")
    return records


def _sweep(store: ResultStore, sweep_id: str) -> list[RunRecord]:
    from mlharness.sweeps.sweep import sweep_rows

    records = [row.record for row in sweep_rows(store, sweep_id) if row.record is not None]
    if not records:
        raise UserError(f"sweep:{sweep_id}: the sweep has no recorded runs")
    return records


def resolve(ref: str, db_path: Path) -> list[RunRecord]:
    """The run records one REF names."""
    path = Path(ref)
    if path.is_dir():
        return _records_below(path)
    if path.is_file():
        return [RunRecord.load(path)]
    if ref.endswith(".json"):
        raise UserError(f"{ref}: no such run record file")
    if not db_path.exists():
        raise UserError(f"{ref!r}: not a file, and no results database at {db_path} to look it up in")
    with ResultStore(db_path, create=False) as store:
        if ref.startswith("latest:"):
            return _query(store, ref[len("latest:"):], ref)
        if ref.startswith("sweep:"):
            return _sweep(store, ref[len("sweep:"):])
        return [store.get_record(ref)]


def resolve_all(refs: list[str], db_path: Path) -> list[RunRecord]:
    """Records of several REFs, each run once even when two REFs name it."""
    seen: dict[str, RunRecord] = {}
    for ref in refs:
        for record in resolve(ref, db_path):
            seen.setdefault(record.run_id, record)
    return list(seen.values())
