"""The run's own process (started by mlharness.running.launcher): runs the request under a RunGuard that
stops it from outside LoadGen's threads (a signal, its timeout, the parent's death), writes the Outcome
envelope and exits at once.

    python -m mlharness.running.run_child WORKDIR    (WORKDIR holds request.json; outcome.json is written there)"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from mlharness.atomic_io import write_json
from mlharness.errors import RunInterrupted
from mlharness.records.run_record import RunRecord
from mlharness.running.outcome import Outcome, error_outcome
from mlharness.running.request import RunRequest
from mlharness.running.run_folders import finalize_abandoned, store_record

ABORT_WAIT_SECONDS = 0.4  # how long the child lets LoadGen end by itself after an abort


class RunGuard:
    """The child's side: stops a run from outside LoadGen's threads. A signal, a timeout or the
    parent's death calls `abort`, which fails the SUT (so LoadGen's outstanding and later queries
    complete empty) and, if the run has not ended within ABORT_WAIT_SECONDS, writes the failed run
    itself and exits the process. The runner reports its progress here (`started`, `attach_sut`,
    `watch`), and finalizes through `finalizing()` so that only one of the two paths does."""

    def __init__(self, workdir: Path | None):
        self.workdir = workdir
        self.record: RunRecord | None = None
        self.where: Any = None
        self.sut: Any = None
        self.aborted: RunInterrupted | None = None
        self.parent_gone = False
        self._lock = threading.Lock()
        # The thread that writes the run's final state, once one has asked (the object, not its ident: an
        # ended thread's ident is given to the next thread started)
        self._finalizer: threading.Thread | None = None
        self._load_timer: threading.Timer | None = None

    # reported by the runner
    def started(self, record: RunRecord, where: Any) -> None:
        """The run's staging folder exists: write the preliminary record and claim the folder."""
        import psutil

        self.record, self.where = record, where
        staging = where.stage()
        write_json(staging / "run.json", record.to_dict())
        write_json(staging / "owner.json", {"pid": os.getpid(), "create_time": psutil.Process().create_time()})
        if self.workdir is not None:
            write_json(self.workdir / "started.json", {"staging": str(staging), "run_id": record.run_id,
                                                       "monotonic": time.monotonic()})

    def attach_sut(self, sut: Any) -> None:
        self.sut = sut
        if self.aborted is not None:
            sut.fail_staging(self.aborted)

    def watch(self, timeout: float | None, what: str) -> Callable[[], None]:
        """User code began (`what`, e.g. LoadQuerySamples); abort the run unless the returned call
        marks its end within `timeout` seconds."""
        if not timeout:
            return lambda: None
        timer = threading.Timer(timeout, self.abort, args=(
            f"{what} did not finish within {timeout:g} s (raise the harness key load_timeout if that is expected)", 1))
        timer.daemon = True
        timer.start()
        return timer.cancel

    def finalizing(self) -> bool:
        """True for the one thread that may write the run's final state: the first to ask, and that
        thread again later; False for any other. The run's main thread asks as soon as LoadGen's test
        returns (mlharness.running.loadgen_test), so an abort that comes then waits for it instead of
        writing the failed run over what it is still writing (the SUT's requests log)."""
        with self._lock:
            if self._finalizer is None:
                self._finalizer = threading.current_thread()
            return self._finalizer is threading.current_thread()

    # called from outside the run
    def abort(self, reason: str, exit_status: int) -> None:
        with self._lock:
            if self.aborted is not None:
                return
            self.aborted = RunInterrupted(reason, exit_status)
        if self.sut is not None:
            self.sut.fail_staging(self.aborted)
        # Offline ends at once when its query completes; other scenarios keep issuing until their
        # minimum duration, so after a short wait the run is written as failed from here.
        time.sleep(ABORT_WAIT_SECONDS)
        if not self.finalizing():
            return  # the main thread is writing the outcome and will exit
        outcome = self._fail_from_outside(reason, exit_status)
        _exit_with(self.workdir, outcome)

    def _fail_from_outside(self, reason: str, exit_status: int) -> Outcome:
        record = None
        if self.where is not None and self.where.staging.exists():
            record = finalize_abandoned(self.where.staging, reason)
            if record is not None and self.parent_gone:
                try:
                    store_record(record)  # nobody else will: the launching process is gone
                except Exception:  # noqa: BLE001 - exiting anyway; the folder holds the record
                    pass
        where = f" (logs kept in {record.results_path})" if record is not None else ""
        return Outcome(kind="error", record=record, error=f"run failed: {reason}{where}", exit_status=exit_status)


def _exit_with(workdir: Path | None, outcome: Outcome) -> None:
    """Write the envelope and leave at once: no interpreter teardown while LoadGen's threads run."""
    if workdir is not None:
        write_json(workdir / "outcome.json", outcome.to_dict())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(outcome.exit_status)


def _watch_signals(guard: RunGuard) -> None:
    """Signals reach a C-level handler even while the main thread is inside LoadGen; the wakeup fd
    carries them to this thread, which aborts the run."""
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: None)  # handled by the watcher below

    def watch() -> None:
        while True:
            data = os.read(reader, 1)
            if not data:
                return
            signum = data[0]
            name = signal.Signals(signum).name
            # The child has its own session and no terminal: SIGHUP is the parent-death signal.
            if signum == signal.SIGHUP or os.getppid() != _PARENT_PID:
                guard.parent_gone = True
                threading.Thread(target=guard.abort, args=("the launching process ended", 1), daemon=True).start()
            else:
                threading.Thread(target=guard.abort, args=(f"interrupted by {name}", 128 + signum),
                                 daemon=True).start()

    threading.Thread(target=watch, name="mlharness-signals", daemon=True).start()


_PARENT_PID = os.getppid()


def _die_with_parent() -> None:
    """Linux: SIGHUP to this process when the launching process dies (a SIGKILL cannot be forwarded)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGHUP))
    except (OSError, AttributeError):
        return
    if os.getppid() != _PARENT_PID:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGHUP)


def _run_deadline(guard: RunGuard, timeout: float) -> None:
    timer = threading.Timer(timeout, guard.abort, args=(f"timed out after {timeout:g} s", 1))
    timer.daemon = True
    timer.start()


def child_main(workdir: Path) -> None:
    """The child process: run the request with a guard, write the envelope, exit."""
    global _PARENT_PID
    _PARENT_PID = os.getppid()
    guard = RunGuard(workdir)
    _watch_signals(guard)
    _die_with_parent()
    try:
        request = RunRequest.from_json((workdir / "request.json").read_text())
        _run_deadline(guard, request.timeout)
        record = runner_for(request.kind).run_here(request, guard)
        outcome = Outcome(kind="result", record=record)
    except BaseException as exc:  # noqa: BLE001 - everything becomes an envelope
        outcome = error_outcome(exc)
    _exit_with(workdir, outcome)


def runner_for(kind: str) -> Any:
    """The module whose `run_here(request, guard)` executes a run of this kind in this process."""
    import importlib

    return importlib.import_module({"loadgen": "mlharness.running.runner", "bricks": "mlharness.bricks.runner"}[kind])



if __name__ == "__main__":
    child_main(Path(sys.argv[1]))
