"""Run a sweep grid: each cell in its own worker process with a timeout, recorded in the results
database. A failing cell is data (status, error, stderr) and the sweep goes on; finished cells are
skipped when the same sweep id is run again, so an interrupted sweep resumes where it stopped. The
cells run in mlharness.sweeps.cell_loop's one loop, on this machine's one slot or (--cluster) on the
slots of a Ray cluster's nodes (mlharness.cluster.scheduler)."""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TextIO

from mlharness.errors import UserError
from mlharness.records import record_metrics
from mlharness.records.run_record import RunRecord, utc_now
from mlharness.running.launcher import LocalLauncher
from mlharness.running.outcome import Launcher
from mlharness.running.progress import Steps
from mlharness.store.result_store import ResultStore
from mlharness.sweeps.cell_loop import CellJob, CellOutcome, CellSlots, LocalSlots, run_cells
from mlharness.sweeps.sweep_grid import Cell, Grid, load_grid
from mlharness.tables import format_table


@dataclass
class SweepOptions:
    results_dir: Path
    db_path: Path
    sweep_id: str | None = None
    rerun: bool = False
    retry_failed: bool = False
    repeat: int | None = None
    timeout_s: float | None = None
    quick: bool | None = None
    extra_settings: list[str] = field(default_factory=list)
    dry_run: bool = False
    quiet: bool = False  # no live progress (each cell's line is still printed)


@dataclass
class SweepResult:
    sweep_id: str
    planned: int
    skipped: int
    outcomes: list[CellOutcome]

    @property
    def failed(self) -> list[CellOutcome]:
        return [o for o in self.outcomes if o.status != "ok"]


def _with_options(grid: Grid, options: SweepOptions) -> list[Cell]:
    cells = []
    for cell in grid.cells:
        overrides = dict(item.partition("=")[::2] for item in cell.overrides)
        for item in options.extra_settings:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UserError(f"--set {item!r}: expected key=value")
            overrides[key.strip()] = value.strip()
        quick = cell.quick if options.quick is None else options.quick
        cells.append(Cell(replace(cell.request, quick=quick,
                                  overrides=tuple(f"{k}={v}" for k, v in sorted(overrides.items())))))
    return cells


# The slots a sweep's cells run on, made once the cells to do are known: local_slots here,
# mlharness.cluster.scheduler.node_slots on a Ray cluster.
SlotsFactory = Callable[[list[CellJob], "SweepOptions", Grid, TextIO], CellSlots]


def run_sweep(grid_path: Path, options: SweepOptions, stream: TextIO | None = None,
              slots: SlotsFactory | None = None) -> SweepResult:
    """Run every cell x repeat not already finished in this sweep id; returns what ran. `slots` makes
    what the cells run on (default local_slots: one at a time on this machine)."""
    stream = stream or sys.stderr
    grid = load_grid(grid_path)
    cells = _with_options(grid, options)
    repeat = options.repeat or grid.repeat
    timeout_s = options.timeout_s or grid.timeout_s
    sweep_id = options.sweep_id or grid.name
    plan = [(cell, i) for cell in cells for i in range(repeat)]
    if options.dry_run:  # writes nothing, not even an empty database
        done: dict = {}
        if Path(options.db_path).exists():
            with ResultStore(options.db_path, create=False) as store:
                done = store.finished_cells(sweep_id)
        for cell, i in plan:
            state = done.get((cell.key, i), "to run")
            print(f"{cell.key}  repeat {i}  {cell.label()}  [{state}]", file=stream)
        return SweepResult(sweep_id, len(plan), len(plan), [])
    with ResultStore(options.db_path) as store:
        done = store.finished_cells(sweep_id)
        todo = [(cell, i) for cell, i in plan
                if options.rerun or done.get((cell.key, i)) is None
                or (options.retry_failed and done.get((cell.key, i)) != "ok")]
        # The plan is stored so the sweep's tables show the current grid's cells, not cells of edits past.
        store.start_sweep(sweep_id, grid.name, str(grid.path),
                          {"grid": grid.document, "repeat": repeat, "cells": sorted({c.key for c in cells})}, utc_now())
    print(f"sweep {sweep_id}: {len(plan)} cell run(s), {len(plan) - len(todo)} already finished, "
          f"{len(todo)} to run (timeout {timeout_s:g} s each)", file=stream)
    results_dir = Path(options.results_dir).resolve()
    # The cell's own plan and progress lines would only fill the output kept for a failed cell.
    jobs = [CellJob(cell, i, cell.label() + (f" #{i + 1}" if repeat > 1 else ""),
                    replace(cell.request_for(results_dir, timeout_s), quiet=True)) for cell, i in todo]
    outcomes = run_cells(jobs, (slots or local_slots)(jobs, options, grid, stream), sweep_id, options.db_path)
    return SweepResult(sweep_id, len(plan), len(plan) - len(todo), outcomes)


def local_slots(jobs: list[CellJob], options: SweepOptions, grid: Grid, stream: TextIO) -> CellSlots:
    """One cell at a time on this machine, each in a fresh process (LocalLauncher) with the sweep's
    timeout, its record stored in the sweep's database from here."""
    db_path = Path(options.db_path).resolve()

    def launcher_for(output: Path) -> Launcher:
        return LocalLauncher(db_path=db_path, output=output)

    return LocalSlots(launcher_for, Steps(len(jobs), stream, quiet=options.quiet, unit="cells"))


# ---- reading a sweep back --------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRow:
    """One recorded cell run of a sweep (its sweep_cells row) with its run's record."""
    cell: Cell
    repeat_index: int
    status: str
    run_id: str | None
    error: str | None
    seconds: float | None
    record: RunRecord | None  # None when the cell failed before a run existed


def sweep_rows(store: ResultStore, sweep_id: str) -> list[SweepRow]:
    """Every recorded cell run of the sweep's current plan, with its record."""
    plan = json.loads(store.get_sweep(sweep_id)["grid_json"] or "{}")
    planned, repeat = set(plan.get("cells") or []), int(plan.get("repeat") or 0)
    rows = []
    for cell_row in store.sweep_cells(sweep_id):
        if planned and (cell_row["cell_key"] not in planned or cell_row["repeat_index"] >= repeat):
            continue
        record = None
        if cell_row["run_id"]:
            try:
                record = store.get_record(cell_row["run_id"])
            except UserError:
                record = None
        rows.append(SweepRow(Cell.from_params(json.loads(cell_row["params_json"])), cell_row["repeat_index"],
                             cell_row["status"], cell_row["run_id"], cell_row["error"], cell_row["seconds"], record))
    return rows


def best_configurations(rows: list[SweepRow]) -> list[dict[str, Any]]:
    """Per scenario and model: the cell with the best median headline figure over its ok repeats."""
    by_cell: dict[str, dict[str, Any]] = {}
    for row in rows:
        record = row.record
        if row.status != "ok" or record is None:
            continue
        name, value = record_metrics.headline(record)
        if value is None:
            continue
        entry = by_cell.setdefault(row.cell.key, {"cell": row.cell, "metric": name, "values": [],
                                                     "backend": record.backend})
        entry["values"].append(value)
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in by_cell.values():
        entry["median"] = statistics.median(entry["values"])
        group = (entry["cell"].scenario, entry["cell"].model)
        higher = record_metrics.higher_is_better(entry["metric"])
        current = best.get(group)
        if current is None or (entry["median"] > current["median"] if higher else entry["median"] < current["median"]):
            best[group] = entry
    return [best[k] for k in sorted(best)]


def best_table(rows: list[SweepRow]) -> str:
    table = [(e["cell"].scenario, e["cell"].model, e["backend"], e["cell"].setting("max_batch_size"),
              e["cell"].setting("intra_op_threads"),
              " ".join([f"{k}={v}" for k, v in e["cell"].manifests().items()]
                       + [o for o in e["cell"].overrides if not o.startswith(("max_batch_size=", "intra_op_threads="))]),
              e["metric"].partition(".")[2], e["median"], len(e["values"])) for e in best_configurations(rows)]
    if not table:
        return "no successful cells: no best configuration"
    return format_table(("scenario", "model", "backend", "batch", "threads", "other settings", "metric",
                         "median", "runs"), table)


def sweep_summary(store: ResultStore, sweep_id: str) -> str:
    rows = sweep_rows(store, sweep_id)
    table = []
    for row in rows:
        value = record_metrics.headline(row.record)[1] if row.record else None
        error = (row.error or "")[:80] or None
        table.append((row.cell.key[:8], row.repeat_index, row.cell.label(), row.status, row.seconds, value,
                      row.run_id, error))
    return "\n".join([f"sweep {sweep_id}: {len(rows)} cell run(s)",
                      format_table(("cell", "rep", "configuration", "status", "seconds", "headline", "run id",
                                    "error"), table),
                      "", "best configuration per scenario and model:", best_table(rows)])
