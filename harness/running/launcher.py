"""Launch runs: each RunRequest runs in a fresh process of its own, and comes back as an Outcome.

Why a process per run: LoadGen reads its configuration once per process, user code may call
os._exit, crash or never return, and Ctrl-C must stop a test that LoadGen would otherwise run to
its end. The parent (this module's `LocalLauncher`) only waits, forwards signals and cleans up:

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
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import RunFailed, RunInterrupted, UserError
from mlharness.records.run_record import RunRecord, new_run_id, utc_now
from mlharness.running.request import RunRequest

OUTCOME_SCHEMA_VERSION = 1
GRACE_SECONDS = 1.5  # between forwarding a signal and killing the child's process group
ABORT_WAIT_SECONDS = 0.4  # how long the child lets LoadGen end by itself after an abort
STAGING_PREFIX = ".staging-"


@dataclass(frozen=True)
class Outcome:
    kind: str  # "result" or "error"
    record: RunRecord | None = None
    error: str | None = None
    traceback_path: str | None = None
    exit_status: int = 0  # what the CLI should exit with
    schema_version: int = OUTCOME_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "kind": self.kind,
                "record": self.record.to_dict() if self.record else None, "error": self.error,
                "traceback_path": self.traceback_path, "exit_status": self.exit_status}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "Outcome":
        version = data.get("schema_version")
        if not isinstance(version, int) or version > OUTCOME_SCHEMA_VERSION:
            raise UserError(f"{where}: outcome schema_version {version!r} is newer than this mlharness reads "
                            f"({OUTCOME_SCHEMA_VERSION}); upgrade mlharness")
        record = RunRecord.from_dict(data["record"]) if data.get("record") else None
        return cls(kind=data["kind"], record=record, error=data.get("error"),
                   traceback_path=data.get("traceback_path"), exit_status=int(data.get("exit_status", 0)))


class Launcher(Protocol):
    def submit(self, request: RunRequest) -> Outcome: ...


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


# -- the results folder: checks and abandoned runs ---------------------------------------------------

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


def _owner_alive(staging: Path) -> bool:
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
        data = json.loads((staging / "run.json").read_text())
        record = RunRecord.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError):  # AttributeError: JSON that is not an object
        record = None
    try:
        os.replace(staging, target)
    except FileNotFoundError:
        return None  # another process finalized it first
    (target / "owner.json").unlink(missing_ok=True)
    if record is None:
        write_text(target / "ERROR.txt", error + "\n")
        return None
    record.status = "failed"
    record.error = error
    record.finished_at = utc_now()
    record.results_path = str(target)
    write_json(target / "run.json", record.to_dict())
    return record


def clean_stale_staging(results_dir: Path, store: Callable[[RunRecord], None]) -> list[Path]:
    """Failed-run folders for staging folders of runs whose process is gone (a SIGKILL, a power cut)."""
    cleaned = []
    for staging in sorted(results_dir.glob(f"*/*/*/{STAGING_PREFIX}*")):
        if staging.is_dir() and not _owner_alive(staging):
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
                store.add_run(record.to_dict())
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


# -- the parent ---------------------------------------------------------------------------------------

class LocalLauncher:
    """Runs each request in a fresh local process (see the module docstring)."""

    def __init__(self, grace: float = GRACE_SECONDS, store: bool = True, db_path: Path | None = None,
                 output: Path | None = None):
        self.grace = grace
        self.store = store
        self.db_path = db_path  # None: the results directory's database ($MLHARNESS_DB when set)
        self.output = output  # None: the child writes to this process's stdout and stderr

    def submit(self, request: RunRequest) -> Outcome:
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
        command = [sys.executable, "-m", "mlharness.running.launcher", str(workdir)]
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
        elif returncode == -signal.SIGKILL and _timed_out(workdir, request):
            why = f"timed out after {request.timeout:g} s"
            status = 1
        else:
            why = f"the run's process {describe_exit(returncode)} before finishing the run"
            status = 1
        staging = _started_staging(workdir)
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


def _started_staging(workdir: Path) -> Path | None:
    try:
        return Path(json.loads((workdir / "started.json").read_text())["staging"])
    except (OSError, ValueError, KeyError):
        return None


def _timed_out(workdir: Path, request: RunRequest) -> bool:
    try:
        started = json.loads((workdir / "started.json").read_text())["monotonic"]
    except (OSError, ValueError, KeyError):
        return True
    return time.monotonic() - float(started) >= request.timeout


# -- the child ----------------------------------------------------------------------------------------

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
        self._finalized = False
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
        """True for the one caller that may write the run's final state; False once it is taken."""
        with self._lock:
            if self._finalized:
                return False
            self._finalized = True
            return True

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
        outcome = _error_outcome(exc)
    _exit_with(workdir, outcome)


def package_root() -> str | None:
    """The folder to put first on a child's path so that it imports this very mlharness: the one holding
    the `mlharness` package where that is a plain folder (a wheel, a copied tree). An editable install
    maps the checkout's folders into the namespace by its own finder, which the child loads as well;
    the checkout's root is then left off the path (it would expose `harness`, `specs`... as top-level)."""
    package = Path(__file__).resolve().parents[1]
    return str(package.parent) if package.name == "mlharness" else None


def runner_for(kind: str) -> Any:
    """The module whose `run_here(request, guard)` executes a run of this kind in this process."""
    import importlib

    return importlib.import_module({"loadgen": "mlharness.running.runner", "bricks": "mlharness.bricks.runner"}[kind])


def _error_outcome(exc: BaseException) -> Outcome:
    record = exc.record if isinstance(exc, RunFailed) else None
    status = getattr(exc, "exit_status", 1)
    if isinstance(exc, UserError):
        return Outcome(kind="error", record=record, error=str(exc), exit_status=status,
                       traceback_path=getattr(exc, "traceback_path", None))
    # A bug (ours or a dependency's) outside a run's folder: keep the traceback in the temp folder.
    text = "".join(traceback.format_exception(exc))
    path = Path(tempfile.gettempdir()) / f"mlharness-traceback-{new_run_id()}.txt"
    write_text(path, text)
    return Outcome(kind="error", record=record, error=f"internal error: {type(exc).__name__}: {exc}",
                   traceback_path=str(path), exit_status=1)


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


if __name__ == "__main__":
    child_main(Path(sys.argv[1]))
