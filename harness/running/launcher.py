"""Launch runs: each RunRequest runs in a fresh process of its own, and comes back as an Outcome.

Why a process per run: LoadGen reads its configuration once per process, user code may call
os._exit, crash or never return, and Ctrl-C must stop a test that LoadGen would otherwise run to
its end. The parent (this module's `LocalLauncher`) only waits, forwards signals and cleans up;
the child's side is mlharness.running.run_child, the results folder's housekeeping
mlharness.running.run_folders, the envelope mlharness.running.outcome:

- The child runs in its own session (process group), so the parent decides what it is sent. On
  SIGINT or SIGTERM the parent forwards the signal; the child's `RunGuard` fails the SUT (every
  outstanding query completes empty), lets LoadGen end if it does so at once, and otherwise writes
  the failed run itself and exits. If the child is still there after `grace` seconds, the parent
  kills its process group.
- A child that ends without an outcome (os._exit, a signal, a crash) becomes a failed record
  naming its exit status or signal, built from the preliminary run.json it wrote when it started.
- A whole-run timeout (RunRequest.timeout) is enforced by the child (a clean failed run) and,
  `grace` seconds later, by the parent (kill).
- Only the parent writes the results database.

The Outcome envelope (`kind` result or error, a schema version, the RunRecord, the error and where
its traceback was written) is written by the child as JSON into a private folder; a launcher that
runs requests on other machines carries the same envelope back."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from mlharness.atomic_io import write_text
from mlharness.errors import RunFailed, RunInterrupted, UserError
from mlharness.records.run_record import RunRecord
from mlharness.running.outcome import Launcher, Outcome, describe_exit
from mlharness.running.request import RunRequest
from mlharness.running.resolve import resolved_for_run
from mlharness.running.run_folders import (
    check_results_dir,
    clean_stale_staging,
    finalize_abandoned,
    started_staging,
    store_record,
    timed_out,
)

GRACE_SECONDS = 1.5  # between forwarding a signal and killing the child's process group


class LocalLauncher:
    """Runs each request in a fresh local process (see the module docstring)."""

    def __init__(self, grace: float = GRACE_SECONDS, store: bool = True, db_path: Path | None = None,
                 output: Path | None = None):
        self.grace = grace
        self.store = store
        self.db_path = db_path  # None: the results directory's database ($MLHARNESS_DB when set)
        self.output = output  # None: the child writes to this process's stdout and stderr

    def submit(self, request: RunRequest) -> Outcome:
        request = resolved_for_run(request)  # user.conf read here, in the submitting process, not in the run's
        results_dir = Path(request.results_dir)
        check_results_dir(results_dir)
        if results_dir.is_dir():
            clean_stale_staging(results_dir, self._store)
        workdir = Path(tempfile.mkdtemp(prefix="mlharness-launch-"))
        try:
            outcome = self._run_child(request, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if outcome.record is not None:
            self._store(outcome.record)
        return outcome

    def _store(self, record: RunRecord) -> None:
        if self.store:
            store_record(record, self.db_path)

    def _run_child(self, request: RunRequest, workdir: Path) -> Outcome:
        write_text(workdir / "request.json", request.to_json())
        command = [sys.executable, "-m", "mlharness.running.run_child", str(workdir)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH")) if p)
        sink = open(self.output, "ab") if self.output is not None else None
        try:
            child = subprocess.Popen(command, start_new_session=True, env=env, stdout=sink,
                                     stderr=subprocess.STDOUT if sink else None)
        finally:
            if sink is not None:
                sink.close()
        stop: list[int] = []  # the signal that asked us to stop, if any
        restore = _catch_stop_signals(stop)
        deadline = time.monotonic() + request.timeout + self.grace + 5.0
        forwarded = False
        exited = _ExitWaiter(child)
        try:
            while True:
                try:
                    returncode = exited(min(1.0, max(0.0, deadline - time.monotonic())))
                    if returncode is not None:
                        break
                except _StopRequested:
                    pass
                if stop and not forwarded:
                    _signal_group(child, stop[0])
                    forwarded = True
                    deadline = min(deadline, time.monotonic() + self.grace)
                if time.monotonic() > deadline:
                    _signal_group(child, signal.SIGKILL)
                    returncode = child.wait()
                    break
        finally:
            restore()
            exited.close()
            if child.poll() is None:  # an exception we did not expect: never leave a run behind
                _signal_group(child, signal.SIGKILL)
                child.wait()
        return self._outcome(workdir, returncode, stop[0] if stop else None, request)

    def _outcome(self, workdir: Path, returncode: int, stopped_by: int | None, request: RunRequest) -> Outcome:
        path = workdir / "outcome.json"
        if path.is_file():
            # The child's own word, also after a signal: it may have finished before the signal came.
            return Outcome.from_dict(json.loads(path.read_text()), str(path))
        # No envelope: the child ended abnormally (os._exit, a signal, a crash) or was killed by us.
        if stopped_by is not None:
            why = f"interrupted by {signal.Signals(stopped_by).name}"
            status = 128 + stopped_by
        elif returncode == -signal.SIGKILL and timed_out(workdir, request):
            why = f"timed out after {request.timeout:g} s"
            status = 1
        else:
            why = f"the run's process {describe_exit(returncode)} before finishing the run"
            status = 1
        staging = started_staging(workdir)
        record = finalize_abandoned(staging, why) if staging is not None and staging.exists() else None
        where = f" (logs kept in {record.results_path})" if record is not None else ""
        return Outcome(kind="error", record=record, error=f"run failed: {why}{where}", exit_status=status)


class _StopRequested(Exception):
    pass


def _catch_stop_signals(stop: list[int]) -> Callable[[], None]:
    """SIGINT and SIGTERM to the parent ask the child to stop; returns the undo. Outside the main
    thread signals cannot be caught, and the caller's handlers stay."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        if not stop:
            stop.append(signum)
        raise _StopRequested()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


class _ExitWaiter:
    """Waits for the child to end: blocked on a pidfd (Linux), not Popen.wait(timeout), which sleeps
    and polls, waking this process about 40 times a second; each wake takes a core for a moment
    from the benchmark running beside it (docs/tuning.md, "This machine's two speeds")."""

    def __init__(self, child: subprocess.Popen):
        self.child = child
        try:
            self.fd: int | None = os.pidfd_open(child.pid)
        except (AttributeError, OSError):  # not Linux, or a kernel before 5.3: Popen's polling
            self.fd = None

    def __call__(self, timeout: float) -> int | None:
        """The child's exit status once it has ended, None if it is still running after `timeout` s."""
        if self.fd is None:
            try:
                return self.child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        readable, _, _ = select.select([self.fd], [], [], timeout)
        return self.child.wait() if readable else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def package_root() -> str | None:
    """The folder to put first on a child's path so that it imports this very mlharness: the one holding
    the `mlharness` package where that is a plain folder (a wheel, a copied tree). An editable install
    maps the checkout's folders into the namespace by its own finder, which the child loads as well;
    the checkout's root is then left off the path (it would expose `harness`, `specs`... as top-level)."""
    package = Path(__file__).resolve().parents[1]
    return str(package.parent) if package.name == "mlharness" else None


def run(request: RunRequest, launcher: Launcher | None = None) -> RunRecord:
    """Run one model in one scenario and mode, in a fresh process of its own; returns the record,
    raises RunFailed (with the failed record) when the run fails."""
    return run_request(request, launcher)


def run_request(request: RunRequest, launcher: Launcher | None = None) -> RunRecord:
    """Submit a request and return its record; a failed run raises RunFailed (with the record)."""
    outcome = (launcher or LocalLauncher()).submit(request)
    if outcome.kind == "result" and outcome.record is not None:
        return outcome.record
    message = outcome.error or "run failed"
    if outcome.traceback_path:
        message += f" (traceback in {outcome.traceback_path})"
    if outcome.record is None:
        raise RunInterrupted(message, outcome.exit_status) if outcome.exit_status > 128 else UserError(message)
    raise RunFailed(message, outcome.record, outcome.exit_status)

