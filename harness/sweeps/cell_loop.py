"""The one loop that runs a sweep's cells, whatever runs them: what happens to a cell is written here
once. Each cell's result is recorded in the sweep's table as it comes (a failed one with the tail of
its output); a cell given back to run again (its node was lost) is recorded failed until it does;
Ctrl-C or SIGTERM stops the sweep with what ran recorded, and the same command resumes with the cells
not done.

Where and how many cells run at once is the slots' business (`CellSlots`): `LocalSlots` runs one cell
at a time through a Launcher on this machine (mlharness.running.launcher.LocalLauncher: a fresh
process per cell), mlharness.cluster.scheduler.NodeSlots one per free slot of the Ray cluster's nodes.
The slots also own the progress display (what runs where)."""
from __future__ import annotations

import signal
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from mlharness.errors import RunInterrupted
from mlharness.records.run_record import utc_now
from mlharness.running.outcome import Launcher, Outcome
from mlharness.running.progress import Steps
from mlharness.running.request import RunRequest
from mlharness.store.result_store import ResultStore
from mlharness.sweeps.sweep_grid import Cell

STDERR_KEPT_CHARS = 8000  # the tail of a failed cell's stderr kept in the database


@dataclass(eq=False)  # one job per cell run, told apart by identity (the slots key their state by it)
class CellJob:
    """One cell run to do: the cell, its repeat index, its progress label and the request it submits
    (the cell's, with the sweep's results folder and timeout)."""
    cell: Cell
    repeat_index: int
    label: str
    request: RunRequest
    started_at: str = ""  # set by the slots when the cell starts


@dataclass(frozen=True)
class CellEvent:
    """What the slots report of a job. `result` (cell_result's dict) is recorded; None: the job never
    started and is simply put back. `again`: recorded failed for now, the line is said and the job runs
    again. `stops`: after recording, the sweep stops with this exit status (the launcher in this process
    was stopped by SIGINT or SIGTERM)."""
    job: CellJob
    result: dict[str, Any] | None
    seconds: float = 0.0
    where: str = ""  # appended to the cell's progress line (" on NODE")
    again: str | None = None
    stops: int = 0


@dataclass
class CellOutcome:
    cell: Cell
    repeat_index: int
    status: str
    run_id: str | None
    error: str | None
    seconds: float


class CellSlots(Protocol):
    """Where a sweep's cells run, as many at once as there are free slots."""
    progress: Steps
    # The cells run outside this process (a cluster's nodes): next_done only waits a moment and collects
    # what ended, and a signal waits until that is recorded. False: next_done runs the cell here, under a
    # launcher that takes the signals itself while the run is on.
    runs_elsewhere: bool

    def place(self, waiting: deque[CellJob]) -> list[CellEvent]:
        """Start the waiting jobs that a free slot takes (taking them off `waiting`); events for those
        that no slot can ever take."""
        ...

    def busy(self) -> bool:
        """Whether a job is running."""
        ...

    def next_done(self) -> list[CellEvent]:
        """Wait a little for running jobs to end (or, none running, for a slot to free); their events
        (none when none ended)."""
        ...

    def stop(self) -> tuple[list[CellEvent], int | None]:
        """Ctrl-C: the events of the jobs that already ended, and how many were cancelled where they ran
        (None: these slots never have one running outside `next_done`)."""
        ...


def cell_result(outcome: Outcome, stderr: str) -> dict[str, Any]:
    """A launcher's Outcome (local, or from a cluster node) and the run's output as the sweep records
    it: {status, run_id, error, stderr[, exit_status]}."""
    record = outcome.record
    if outcome.kind == "result" and record is not None:
        return {"status": record.status, "run_id": record.run_id, "error": record.error, "stderr": stderr}
    error = outcome.error or "failed"
    if outcome.traceback_path:
        error += f" (traceback in {outcome.traceback_path})"
    stderr = (stderr + f"mlharness: error: {error}\n")[-STDERR_KEPT_CHARS:]  # what `mlharness run` would print
    return {"status": "failed", "run_id": record.run_id if record else None, "error": error, "stderr": stderr,
            "exit_status": outcome.exit_status}


def record_cell_run(db_path: Path, sweep_id: str, cell: Cell, repeat_index: int, result: dict[str, Any],
                    started_at: str, seconds: float) -> CellOutcome:
    """Store one cell run's result (cell_result's dict) in the sweep's table; the failed ones with their stderr."""
    with ResultStore(db_path) as store:
        store.record_cell(sweep_id, cell.key, repeat_index, cell.params(), result["status"], result.get("run_id"),
                          result.get("error"), result.get("stderr") if result["status"] != "ok" else None,
                          started_at, utc_now(), round(seconds, 3))
    return CellOutcome(cell, repeat_index, result["status"], result.get("run_id"), result.get("error"), seconds)


def run_cells(jobs: list[CellJob], slots: CellSlots, sweep_id: str, db_path: Path) -> list[CellOutcome]:
    """Run every job on the slots, recording each as it ends; returns the cell runs recorded (a cell
    given back to run again counts once, when it ends). Raises RunInterrupted when stopped."""
    with _StopSignals() as signals:
        loop = _Loop(slots, sweep_id, db_path, deque(jobs), signals)
        with slots.progress:
            try:
                while loop.waiting or slots.busy():
                    # A signal waits for the placing to end: a cell started in the middle of it would be
                    # neither waited for nor cancelled (the driver's exit then kills its task half-way,
                    # leaving its scratch folder on the node).
                    with signals.holding():
                        loop.handle(slots.place(loop.waiting))
                    if loop.waiting or slots.busy():  # else every job ended at placing (no slot can take it)
                        with signals.holding() if slots.runs_elsewhere else nullcontext():
                            loop.handle(slots.next_done())
            except KeyboardInterrupt:
                events, cancelled = slots.stop()
                loop.handle(events, stopping=True)
                loop.stop(128 + (signal.SIGTERM if signals.terminated else signal.SIGINT), cancelled)
    return loop.outcomes


class _StopSignals:
    """SIGINT and SIGTERM stop the sweep as KeyboardInterrupt, the one exception a Ray wait passes on
    (any other comes out as a SystemError). Without this SIGTERM would end the process by Python's
    default, or Ray's sys.exit on a cluster's driver, with nothing cancelled or said.

    While cells are placed or the ended ones collected and recorded (`holding`, which nests), a signal
    waits until they are: an interrupt in the middle would leave a cell that has run, or runs, neither
    recorded nor cancelled. A SIGINT the process ignores (a background job's) or handles its own way
    stays so, and outside the main thread signals cannot be caught: the caller's handlers stay."""

    def __init__(self) -> None:
        self.terminated = False  # SIGTERM came (the exit status says which signal stopped the sweep)
        self._holding = 0  # how many holding blocks are open
        self._held = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if sig == signal.SIGINT and signal.getsignal(sig) is not signal.default_int_handler:
                    continue
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _handler(self, signum: int, frame: Any) -> None:
        self.terminated = self.terminated or signum == signal.SIGTERM
        if self._holding:
            self._held = True
            return
        raise KeyboardInterrupt()

    @contextmanager
    def holding(self, stopping: bool = False) -> Iterator[None]:
        """Signals wait for the block; one that came raises KeyboardInterrupt after the outermost block,
        unless the sweep is already stopping."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if self._holding:
            return
        held, self._held = self._held, False
        if held and not stopping:
            raise KeyboardInterrupt()


@dataclass
class _Loop:
    slots: CellSlots
    sweep_id: str
    db_path: Path
    waiting: deque[CellJob]
    signals: _StopSignals
    outcomes: list[CellOutcome] = field(default_factory=list)

    def handle(self, events: list[CellEvent], stopping: bool = False) -> None:
        with self.signals.holding(stopping):
            for event in events:
                self._handle(event, stopping)

    def _handle(self, event: CellEvent, stopping: bool) -> None:
        job = event.job
        if event.result is None:
            self.waiting.appendleft(job)
            return
        # Recorded at once, also a cell about to run again: a driver that dies now leaves a failed
        # cell, not a missing one; the run that ends it replaces the row.
        recorded = record_cell_run(self.db_path, self.sweep_id, job.cell, job.repeat_index, event.result,
                                   job.started_at or utc_now(), event.seconds)
        if event.again is not None:
            self.slots.progress.say(event.again)
            self.waiting.appendleft(job)
            return
        self.outcomes.append(recorded)
        status = event.result["status"]
        shown = status if status == "ok" else f"{status.upper()}: {event.result.get('error')}"
        self.slots.progress.finished(job.label + event.where, shown, event.seconds)
        if event.stops and not stopping:
            self.stop(event.stops, None)

    def stop(self, exit_status: int, cancelled: int | None) -> None:
        where = f", {cancelled} cancelled on their nodes;" if cancelled is not None else ","
        raise RunInterrupted(f"sweep {self.sweep_id} interrupted; {len(self.outcomes)} cell run(s) recorded{where} "
                             f"resume with the same command", exit_status)


class LocalSlots:
    """One slot on this machine: each cell submitted to a Launcher in turn (the sweep's own: a
    LocalLauncher writing the run's output to a file kept for a failed cell, and the record to the
    sweep's database). SIGINT or SIGTERM while a cell runs reaches the launcher, which stops the run
    and comes back with its exit status: that cell is recorded, and the sweep stops."""
    runs_elsewhere = False

    def __init__(self, launcher_for: Callable[[Path], Launcher], progress: Steps):
        self.launcher_for = launcher_for  # a launcher that writes the run's output to this file
        self.progress = progress
        self.job: CellJob | None = None
        self.start = 0.0

    def place(self, waiting: deque[CellJob]) -> list[CellEvent]:
        if self.job is None and waiting:
            self.job = waiting.popleft()
            self.progress.starting(self.job.label)
            self.job.started_at, self.start = utc_now(), time.monotonic()
        return []

    def busy(self) -> bool:
        return self.job is not None

    def next_done(self) -> list[CellEvent]:
        job, self.job = self.job, None
        if job is None:
            return []
        with tempfile.TemporaryDirectory(prefix="mlharness-cell-") as tmp:
            output = Path(tmp) / "output"
            outcome = self.launcher_for(output).submit(job.request)
            stderr = output.read_text(errors="replace")[-STDERR_KEPT_CHARS:] if output.is_file() else ""
        result = cell_result(outcome, stderr)
        stops = result.get("exit_status", 0)
        return [CellEvent(job, result, time.monotonic() - self.start, stops=stops if stops > 128 else 0)]

    def stop(self) -> tuple[list[CellEvent], int | None]:
        return [], None
