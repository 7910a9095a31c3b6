"""A sweep's own steps, each taken alone (mlharness.sweeps.sweep and mlharness.sweeps.cell_loop), written
for mutation testing of the sweeps module:

- reading a sweep back (sweep_rows, best_configurations, best_table, sweep_summary) and writing one
  cell's result (cell_result, record_cell_run): a real results database in tmp_path filled by the
  product's own writers, with run records made here (their headline figures chosen), exact rows and
  exact text;
- the grid with the command's options (_with_options), local_slots and LocalSlots, and run_sweep: real
  sweeps of the null model (its cells take a fraction of a second) and of a model that does not exist
  (its cells fail at once); one sweep shared by the tests that only read it;
- the one loop (run_cells, _Loop) on what only a cluster's slots do (a cell given back, one that never
  started, one no slot can take, the node it ran on, a stop with cells cancelled elsewhere):
  ScriptedSlots, a small real CellSlots written here;
- _StopSignals: SIGINT and SIGTERM sent to this process inside `with` blocks, the handlers put back.

Nothing waits on the clock: a signal is sent once the event it must land in has happened."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from mlharness.errors import RunInterrupted, UserError
from mlharness.records.run_record import RunRecord, utc_now
from mlharness.running.launcher import GRACE_SECONDS, LocalLauncher
from mlharness.running.outcome import Outcome
from mlharness.running.progress import Steps
from mlharness.store.result_store import ResultStore
from mlharness.sweeps.cell_loop import (
    STDERR_KEPT_CHARS,
    CellEvent,
    CellJob,
    CellOutcome,
    LocalSlots,
    _StopSignals,
    cell_result,
    record_cell_run,
    run_cells,
)
from mlharness.sweeps.sweep import (
    SweepOptions,
    SweepResult,
    SweepRow,
    _with_options,
    best_configurations,
    best_table,
    local_slots,
    run_sweep,
    sweep_rows,
    sweep_summary,
)
from mlharness.sweeps.sweep_grid import Cell, load_grid
from tests.support import HOUR_LONG_TIMEOUT_S, hour_long_null, null_model_with, wait_for, write_manifest

NOW = "2026-01-01T00:00:00+00:00"
NO_MODEL = "no model manifest named 'no-such-model' under "


def a_record(run_id: str, value: float | None, *, scenario: str = "Offline", model: str = "null",
             backend: str = "null", status: str = "ok", error: str | None = None) -> RunRecord:
    """A run record whose scenario's headline figure is `value` (None: no performance at all)."""
    figure = {"Offline": "samples_per_second", "SingleStream": "p90_latency_ns"}[scenario]
    return RunRecord(run_id=run_id, command=f"mlharness run {model}", model={"name": model, "version": "1.0.0"},
                     dataset={"name": "null-samples", "version": "1.0.0"}, backend=backend, scenario=scenario,
                     mode="performance", status=status, error=error, started_at=NOW,
                     performance=None if value is None else {figure: value})


def a_cell(*overrides: str, scenario: str = "Offline", model: str = "null", **fields: Any) -> Cell:
    return Cell.of(model=model, scenario=scenario, overrides=tuple(sorted(overrides)), **fields)


def ok(run_id: str) -> dict[str, Any]:
    return {"status": "ok", "run_id": run_id, "error": None, "stderr": "its output\n"}


def failed(error: str, run_id: str | None = None, stderr: str = "its output\n") -> dict[str, Any]:
    return {"status": "failed", "run_id": run_id, "error": error, "stderr": stderr, "exit_status": 1}


def cell_rows(db: Path, sweep_id: str) -> list[dict[str, Any]]:
    with ResultStore(db) as store:
        return [dict(row) for row in store.sweep_cells(sweep_id)]


# ---- one cell's result, as the sweep records it ---------------------------------------------------

def test_a_finished_runs_result_is_its_records_status_id_and_error_with_the_output_as_is() -> None:
    record = a_record("r-1", 5.0, status="failed", error="it broke")
    assert cell_result(Outcome(kind="result", record=record), "x" * 9000) == {
        "status": "failed", "run_id": "r-1", "error": "it broke", "stderr": "x" * 9000}
    assert cell_result(Outcome(kind="result", record=a_record("r-2", 5.0)), "") == {
        "status": "ok", "run_id": "r-2", "error": None, "stderr": ""}


def test_an_error_outcome_is_a_failed_cell_with_the_error_line_mlharness_run_would_print() -> None:
    outcome = Outcome(kind="error", record=a_record("r-3", None, status="failed"), error="run failed: boom",
                      traceback_path="/tmp/tb.txt", exit_status=143)
    assert cell_result(outcome, "before\n") == {
        "status": "failed", "run_id": "r-3", "error": "run failed: boom (traceback in /tmp/tb.txt)",
        "stderr": "before\nmlharness: error: run failed: boom (traceback in /tmp/tb.txt)\n", "exit_status": 143}
    # A result without a record, and no error said: "failed", no run.
    assert cell_result(Outcome(kind="result"), "") == {
        "status": "failed", "run_id": None, "error": "failed", "stderr": "mlharness: error: failed\n",
        "exit_status": 0}


def test_a_failed_cells_output_keeps_only_its_last_characters_with_the_error_line() -> None:
    result = cell_result(Outcome(kind="error", error="gone", exit_status=1), "a" + "x" * STDERR_KEPT_CHARS)
    assert STDERR_KEPT_CHARS == 8000
    line = "mlharness: error: gone\n"
    assert result["stderr"] == "x" * (8000 - len(line)) + line and len(result["stderr"]) == 8000


def test_a_cell_run_is_stored_with_its_params_times_and_the_output_only_when_it_failed(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    cell, other = a_cell("max_batch_size=4"), a_cell("max_batch_size=8")
    with ResultStore(db) as store:
        store.add_run(a_record("r-ok", 10.0))
        store.start_sweep("s", "s", "grid.yaml", {}, NOW)
    before = utc_now()
    done = record_cell_run(db, "s", cell, 2, ok("r-ok"), NOW, 1.23456)
    again = record_cell_run(db, "s", other, 0, {"status": "failed", "stderr": "tail\n"}, "", 0.5)
    after = utc_now()
    assert done == CellOutcome(cell, 2, "ok", "r-ok", None, 1.23456)
    assert again == CellOutcome(other, 0, "failed", None, None, 0.5)
    first, second = sorted(cell_rows(db, "s"), key=lambda row: row["repeat_index"], reverse=True)
    assert before <= first.pop("finished_at") <= after and before <= second.pop("finished_at") <= after
    assert first == {"sweep_id": "s", "cell_key": cell.key, "repeat_index": 2,
                     "params_json": json.dumps(cell.params(), sort_keys=True), "status": "ok", "run_id": "r-ok",
                     "error": None, "stderr": None, "started_at": NOW, "seconds": 1.235}
    assert second == {"sweep_id": "s", "cell_key": other.key, "repeat_index": 0,
                      "params_json": json.dumps(other.params(), sort_keys=True), "status": "failed", "run_id": None,
                      "error": None, "stderr": "tail\n", "started_at": "", "seconds": 0.5}
    with ResultStore(db) as store:  # the run is tagged with its sweep and cell
        (run,) = store.list_runs()
        assert (run["sweep_id"], run["cell_key"], run["repeat_index"]) == ("s", cell.key, 2)
    # The same cell and repeat again: its row is replaced, the error kept.
    assert record_cell_run(db, "s", other, 0, failed("it broke", stderr="again\n"), NOW, 2.0) == CellOutcome(
        other, 0, "failed", None, "it broke", 2.0)
    (row,) = [r for r in cell_rows(db, "s") if r["cell_key"] == other.key]
    assert (row["status"], row["error"], row["stderr"], row["seconds"]) == ("failed", "it broke", "again\n", 2.0)


# ---- reading a sweep back -------------------------------------------------------------------------

A = a_cell("max_batch_size=4", "target_qps=20000")
B = a_cell("intra_op_threads=2", "max_batch_size=8", hardware="cpu-1t")
C = a_cell("max_batch_size=2")
UNPLANNED = a_cell("max_batch_size=16")


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """A sweep "s" of three cells x 2 repeats as its plan says, recorded by record_cell_run: A's two runs
    ok (100 and 300 samples/s), B's first ok (250), its second failed naming a run the database does not
    hold, C's first failed before a run existed; and two rows the plan no longer has (B's third repeat, a
    cell since dropped from the grid)."""
    db = tmp_path / "db.sqlite"
    with ResultStore(db) as store:
        for run_id, value in (("r-a0", 100.0), ("r-a1", 300.0), ("r-b0", 250.0), ("r-old", 999.0)):
            store.add_run(a_record(run_id, value))
        store.start_sweep("s", "s", "grid.yaml", {"grid": {}, "repeat": 2, "cells": sorted([A.key, B.key, C.key])}, NOW)
    for cell, repeat, result, second, seconds in (
            (A, 0, ok("r-a0"), 1, 1.5), (A, 1, ok("r-a1"), 2, 2.25), (B, 0, ok("r-b0"), 3, 0.5),
            (B, 1, failed("e" * 100, run_id="r-gone"), 4, 3.0), (B, 2, ok("r-old"), 5, 1.0),
            (UNPLANNED, 0, ok("r-old"), 6, 1.0), (C, 0, failed(""), 7, 0.25)):
        record_cell_run(db, "s", cell, repeat, result, f"2026-01-01T00:00:0{second}+00:00", seconds)
    return db


def test_the_rows_of_a_sweep_are_its_plans_cell_runs_in_order_with_their_records(recorded: Path) -> None:
    with ResultStore(recorded) as store:
        rows = sweep_rows(store, "s")
    assert rows == [
        SweepRow(A, 0, "ok", "r-a0", None, 1.5, a_record("r-a0", 100.0)),
        SweepRow(A, 1, "ok", "r-a1", None, 2.25, a_record("r-a1", 300.0)),
        SweepRow(B, 0, "ok", "r-b0", None, 0.5, a_record("r-b0", 250.0)),
        SweepRow(B, 1, "failed", "r-gone", "e" * 100, 3.0, None),  # no such run: no record
        SweepRow(C, 0, "failed", None, "", 0.25, None),
    ]


def test_a_sweep_whose_plan_names_no_cells_shows_every_row(recorded: Path) -> None:
    """The sweeps of versions that stored no plan (start_sweep's grid without cells)."""
    with ResultStore(recorded) as store:
        store.start_sweep("s", "s", "grid.yaml", {}, NOW)
        rows = sweep_rows(store, "s")
        assert [(row.cell, row.repeat_index, row.run_id) for row in rows] == [
            (A, 0, "r-a0"), (A, 1, "r-a1"), (B, 0, "r-b0"), (B, 1, "r-gone"), (B, 2, "r-old"), (UNPLANNED, 0, "r-old"),
            (C, 0, None)]
        with pytest.raises(UserError, match="no sweep 'nope' \\(known: s\\)"):
            sweep_rows(store, "nope")


def row(cell: Cell, value: float | None, status: str = "ok", **record: Any) -> SweepRow:
    run_id = f"{cell.key[:4]}-{value}"
    return SweepRow(cell, 0, status, run_id, None, 1.0, a_record(run_id, value, scenario=cell.scenario,
                                                                    model=cell.model, **record))


SS = a_cell("max_batch_size=1", scenario="SingleStream")
SS_TIE = a_cell("max_batch_size=2", scenario="SingleStream")
SS_SLOW = a_cell("max_batch_size=3", scenario="SingleStream")
TIE = a_cell("max_batch_size=32")
ALPHA = a_cell(model="alpha")


def test_the_best_configuration_is_the_best_median_of_ok_runs_per_scenario_and_model() -> None:
    rows = [row(SS, 2000.0), row(SS, 1000.0), row(SS_SLOW, 1800.0), row(SS_TIE, 1500.0),  # lower is better
            row(A, 100.0), row(A, 300.0, backend="other"), row(A, 200.0),  # median 200
            row(B, 900.0, status="failed"),  # a failed run's figure counts for nothing
            SweepRow(B, 1, "ok", None, None, 1.0, None),  # no record
            row(B, None),  # no figure
            row(TIE, 200.0),  # as good as A, after it: A stays
            row(UNPLANNED, 150.0), row(ALPHA, 1.0)]
    assert best_configurations(rows) == [
        {"cell": ALPHA, "metric": "offline.samples_per_second", "values": [1.0], "backend": "null", "median": 1.0},
        {"cell": A, "metric": "offline.samples_per_second", "values": [100.0, 300.0, 200.0], "backend": "null",
         "median": 200.0},
        {"cell": SS, "metric": "singlestream.p90_latency_ns", "values": [2000.0, 1000.0], "backend": "null",
         "median": 1500.0}]
    # Alone, a later better cell wins in either direction.
    assert [e["cell"] for e in best_configurations([row(A, 100.0), row(TIE, 100.5)])] == [TIE]
    assert [e["cell"] for e in best_configurations([row(SS_SLOW, 1800.0), row(SS, 1799.0)])] == [SS]
    assert best_configurations([row(B, 900.0, status="failed"), row(B, None)]) == []


def table_cells(text: str) -> list[list[str]]:
    """A format_table text as its rows of cells (the header's first), cut at its dash line's columns."""
    header, dashes, *rows = text.splitlines()
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]
    assert dashes == "  ".join("-" * (end - start) for start, end in spans)
    return [[line[start:end if i < len(spans) - 1 else None].strip() for i, (start, end) in enumerate(spans)]
            for line in (header, *rows)]


BEST_HEADER = ["scenario", "model", "backend", "batch", "threads", "other settings", "metric", "median", "runs"]


def test_the_best_table_shows_each_best_cells_settings_figure_and_runs() -> None:
    cell = a_cell("intra_op_threads=2", "max_batch_size=8", "target_qps=30", hardware="cpu-1t", dataset="synthetic")
    rows = [row(a_cell(model="alpha", scenario="SingleStream"), 1500.0, backend="onnxruntime"),
            row(cell, 10.0), row(cell, 20.0)]
    assert table_cells(best_table(rows)) == [
        BEST_HEADER,
        ["Offline", "null", "null", "8", "2", "dataset=synthetic hardware=cpu-1t target_qps=30", "samples_per_second",
         "15", "2"],
        ["SingleStream", "alpha", "onnxruntime", "-", "-", "", "p90_latency_ns", "1,500.0", "1"]]
    assert best_table([row(B, 900.0, status="failed")]) == "no successful cells: no best configuration"
    assert best_table([]) == "no successful cells: no best configuration"


def test_the_summary_lists_every_cell_run_then_the_best_configurations(recorded: Path) -> None:
    with ResultStore(recorded) as store:
        text = sweep_summary(store, "s")
    head, rest = text.split("\n\nbest configuration per scenario and model:\n")
    title, table = head.split("\n", 1)
    assert title == "sweep s: 5 cell run(s)"
    a_label, b_label = "null/default/Offline max_batch_size=4 target_qps=20000", \
        "null/default/Offline hardware=cpu-1t intra_op_threads=2 max_batch_size=8"
    assert table_cells(table) == [
        ["cell", "rep", "configuration", "status", "seconds", "headline", "run id", "error"],
        [A.key[:8], "0", a_label, "ok", "1.5", "100", "r-a0", "-"],
        [A.key[:8], "1", a_label, "ok", "2.25", "300", "r-a1", "-"],
        [B.key[:8], "0", b_label, "ok", "0.5", "250", "r-b0", "-"],
        [B.key[:8], "1", b_label, "failed", "3", "-", "r-gone", "e" * 80],  # the error's first 80 characters
        [C.key[:8], "0", "null/default/Offline max_batch_size=2", "failed", "0.25", "-", "-", "-"]]
    assert table_cells(rest) == [BEST_HEADER, ["Offline", "null", "null", "8", "2", "hardware=cpu-1t",
                                               "samples_per_second", "250", "1"]]


# ---- the one loop, on slots that do what a cluster's do --------------------------------------------

class Stray(Exception):
    """A SIGTERM that reached the test's own handler: the sweep did not take it."""


@contextmanager
def signals_of_a_terminal() -> Iterator[None]:
    """SIGINT as a terminal's user has it (Python's default_int_handler: the sweep takes it over; a
    background job, as a test worker may be, inherits it ignored, and the sweep leaves it alone), and a
    SIGTERM that fails the test where the sweep did not take it (rather than ending the test process);
    a KeyboardInterrupt out of the block fails the test too, rather than stopping the whole session.
    The handlers are put back after."""
    def stray(signum: int, frame: Any) -> None:
        raise Stray("SIGTERM reached the test's own handler")

    before = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM, stray)
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail("a KeyboardInterrupt came out of the block: the sweep did not take SIGINT as it should")
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


class ScriptedSlots:
    """A real, small CellSlots (the Protocol) for what only a cluster's slots do, never LocalSlots (a job
    given back, one that never started, one no slot can take, the node it ran on, cells cancelled where
    they ran): `width` slots; each job placed ends at the next wait as `script` says for its label, one
    entry per try: its CellEvent's fields (result, seconds, where, again, stops), None (it never started),
    or a signal, sent to this process while the job runs. The labels in `unplaceable` end at placing,
    failed. stop() answers `stopped`. Each wait notes the statuses the sweep's table holds then (`seen`)."""
    runs_elsewhere = True

    def __init__(self, db: Path, script: dict[str, list[Any]], total: int, *, width: int = 1,
                 unplaceable: tuple[str, ...] = (), stopped: tuple[list[CellEvent], int | None] = ([], None),
                 progress: Steps | None = None):
        self.db, self.script, self.width, self.unplaceable, self.stopped = db, script, width, unplaceable, stopped
        self.progress = progress or Steps(total, stream=io.StringIO(), quiet=True, unit="cells")
        self.running: list[CellJob] = []
        self.placed: list[str] = []
        self.seen: list[dict[str, str]] = []

    def place(self, waiting: deque[CellJob]) -> list[CellEvent]:
        events = []
        while waiting and len(self.running) < self.width:
            job = waiting.popleft()
            if job.label in self.unplaceable:
                events.append(CellEvent(job, {"status": "failed", "run_id": None, "error": f"no slot takes {job.label}"}))
                continue
            job.started_at = NOW
            self.progress.starting(job.label)
            self.running.append(job)
            self.placed.append(job.label)
        return events

    def busy(self) -> bool:
        return bool(self.running)

    def next_done(self) -> list[CellEvent]:
        self.seen.append({row["cell_key"]: row["status"] for row in cell_rows(self.db, "s")})
        ended, self.running = self.running, []
        events = []
        for job in ended:
            step = self.script[job.label].pop(0)
            if isinstance(step, signal.Signals):
                os.kill(os.getpid(), step)
            else:
                events.append(CellEvent(job, None) if step is None else CellEvent(job, **step))
        return events

    def stop(self) -> tuple[list[CellEvent], int | None]:
        return self.stopped


def jobs_of(db: Path, *labels: str) -> list[CellJob]:
    """One job per label (cells of batch 1, 2, ...) of sweep "s", which is started in `db`."""
    with ResultStore(db) as store:
        store.start_sweep("s", "s", "grid.yaml", {}, NOW)
    cells = [a_cell(f"max_batch_size={i + 1}") for i in range(len(labels))]
    return [CellJob(cell, 0, label, cell.request) for cell, label in zip(cells, labels)]


def lines(slots: ScriptedSlots) -> list[str]:
    return slots.progress.stream.getvalue().splitlines()


def test_a_cell_given_back_or_never_started_runs_again_first_and_counts_once(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    a, b, c = jobs = jobs_of(db, "a", "b", "c")
    slots = ScriptedSlots(db, {
        "a": [None, {"result": failed("node lost", run_id="r-lost"), "seconds": 2.0, "again": "a: node lost, again"},
              {"result": ok("r-a"), "seconds": 3.0, "where": " on node-1"}],
        "b": [{"result": failed("it broke"), "seconds": 1.0}]}, 3, unplaceable=("c",))
    outcomes = run_cells(jobs, slots, "s", db)
    assert outcomes == [CellOutcome(a.cell, 0, "ok", "r-a", None, 3.0), CellOutcome(b.cell, 0, "failed", None, "it broke", 1.0),
                        CellOutcome(c.cell, 0, "failed", None, "no slot takes c", 0.0)]
    assert slots.placed == ["a", "a", "a", "b"]  # put back first in line, each time
    # Given back: recorded failed at once (its row replaced when it ends); never started: not recorded.
    assert slots.seen == [{}, {}, {a.cell.key: "failed"}, {a.cell.key: "ok"}]
    assert lines(slots) == ["a: node lost, again", "[1/3] a on node-1: ok (3.0 s), ETA 0:06",
                            "[2/3] b: FAILED: it broke (1.0 s), ETA 0:02", "[3/3] c: FAILED: no slot takes c (0.0 s)"]
    rows = {row["cell_key"]: row for row in cell_rows(db, "s")}
    assert [(rows[j.cell.key]["status"], rows[j.cell.key]["run_id"], rows[j.cell.key]["stderr"],
             rows[j.cell.key]["seconds"]) for j in jobs] == [
        ("ok", "r-a", None, 3.0), ("failed", None, "its output\n", 1.0), ("failed", None, None, 0.0)]
    # A job the slots never started keeps no start time of theirs: it is recorded as of now.
    assert [rows[j.cell.key]["started_at"] for j in (a, b)] == [NOW, NOW]
    started = rows[c.cell.key]["started_at"]
    assert NOW < started <= rows[c.cell.key]["finished_at"]


def test_a_cell_whose_run_was_stopped_by_a_signal_stops_the_sweep_with_its_exit_status(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    a, b = jobs = jobs_of(db, "a", "b")
    slots = ScriptedSlots(db, {"a": [{"result": failed("interrupted by SIGTERM", run_id="r-a"), "seconds": 1.5,
                                      "stops": 143}]}, 2)
    with pytest.raises(RunInterrupted) as stopped:
        run_cells(jobs, slots, "s", db)
    assert (str(stopped.value), stopped.value.exit_status) == (
        "sweep s interrupted; 1 cell run(s) recorded, resume with the same command", 143)
    assert slots.placed == ["a"]  # the next cell never starts
    assert lines(slots) == ["[1/2] a: FAILED: interrupted by SIGTERM (1.5 s), ETA 0:02"]
    assert [(row["cell_key"], row["status"], row["run_id"]) for row in cell_rows(db, "s")] == [(a.cell.key, "failed", "r-a")]


class SignalOnFirstLine(Steps):
    """A sweep's progress that sends SIGINT to this process while its first cell's line is said: after
    that cell's row is written, before the next one's."""

    def finished(self, label: str, status: str, seconds: float) -> None:
        super().finished(label, status, seconds)
        if self.done == 1:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_cells_run_records_what_the_slots_say_ended_and_how_many_they_cancelled(
        tmp_path: Path, stop: signal.Signals) -> None:
    with signals_of_a_terminal():
        db = tmp_path / "db.sqlite"
        a, b = jobs = jobs_of(db, "a", "b")
        # The slots' own word for a: it ended stopped (its event's exit status is not the sweep's: the signal's is).
        ended = CellEvent(a, failed("interrupted", run_id="r-a"), 2.0, where=" on node-1", stops=130)
        # A second SIGINT comes while that is recorded: the sweep is stopping already, and says so once.
        slots = ScriptedSlots(db, {"a": [stop], "b": [stop]}, 2, width=2, stopped=([ended], 1),
                              progress=SignalOnFirstLine(2, stream=io.StringIO(), quiet=True, unit="cells"))
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        with pytest.raises(RunInterrupted) as stopped:
            run_cells(jobs, slots, "s", db)
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        assert (str(stopped.value), stopped.value.exit_status) == (
            "sweep s interrupted; 1 cell run(s) recorded, 1 cancelled on their nodes; resume with the same command",
            128 + stop)
        assert lines(slots) == ["[1/2] a on node-1: FAILED: interrupted (2.0 s), ETA 0:02"]
        assert [(row["cell_key"], row["status"], row["run_id"]) for row in cell_rows(db, "s")] == [(a.cell.key, "failed", "r-a")]


def test_a_signal_while_ended_cells_are_recorded_stops_the_sweep_once_all_are(tmp_path: Path) -> None:
    with signals_of_a_terminal():
        db = tmp_path / "db.sqlite"
        jobs = jobs_of(db, "a", "b", "c")
        slots = ScriptedSlots(db, {"a": [{"result": ok("r-a"), "seconds": 1.0}], "b": [{"result": ok("r-b"), "seconds": 1.0}]},
                              3, width=2, stopped=([], 0),
                              progress=SignalOnFirstLine(3, stream=io.StringIO(), quiet=True, unit="cells"))
        with pytest.raises(RunInterrupted) as stopped:
            run_cells(jobs, slots, "s", db)
        assert (str(stopped.value), stopped.value.exit_status) == (
            "sweep s interrupted; 2 cell run(s) recorded, 0 cancelled on their nodes; resume with the same command", 130)
        assert [row["run_id"] for row in cell_rows(db, "s")] == ["r-a", "r-b"] and slots.placed == ["a", "b"]


class SignalWhilePlacing(ScriptedSlots):
    """Slots that get SIGINT while they start their first job, before they know it as running (a cluster's
    task submitted, its reference not yet kept); stop() cancels what they know as running."""

    def place(self, waiting: deque[CellJob]) -> list[CellEvent]:
        if waiting and not self.placed:
            job = waiting.popleft()
            os.kill(os.getpid(), signal.SIGINT)
            self.running.append(job)
            self.placed.append(job.label)
        return []

    def stop(self) -> tuple[list[CellEvent], int | None]:
        return [], len(self.running)


def test_a_signal_while_a_cell_is_placed_waits_until_it_is_known_and_then_cancels_it(tmp_path: Path) -> None:
    """Else the cell started in the middle would be neither waited for nor cancelled: the driver's exit
    would kill its task on the node half-way, leaving its scratch folder there (a CI run's SIGTERM test)."""
    with signals_of_a_terminal():
        db = tmp_path / "db.sqlite"
        slots = SignalWhilePlacing(db, {}, 2)
        with pytest.raises(RunInterrupted) as stopped:
            run_cells(jobs_of(db, "a", "b"), slots, "s", db)
        assert str(stopped.value) == ("sweep s interrupted; 0 cell run(s) recorded, 1 cancelled on their nodes; "
                                      "resume with the same command")
        assert slots.placed == ["a"] and slots.seen == []  # stopped before any wait


def test_a_signal_while_cells_elsewhere_are_collected_waits_until_the_ended_ones_are_recorded(tmp_path: Path) -> None:
    """Cells that run elsewhere: the signal comes while the slots collect what ended (b's run says so
    after a's event is made); a's run is recorded before the sweep stops, b's cancelled."""
    with signals_of_a_terminal():
        db = tmp_path / "db.sqlite"
        a, b = jobs = jobs_of(db, "a", "b")
        slots = ScriptedSlots(db, {"a": [{"result": ok("r-a"), "seconds": 1.0}], "b": [signal.SIGTERM]}, 2, width=2,
                              stopped=([], 1))
        with pytest.raises(RunInterrupted) as stopped:
            run_cells(jobs, slots, "s", db)
        assert (str(stopped.value), stopped.value.exit_status) == (
            "sweep s interrupted; 1 cell run(s) recorded, 1 cancelled on their nodes; resume with the same command", 143)
        assert [(row["cell_key"], row["run_id"]) for row in cell_rows(db, "s")] == [(a.cell.key, "r-a")]


# ---- _StopSignals -----------------------------------------------------------------------------------

def test_inside_the_block_sigint_and_sigterm_stop_the_sweep_and_sigterm_is_remembered() -> None:
    with signals_of_a_terminal():
        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        with _StopSignals() as signals:
            assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (signals._handler,
                                                                                          signals._handler)
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            assert signals.terminated is False
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
            assert signals.terminated is True
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            assert signals.terminated is True  # a SIGTERM came: the exit status says so
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_sigint_the_process_ignores_or_handles_its_own_way_stays_so() -> None:
    said: list[int] = []

    def own(signum: int, frame: Any) -> None:
        said.append(signum)

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _StopSignals() as signals:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == signals._handler
            os.kill(os.getpid(), signal.SIGINT)  # ignored: nothing happens
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, own)
        with _StopSignals():
            os.kill(os.getpid(), signal.SIGINT)
            assert said == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_signal_while_holding_waits_for_the_block_and_not_at_all_when_already_stopping() -> None:
    with signals_of_a_terminal():
        went_on = []
        with _StopSignals() as signals:
            with pytest.raises(KeyboardInterrupt):
                with signals.holding():
                    os.kill(os.getpid(), signal.SIGINT)
                    went_on.append("the block went on")
            assert went_on == ["the block went on"]
            with signals.holding(stopping=True):
                os.kill(os.getpid(), signal.SIGTERM)
            assert signals.terminated is True
            with signals.holding():  # the signal held before was used up
                pass
            with pytest.raises(KeyboardInterrupt):  # outside a holding block: at once
                os.kill(os.getpid(), signal.SIGINT)
            went_on.clear()
            with pytest.raises(KeyboardInterrupt):
                with signals.holding():
                    with signals.holding():  # nested: the outermost block raises it
                        os.kill(os.getpid(), signal.SIGINT)
                    went_on.append("the outer block went on")
            assert went_on == ["the outer block went on"]


def test_outside_the_main_thread_the_callers_handlers_stay() -> None:
    found: list[Any] = []

    def enter() -> None:
        try:
            with _StopSignals() as signals:
                found.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), signals._previous))
        except BaseException as exc:  # noqa: BLE001 - said in the assertion below
            found.append(exc)

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert found == [(*before, {})]


# ---- LocalSlots: one cell at a time through a real launcher ----------------------------------------

def job_of(tmp_path: Path, model: str = "no-such-model", *overrides: str) -> CellJob:
    """A job as run_sweep makes it: the cell's request with the sweep's results folder and timeout, quiet."""
    cell = a_cell(*overrides, model=model, quick=True)
    return CellJob(cell, 0, cell.label(), replace(cell.request_for(tmp_path / "results", 120.0), quiet=True))


def steps(total: int) -> Steps:
    return Steps(total, stream=io.StringIO(), quiet=True, unit="cells")


def test_the_local_slot_takes_one_waiting_job_at_a_time_and_runs_it_when_waited_on(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    given: list[Path] = []

    def launcher_for(output: Path) -> LocalLauncher:
        given.append(output)
        return LocalLauncher(db_path=db, output=output)

    slots = LocalSlots(launcher_for, steps(2))
    assert (slots.next_done(), slots.busy(), given) == ([], False, [])  # nothing running: nothing to wait for
    assert (slots.place(deque()), slots.busy()) == ([], False)
    first, second = job_of(tmp_path), job_of(tmp_path, "no-such-model", "max_batch_size=2")
    waiting = deque([first, second])
    before = utc_now()
    assert slots.place(waiting) == [] and list(waiting) == [second] and slots.busy()
    assert before <= first.started_at <= utc_now() and second.started_at == ""
    assert slots.progress.current is not None and slots.progress.current[0] == first.label
    assert slots.place(waiting) == [] and list(waiting) == [second]  # its one slot is taken
    (event,) = slots.next_done()
    assert (event.job, event.where, event.again, event.stops, slots.busy()) == (first, "", None, 0, False)
    error = event.result["error"]
    assert error.startswith(NO_MODEL)
    assert event.result == {"status": "failed", "run_id": None, "error": error,
                            "stderr": f"mlharness: error: {error}\n", "exit_status": 1}
    # The run's output went to a file of a private folder, gone once read.
    (output,) = given
    assert output.name == "output" and output.parent.name.startswith("mlharness-cell-")
    assert not output.parent.exists()
    assert slots.stop() == ([], None)


def test_a_launcher_that_keeps_no_output_file_leaves_the_error_line_alone(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    slots = LocalSlots(lambda output: LocalLauncher(db_path=db), steps(1))  # the run writes to this process's output
    slots.place(deque([job_of(tmp_path)]))
    (event,) = slots.next_done()
    assert event.result["stderr"] == f"mlharness: error: {event.result['error']}\n"


CHATTY_POSTPROCESS = """\
import sys

def postprocess(outputs, ctx):
    if not ctx.cache.get("said"):
        ctx.cache["said"] = True
        sys.stderr.flush()
        sys.stderr.buffer.write(b"x" * 9000 + b"<not utf-8: \\xff>\\n")
        sys.stderr.flush()
    return outputs["scores"]
"""


def test_an_ok_cells_output_is_kept_to_its_last_characters_with_its_run(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    model = null_model_with(tmp_path / "models", postprocess=CHATTY_POSTPROCESS)
    slots = LocalSlots(lambda output: LocalLauncher(db_path=db, output=output), steps(1))
    job = job_of(tmp_path, str(model), "target_qps=20000")
    before = time.monotonic()
    slots.place(deque([job]))
    (event,) = slots.next_done()
    elapsed = time.monotonic() - before
    with ResultStore(db) as store:
        (run,) = store.list_runs()
    stderr = event.result.pop("stderr")
    assert event.result == {"status": "ok", "run_id": run["run_id"], "error": None} and event.stops == 0
    # Output that is not UTF-8 is kept, its bytes replaced.
    assert len(stderr) == STDERR_KEPT_CHARS and stderr.startswith("x") and "x<not utf-8: \ufffd>\n" in stderr
    assert 0 < event.seconds <= elapsed  # from its start to its end


# ---- the grid with the command's options, and the slots a sweep makes --------------------------------

SMALL = """\
    name: small
    quick: %s
    models: ["null"]
    scenarios: [Offline]
    batch_sizes: [4]
    set: {target_qps: 20000}
    """


def test_set_adds_to_or_replaces_each_cells_settings_and_quick_is_the_grids_unless_said(tmp_path: Path) -> None:
    grid = load_grid(write_manifest(tmp_path, "grid.yaml", SMALL % "true"))
    (cell,) = grid.cells
    assert cell.overrides == ("max_batch_size=4", "target_qps=20000")

    def options(*settings: str, quick: bool | None = None) -> SweepOptions:
        return SweepOptions(tmp_path / "r", tmp_path / "db.sqlite", extra_settings=list(settings), quick=quick)

    assert _with_options(grid, options()) == [cell]
    # The last --set of a key wins; a value may hold "=".
    (changed,) = _with_options(grid, options("target_qps=1=2", " target_qps = 30 ", "min_query_count=a=b",
                                             quick=False))
    assert changed == Cell(replace(cell.request, quick=False,
                                   overrides=("max_batch_size=4", "min_query_count=a=b", "target_qps=30")))
    # A grid's own value may hold "=" too: still its key's, so a --set of that key replaces it.
    held = load_grid(write_manifest(tmp_path, "held.yaml", SMALL.replace("{target_qps: 20000}",
                                                                         '{endpoint_model: "org=a"}') % "true"))
    assert held.cells[0].overrides == ("endpoint_model=org=a", "max_batch_size=4")
    (replaced,) = _with_options(held, options("endpoint_model=b"))
    assert replaced.overrides == ("endpoint_model=b", "max_batch_size=4")
    slow = load_grid(write_manifest(tmp_path, "slow.yaml", SMALL % "false"))
    assert [c.quick for c in _with_options(slow, options())] == [False]
    assert [c.quick for c in _with_options(slow, options(quick=True))] == [True]
    for bad in ("target_qps", "=30", " =30"):
        with pytest.raises(UserError) as refused:
            _with_options(grid, options("workers=2", bad))
        assert str(refused.value) == f"--set {bad!r}: expected key=value"


def test_the_local_slots_run_each_cell_through_a_launcher_into_the_sweeps_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHARNESS_PROGRESS")  # the environment's word would quiet the display whatever the sweep says
    grid = load_grid(write_manifest(tmp_path, "grid.yaml", SMALL % "true"))
    stream = io.StringIO()
    jobs = [job_of(tmp_path), job_of(tmp_path)]
    for quiet in (False, True):
        slots = local_slots(jobs, SweepOptions(Path("r"), Path("r/db.sqlite"), quiet=quiet), grid, stream)
        assert isinstance(slots, LocalSlots) and slots.job is None
        progress = slots.progress
        assert (progress.total, progress.stream, progress.unit, progress.ticker.quiet) == (2, stream, "cells", quiet)
        launcher = slots.launcher_for(tmp_path / "out")
        assert isinstance(launcher, LocalLauncher)
        assert (launcher.db_path, launcher.output, launcher.store, launcher.grace) == (
            (tmp_path / "r" / "db.sqlite").resolve(), tmp_path / "out", True, GRACE_SECONDS)


# ---- run_sweep: real sweeps ---------------------------------------------------------------------------

GRID = """\
    name: mut
    quick: true
    timeout: 120
    models:
      - {name: "null", set: {target_qps: 20000}}
      - no-such-model
    scenarios: [Offline]
    batch_sizes: [4, 8]
    exclude: [{model: no-such-model, batch_size: 8}]
    """
# Cells that fail at once (no such model): a sweep of them runs in a second or so.
FAILING = """\
    name: failing
    quick: true
    timeout: 120
    models: [no-such-model]
    scenarios: [Offline]
    batch_sizes: [4]
    """


class Recording:
    """A sweep's slots factory that notes what it is given and makes the sweep's own (local_slots)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[CellJob], SweepOptions, Any, Any]] = []

    def __call__(self, jobs: list[CellJob], options: SweepOptions, grid: Any, stream: Any) -> Any:
        self.calls.append((list(jobs), options, grid, stream))
        return local_slots(jobs, options, grid, stream)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One sweep of GRID: two null cells, ok, and one of a model that does not exist, failed."""
    root = tmp_path_factory.mktemp("swept")
    grid = write_manifest(root, "grid.yaml", GRID)
    options = SweepOptions(results_dir=root / "results", db_path=root / "results" / "db.sqlite")
    stream, recording = io.StringIO(), Recording()
    started = utc_now()
    result = run_sweep(grid, options, stream, slots=recording)
    return {"root": root, "grid": grid, "options": options, "result": result, "said": stream.getvalue(),
            "stream": stream, "calls": recording.calls, "started": started, "ended": utc_now()}


def without_seconds(said: str) -> list[str]:
    return [re.sub(r" \(\d+\.\d s\)(, ETA \d+:\d\d)?$", "", line) for line in said.splitlines()]


def test_a_sweep_runs_each_cell_quietly_records_it_with_the_plan_and_says_what_it_did(swept: dict[str, Any]) -> None:
    """(One test for the shared sweep: mutation testing runs a function's mutants against the tests that
    reached it, and a module fixture's sweep is reached in its first test only.)"""
    result, cells = swept["result"], load_grid(swept["grid"]).cells
    assert [(c.model, c.setting("max_batch_size")) for c in cells] == [("null", "4"), ("null", "8"),
                                                                        ("no-such-model", "4")]
    # What it returns and says.
    assert (result.sweep_id, result.planned, result.skipped) == ("mut", 3, 0)
    assert [(o.cell, o.repeat_index, o.status) for o in result.outcomes] == [
        (cells[0], 0, "ok"), (cells[1], 0, "ok"), (cells[2], 0, "failed")]
    error = result.outcomes[2].error
    assert error.startswith(NO_MODEL) and result.outcomes[2].run_id is None and result.failed == [result.outcomes[2]]
    assert without_seconds(swept["said"]) == [
        "sweep mut: 3 cell run(s), 0 already finished, 3 to run (timeout 120 s each)",
        f"[1/3] {cells[0].label()}: ok", f"[2/3] {cells[1].label()}: ok", f"[3/3] {cells[2].label()}: FAILED: {error}"]
    # The jobs its slots were given: each cell's request with the sweep's results folder and timeout, quiet.
    ((jobs, options, grid, stream),) = swept["calls"]
    assert (options, grid.name, stream) == (swept["options"], "mut", swept["stream"])
    assert [(job.cell, job.repeat_index, job.label) for job in jobs] == [(c, 0, c.label()) for c in cells]
    results = (swept["root"] / "results").resolve()
    assert [job.request for job in jobs] == [replace(c.request, results_dir=results, timeout=120.0, quiet=True)
                                             for c in cells]
    # What it recorded: its plan (the grid, the repeats, the cells), each cell run, the runs.
    with ResultStore(swept["options"].db_path) as store:
        sweep = store.get_sweep("mut")
        runs = {row["run_id"]: row["status"] for row in store.list_runs()}
        rows = [(row["cell_key"], row["status"], row["run_id"], row["error"], row["stderr"])
                for row in store.sweep_cells("mut")]
    assert (sweep["name"], sweep["grid_path"]) == ("mut", str(swept["grid"]))
    assert swept["started"] <= sweep["created_at"] == sweep["updated_at"] <= swept["ended"]
    assert json.loads(sweep["grid_json"]) == {"grid": yaml.safe_load(swept["grid"].read_text()), "repeat": 1,
                                              "cells": sorted(c.key for c in cells)}
    assert runs == {result.outcomes[0].run_id: "ok", result.outcomes[1].run_id: "ok"}
    # The store lists cell runs by their start (to the second), then key: cells that start within one
    # second come in key order, others in the order run. Compared by key, whichever it was.
    assert sorted(rows, key=lambda row: row[0]) == sorted([
        (cells[0].key, "ok", result.outcomes[0].run_id, None, None),
        (cells[1].key, "ok", result.outcomes[1].run_id, None, None),
        (cells[2].key, "failed", None, error, f"mlharness: error: {error}\n")], key=lambda row: row[0])


def copy_of(swept: dict[str, Any], tmp_path: Path) -> SweepOptions:
    shutil.copytree(swept["root"] / "results", tmp_path / "results")
    return SweepOptions(results_dir=tmp_path / "results", db_path=tmp_path / "results" / "db.sqlite")


def test_the_same_sweep_again_runs_only_what_is_not_finished_or_what_it_is_told_to(
        swept: dict[str, Any], tmp_path: Path) -> None:
    options = copy_of(swept, tmp_path)
    failing_cell = load_grid(swept["grid"]).cells[2]
    recording, stream = Recording(), io.StringIO()
    again = run_sweep(swept["grid"], options, stream, slots=recording)
    assert again == SweepResult("mut", 3, 3, [])
    assert stream.getvalue() == "sweep mut: 3 cell run(s), 3 already finished, 0 to run (timeout 120 s each)\n"
    assert recording.calls[0][0] == []
    # --retry-failed: the failed cell only.
    retried = run_sweep(swept["grid"], replace(options, retry_failed=True), io.StringIO(), slots=recording)
    assert ([job.cell for job in recording.calls[1][0]], retried.skipped) == ([failing_cell], 2)
    assert [(o.cell, o.status) for o in retried.outcomes] == [(failing_cell, "failed")]
    # The same sweep narrowed to that cell finds it finished; --rerun runs it again.
    narrowed = write_manifest(tmp_path, "narrowed.yaml", FAILING.replace("name: failing", "name: mut"))
    assert run_sweep(narrowed, options, io.StringIO(), slots=recording).skipped == 1
    rerun = run_sweep(narrowed, replace(options, rerun=True), io.StringIO(), slots=recording)
    assert ([job.cell for job in recording.calls[3][0]], rerun.skipped) == ([failing_cell], 0)


def test_the_commands_repeat_timeout_and_sweep_id_win_over_the_grids(tmp_path: Path) -> None:
    grid = write_manifest(tmp_path, "grid.yaml", FAILING)
    (cell,) = load_grid(grid).cells
    recording, stream = Recording(), io.StringIO()
    options = SweepOptions(results_dir=Path("results"), db_path=Path("db.sqlite"), sweep_id="other", repeat=2,
                           timeout_s=30.5)
    result = run_sweep(grid, options, stream, slots=recording)
    assert (result.sweep_id, result.planned, result.skipped) == ("other", 2, 0)
    assert [(o.cell, o.repeat_index, o.status) for o in result.outcomes] == [(cell, 0, "failed"), (cell, 1, "failed")]
    ((jobs, *_),) = recording.calls
    assert [(job.repeat_index, job.label, job.request.timeout, job.request.results_dir) for job in jobs] == [
        (0, f"{cell.label()} #1", 30.5, tmp_path / "results"), (1, f"{cell.label()} #2", 30.5, tmp_path / "results")]
    assert stream.getvalue().splitlines()[0] == "sweep other: 2 cell run(s), 0 already finished, 2 to run (timeout 30.5 s each)"
    with ResultStore(tmp_path / "db.sqlite") as store:
        assert [row["sweep_id"] for row in store.list_sweeps()] == ["other"]
        assert json.loads(store.get_sweep("other")["grid_json"])["repeat"] == 2


def test_a_dry_run_lists_each_cell_and_repeat_with_its_state_and_writes_nothing(
        swept: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cells = load_grid(swept["grid"]).cells
    db = tmp_path / "db.sqlite"
    shutil.copy(swept["options"].db_path, db)
    before = db.read_bytes()
    stream = io.StringIO()
    result = run_sweep(swept["grid"], SweepOptions(tmp_path / "results", db, dry_run=True, repeat=2), stream)
    assert result == SweepResult("mut", 6, 6, [])
    assert stream.getvalue().splitlines() == [
        f"{c.key}  repeat {i}  {c.label()}  [{state}]" for c, states in zip(cells, (("ok", "to run"), ("ok", "to run"),
                                                                                    ("failed", "to run")))
        for i, state in enumerate(states)]
    assert db.read_bytes() == before and not (tmp_path / "results").exists()
    # No database yet: every cell is to run, and none is made; said on stderr unless told where.
    fresh = tmp_path / "none" / "db.sqlite"
    assert run_sweep(swept["grid"], SweepOptions(tmp_path / "results", fresh, dry_run=True)) == SweepResult(
        "mut", 3, 3, [])
    assert capsys.readouterr().err.splitlines() == [f"{c.key}  repeat 0  {c.label()}  [to run]" for c in cells]
    assert not fresh.parent.exists()


def test_a_signal_while_a_cell_runs_stops_it_records_it_and_stops_the_sweep(tmp_path: Path) -> None:
    """SIGTERM reaches the running cell's launcher, which stops the run; the sweep records it, starts no
    other cell and stops with 128 + SIGTERM (the sweep's own slots, as `mlharness sweep` makes them)."""
    with signals_of_a_terminal():
        model = hour_long_null(tmp_path / "models")
        grid = write_manifest(tmp_path, "grid.yaml", f"""\
            name: hour
            quick: true
            timeout: {HOUR_LONG_TIMEOUT_S}
            models: ["{model}"]
            scenarios: [SingleStream]
            batch_sizes: [1, 2]
            set: {{min_duration: 3600000, min_query_count: 1, target_latency: 20}}
            """)
        results = tmp_path / "results"

        returned = threading.Event()  # a sweep that ended before its first cell ran fails the test at once

        def stop_once_it_runs() -> None:
            wait_for(lambda: returned.is_set() or bool(list(results.rglob("SingleStream/.staging-*"))),
                     "the first cell's run")
            if not returned.is_set():
                os.kill(os.getpid(), signal.SIGTERM)

        sender = threading.Thread(target=stop_once_it_runs)
        sender.start()
        try:
            with pytest.raises(RunInterrupted) as stopped:
                run_sweep(grid, SweepOptions(results, tmp_path / "db.sqlite"), io.StringIO())
        finally:
            returned.set()
            sender.join()
        assert (str(stopped.value), stopped.value.exit_status) == (
            "sweep hour interrupted; 1 cell run(s) recorded, resume with the same command", 143)
        first = load_grid(grid).cells[0]
        ((key, status, error),) = [(r["cell_key"], r["status"], r["error"]) for r in cell_rows(tmp_path / "db.sqlite", "hour")]
        assert (key, status) == (first.key, "failed")
        assert error.startswith(f"run failed: interrupted by SIGTERM (logs kept in {results}"), error
