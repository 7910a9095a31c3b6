"""A local sweep stopped by SIGINT or SIGTERM while a cell runs (mlharness.sweeps.cell_loop): the
running cell is stopped and recorded, the sweep stops with 128 + the signal and says what it
recorded, no further cell starts, and the same command resumes with the cells not done. The sweep's
driver is a process of its own, as a user's is; the null model's cells are real runs."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path

import pytest

from mlharness.errors import RunInterrupted
from mlharness.running.progress import Steps
from mlharness.store.result_store import ResultStore
from mlharness.sweeps.cell_loop import CellEvent, CellJob, run_cells
from mlharness.sweeps.sweep_grid import Cell, load_grid
from tests.support import REPO, run_cli

# Two short Offline cells, then two SingleStream cells of a minute each: the signal lands in the third.
GRID = """\
    name: stopped
    quick: true
    timeout: 300
    models: ["null"]
    scenarios: [Offline, SingleStream]
    batch_sizes: [4, 8]
    set: {Offline: {target_qps: 20000}, SingleStream: {target_latency: 0.01, min_duration: 60000}}
    """


def statuses(db: Path, grid: Path) -> list[str | None]:
    """Each cell's recorded status in the grid's order (rows are ordered by a start time in whole seconds)."""
    if not db.exists():
        return []
    with ResultStore(db) as store:
        recorded = {row["cell_key"]: row["status"] for row in store.sweep_cells("stopped")}
    return [recorded.get(cell.key) for cell in load_grid(grid).cells]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_sweep_with_what_ran_recorded_and_it_resumes(tmp_path: Path, stop: signal.Signals,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID))
    results = tmp_path / "results"
    db = results / "mlharness.sqlite"
    # SIGINT as a terminal's user has it (a background job's children inherit it ignored).
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from mlharness.cli import main\nsys.exit(main(sys.argv[1:]))")
    driver = subprocess.Popen([sys.executable, "-c", code, "sweep", str(grid), "--results-dir", str(results)],
                              cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # only so that a hung driver fails the test instead of hanging it
        # The third cell's run has started (its staging folder exists) after the first two were recorded.
        while statuses(db, grid)[:2] != ["ok", "ok"] or not list(results.rglob("SingleStream/.staging-*")):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.1)
        driver.send_signal(stop)
        out, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 128 + stop, err
    assert err.rstrip().endswith(
        "mlharness: error: sweep stopped interrupted; 3 cell run(s) recorded, resume with the same command"), err
    assert statuses(db, grid) == ["ok", "ok", "failed", None]  # the fourth never began
    third = load_grid(grid).cells[2]
    assert third.scenario == "SingleStream"
    with ResultStore(db) as store:
        (stopped,) = [row for row in store.sweep_cells("stopped") if row["cell_key"] == third.key]
        (run,) = [r for r in store.list_runs() if r["run_id"] == stopped["run_id"]]
    assert f"interrupted by {stop.name}" in stopped["error"] and run["status"] == "failed"

    # The same command picks up where it stopped: the fourth cell is the one left to run.
    assert run_cli("sweep", grid, "--results-dir", results, "--dry-run") == 0
    states = [line.rsplit("  ", 1)[1] for line in capsys.readouterr().err.splitlines() if "  repeat " in line]
    assert states == ["[ok]", "[ok]", "[failed]", "[to run]"]


class _TwoEndTogether:
    """Slots whose two cells end in the same wait, so that the sweep records them one after the other;
    `signal_at` sends a signal to this process while the first one's line is printed (after its row is
    written, before the second's)."""
    runs_elsewhere = False

    def __init__(self, jobs: list[CellJob], signal_at: signal.Signals):
        self.signal_at, self.jobs, self.ended = signal_at, jobs, False
        slots = self

        class Lines(Steps):
            def finished(self, *args: object) -> None:
                super().finished(*args)
                if len(self.durations) == 1:
                    signal.raise_signal(slots.signal_at)  # its handler runs here, in the middle of recording
        self.progress = Lines(len(jobs), stream=io.StringIO(), quiet=True)

    def place(self, waiting: deque[CellJob]) -> list[CellEvent]:
        waiting.clear()
        return []

    def busy(self) -> bool:
        return not self.ended

    def next_done(self) -> list[CellEvent]:
        self.ended = True
        return [CellEvent(job, {"status": "ok", "run_id": f"run-{i}", "error": None, "stderr": ""}, 1.0)
                for i, job in enumerate(self.jobs)]

    def stop(self) -> tuple[list[CellEvent], int | None]:
        return [], None


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_ended_cells_are_recorded_waits_until_all_are(tmp_path: Path, stop: signal.Signals) -> None:
    """A signal that lands between two ended cells' rows stops the sweep after both are written: the
    second cell has run, and a resume must not run it again."""
    db = tmp_path / "mlharness.sqlite"
    with ResultStore(db) as store:
        store.start_sweep("together", "together", "grid.yaml", {}, "2026-11-29T00:00:00Z")
    cells = [Cell.of(model="null", scenario="Offline", overrides=(f"target_qps={qps}",)) for qps in (1, 2)]
    jobs = [CellJob(cell, 0, cell.key, cell.request) for cell in cells]
    # SIGINT as a terminal's user has it (a background job, as CI may be, inherits it ignored).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        with pytest.raises(RunInterrupted) as stopped:
            run_cells(jobs, _TwoEndTogether(jobs, stop), "together", db)
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # put back after it
    finally:
        signal.signal(signal.SIGINT, before)
    assert stopped.value.exit_status == 128 + stop
    assert "2 cell run(s) recorded" in str(stopped.value)
    with ResultStore(db) as store:
        assert sorted(row["run_id"] for row in store.sweep_cells("together")) == ["run-0", "run-1"]
