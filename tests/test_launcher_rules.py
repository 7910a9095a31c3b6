"""The launcher's rules, called in-process on real folders, files, processes and signals (issue 20,
mutation: launcher): how an exit status is told, which results folders are refused, when a staging
folder counts as abandoned and how it becomes a failed run, where a record is stored, the outcome
envelope and its schema, what the parent makes of a child that left no envelope, the child's
guard (one finalizer, watches, aborts), and how run_request turns an outcome into a record or an
error. The real child processes, signals and timeouts are tests/test_faults.py's.

No verdict reads the clock or depends on the machine's speed (issue 38): tests wait for the event
itself with a deadline only a missing event reaches; who ended a run is read from the signals the
parent sent, not from how long it took; a run that must outlast something lasts an hour."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from mlharness.errors import RunFailed, RunInterrupted, UserError
from mlharness.records.results import ScenarioDir
from mlharness.records.run_record import RunRecord, new_run_id
from mlharness.running import launcher, outcome as outcome_mod, run_child, run_folders
from mlharness.running.launcher import LocalLauncher, run_request
from mlharness.running.outcome import OUTCOME_SCHEMA_VERSION, Outcome, describe_exit
from mlharness.running.run_child import RunGuard
from mlharness.running.run_folders import (
    STAGING_PREFIX,
    check_results_dir,
    clean_stale_staging,
    finalize_abandoned,
    record_results_dir,
    store_record,
)
from mlharness.running.request import RunRequest
from mlharness.store import result_store
from mlharness.store.result_store import ResultStore
from tests.support import HOUR_LONG_SETTINGS, HOUR_LONG_TIMEOUT_S, ended, hour_long_null, null_model_with, wait_for
from tests.unwritable import read_only_folder, without_overrides

ROOT = str(Path(__file__).resolve().parents[1])




def child_env() -> dict[str, str]:
    """This checkout first on a child's path, the caller's entries (a mutation run's hooks) behind it."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def record(run_id: str | None = None, **changes: object) -> RunRecord:
    """A run's preliminary record, as the runner writes it when the run starts."""
    return RunRecord(run_id=run_id or new_run_id(), command="mlharness run null", model={"name": "null"},
                     dataset={"name": "null-samples"}, backend="null", scenario="Offline", mode="performance",
                     **changes)


def staging_of(results: Path, rec: RunRecord, *, owner: dict | None = None, run_json: bool = True) -> Path:
    """results/<system>/<model>/<Scenario>/.staging-<id>, holding the preliminary run.json."""
    staging = results / "sys" / "null" / "Offline" / f"{STAGING_PREFIX}{rec.run_id}"
    staging.mkdir(parents=True)
    if run_json:
        (staging / "run.json").write_text(json.dumps(dataclasses.replace(rec, results_path=str(staging)).to_dict()))
    (staging / "mlperf_log_detail.txt").write_text("kept\n")
    if owner is not None:
        (staging / "owner.json").write_text(json.dumps(owner))
    return staging


def my_owner() -> dict:
    return {"pid": os.getpid(), "create_time": psutil.Process().create_time()}


# ---- exit statuses ------------------------------------------------------------------------------

def test_describe_exit() -> None:
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "was killed by SIGSEGV"
    assert describe_exit(-200) == "was killed by signal 200"


# ---- the results folder ---------------------------------------------------------------------------

def test_results_dir_checks(tmp_path: Path) -> None:
    check_results_dir(tmp_path)  # an existing writable folder
    check_results_dir(tmp_path / "new" / "deeper")  # created later, by the run
    assert not (tmp_path / "new").exists(), "nothing is created by the check"
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(UserError) as raised:
        check_results_dir(afile)
    assert str(raised.value) == f"--results-dir {afile}: exists and is not a directory"
    with pytest.raises(UserError) as raised:
        check_results_dir(afile / "sub" / "results")
    assert str(raised.value) == f"--results-dir {afile / 'sub' / 'results'}: {afile} is not a directory"
    relative = Path("rel") / "results"  # the test runs in tmp_path: resolved against it
    check_results_dir(relative)


CHECK = """\
import sys
from pathlib import Path
from mlharness.errors import UserError
from mlharness.running.run_folders import check_results_dir
for arg in sys.argv[1:]:
    try:
        check_results_dir(Path(arg))
        print("ok")
    except UserError as error:
        print(error)
try:  # what the check foretold: this process cannot write there
    open(Path(sys.argv[2]) / "probe", "w")
    print("wrote")
except PermissionError:
    print("PermissionError")
"""


def test_unwritable_results_dirs(tmp_path: Path) -> None:
    """Checked in a child that the mode bits bind, root or not (tests/unwritable.py); the folder
    beside the locked one passes there, so the refusals are the locked folder's."""
    locked = read_only_folder(tmp_path / "locked")
    open_ = tmp_path / "open"
    open_.mkdir()
    try:
        done = subprocess.run([sys.executable, "-c", CHECK, str(open_), str(locked), str(locked / "a" / "b"),
                               str(open_ / "new")], env=child_env(), capture_output=True, text=True, timeout=120,
                              **without_overrides())
    finally:
        locked.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "ok",
        f"--results-dir {locked}: not writable",
        f"--results-dir {locked / 'a' / 'b'}: cannot be created ({locked} is not writable)",
        "ok",
        "PermissionError",
    ]
    assert list(locked.iterdir()) == [] and not (open_ / "new").exists(), "nothing is created by the check"


# ---- abandoned staging folders ------------------------------------------------------------------

def test_an_owner_is_alive_only_as_the_same_living_process(tmp_path: Path) -> None:
    rec = record()
    staging = staging_of(tmp_path, rec, owner=my_owner())
    assert run_folders.owner_alive(staging)
    (staging / "owner.json").write_text(json.dumps({"pid": os.getpid(), "create_time": my_owner()["create_time"] - 5}))
    assert not run_folders.owner_alive(staging), "a reused pid is another process"
    (staging / "owner.json").write_text(json.dumps({"pid": os.getpid(), "create_time": my_owner()["create_time"] + 0.5}))
    assert run_folders.owner_alive(staging), "create times within a second are the same process"
    for off in (1.0, -1.0, 1.5):
        (staging / "owner.json").write_text(json.dumps({"pid": os.getpid(), "create_time": my_owner()["create_time"] + off}))
        assert not run_folders.owner_alive(staging), f"a create time {off:+} s away is another process"
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    (staging / "owner.json").write_text(json.dumps({"pid": ended.pid, "create_time": 0}))
    assert not run_folders.owner_alive(staging)


def test_a_zombie_owner_is_gone(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, "the child a zombie")
        staging = staging_of(tmp_path, record(),
                             owner={"pid": child.pid, "create_time": psutil.Process(child.pid).create_time()})
        assert not run_folders.owner_alive(staging)
    finally:
        child.wait()


@pytest.mark.parametrize("owner", ["missing", "not json", "no pid", "bad pid"])
def test_without_a_readable_owner_only_an_hour_old_folder_is_abandoned(tmp_path: Path, owner: str) -> None:
    staging = staging_of(tmp_path, record())
    text = {"missing": None, "not json": "{", "no pid": json.dumps({"create_time": 1.0}),
            "bad pid": json.dumps({"pid": "x", "create_time": 1.0})}[owner]
    if text is not None:
        (staging / "owner.json").write_text(text)
    assert run_folders.owner_alive(staging)
    hour_ago = time.time() - 3601
    os.utime(staging, (hour_ago, hour_ago))
    assert not run_folders.owner_alive(staging)
    os.utime(staging, (hour_ago + 120, hour_ago + 120))
    assert run_folders.owner_alive(staging)
    just_over = time.time() - 3600.5
    os.utime(staging, (just_over, just_over))
    assert not run_folders.owner_alive(staging), "untouched for an hour: abandoned"
    assert not run_folders.owner_alive(tmp_path / "no-such-staging")


def test_finalize_abandoned_makes_a_failed_run_of_the_preliminary_record(tmp_path: Path) -> None:
    rec = record()
    staging = staging_of(tmp_path, rec, owner={"pid": 1, "create_time": 0})
    failed = finalize_abandoned(staging, "the reason")
    target = staging.with_name(f"failed-{rec.run_id}")
    assert failed is not None and not staging.exists()
    assert sorted(p.name for p in target.iterdir()) == ["mlperf_log_detail.txt", "run.json"]
    written = json.loads((target / "run.json").read_text())
    assert written == failed.to_dict()
    assert (written["run_id"], written["status"], written["error"], written["results_path"]) == (
        rec.run_id, "failed", "the reason", str(target))
    assert written["finished_at"] and written["started_at"] == rec.started_at
    assert finalize_abandoned(staging, "again") is None, "already finalized (by another process)"


def test_finalize_abandoned_without_a_readable_record_keeps_the_reason(tmp_path: Path) -> None:
    rec = record()
    staging = staging_of(tmp_path, rec, run_json=False)
    assert finalize_abandoned(staging, "it died") is None
    target = staging.with_name(f"failed-{rec.run_id}")
    assert (target / "ERROR.txt").read_text() == "it died\n"
    assert not (target / "run.json").exists()
    rec2 = record()
    staging2 = staging_of(tmp_path, rec2)
    (staging2 / "run.json").write_text("{ damaged")
    assert finalize_abandoned(staging2, "damaged") is None
    assert (staging2.with_name(f"failed-{rec2.run_id}") / "ERROR.txt").read_text() == "damaged\n"
    rec3 = record()
    staging3 = staging_of(tmp_path, rec3)
    (staging3 / "run.json").write_text(json.dumps(["not", "a", "record"]))  # was an AttributeError
    assert finalize_abandoned(staging3, "a list") is None
    assert (staging3.with_name(f"failed-{rec3.run_id}") / "ERROR.txt").read_text() == "a list\n"
    rec4 = record()
    staging4 = staging_of(tmp_path, rec4)
    (staging4 / "run.json").write_text("{}")
    assert finalize_abandoned(staging4, "no fields") is None


def test_clean_stale_staging_closes_only_the_runs_whose_process_is_gone(tmp_path: Path) -> None:
    dead, alive, old = record(), record(), record()
    gone = staging_of(tmp_path, dead, owner={"pid": 1, "create_time": 0})  # pid 1 is not the owner that started
    live = staging_of(tmp_path, alive, owner=my_owner())
    no_owner = staging_of(tmp_path, old)
    hour_ago = time.time() - 7200
    os.utime(no_owner, (hour_ago, hour_ago))
    stray = tmp_path / "sys" / "null" / "Offline" / f"{STAGING_PREFIX}a-file"
    stray.write_text("not a folder")
    os.utime(stray, (hour_ago, hour_ago))  # as old as an abandoned folder: still not one
    shallow = tmp_path / "sys" / f"{STAGING_PREFIX}too-shallow"
    shallow.mkdir()
    stored: list[RunRecord] = []
    cleaned = clean_stale_staging(tmp_path, stored.append)
    assert cleaned == sorted([gone, no_owner])
    assert sorted(r.run_id for r in stored) == sorted([dead.run_id, old.run_id])
    assert {r.error for r in stored} == {"abandoned: the run's process ended without finishing it (found and closed by a "
                                         "later run)"}
    assert all(r.status == "failed" for r in stored)
    assert live.is_dir() and stray.is_file() and shallow.is_dir()
    assert (gone.with_name(f"failed-{dead.run_id}") / "run.json").is_file()


def test_a_stale_folder_without_a_record_is_cleaned_but_not_stored(tmp_path: Path) -> None:
    rec = record()
    staging = staging_of(tmp_path, rec, owner={"pid": 1, "create_time": 0}, run_json=False)
    stored: list[RunRecord] = []
    assert clean_stale_staging(tmp_path, stored.append) == [staging]
    assert stored == []


# ---- storing records ----------------------------------------------------------------------------

def test_record_results_dir_from_the_runs_folder_or_a_failed_one(tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert record_results_dir(record(results_path=str(results / "sys" / "m" / "Offline" / "runs" / "id1"))) == results
    assert record_results_dir(record(results_path=str(results / "sys" / "m" / "Offline" / "failed-id1"))) == results
    assert record_results_dir(record(results_path=str(results / "sys" / "m" / "Offline" / ".staging-id1"))) == results


def test_store_record_into_a_given_database_or_the_results_dirs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    rec = record(status="failed", error="x", results_path=str(results / "sys" / "null" / "Offline" / "failed-a"))
    store_record(rec)
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        assert store.get_record(rec.run_id).error == "x"
    other = tmp_path / "elsewhere" / "db.sqlite"
    rec2 = record(results_path=rec.results_path)
    store_record(rec2, other)
    with ResultStore(other, create=False) as store:
        assert [r["run_id"] for r in store.list_runs()] == [rec2.run_id]
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        assert rec2.run_id not in [r["run_id"] for r in store.list_runs()]


@pytest.mark.parametrize("damage", ["not a database", "a folder", "other tables"])
def test_a_database_that_cannot_take_the_record_is_one_line_naming_the_run_folder(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "db.sqlite"
    if damage == "a folder":
        db.mkdir()
    elif damage == "other tables":  # the current schema version, but not its tables: SQLite refuses the insert
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE runs (something TEXT)")
            conn.execute(f"PRAGMA user_version = {result_store.SCHEMA_VERSION}")
        conn.close()
    else:
        db.write_bytes(b"this is not SQLite" * 100)
    rec = record(results_path=str(tmp_path / "results" / "sys" / "null" / "Offline" / "failed-a"))
    with pytest.raises(UserError) as raised:
        store_record(rec, db)
    text = str(raised.value)
    assert "\n" not in text
    assert text.startswith(f"the run's results are in {rec.results_path}, but storing its record failed: ")


def test_the_launcher_stores_only_when_asked(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    rec = record(results_path=str(tmp_path / "results" / "s" / "m" / "Offline" / "failed-x"))
    LocalLauncher(store=False, db_path=db)._store(rec)
    assert not db.exists()
    LocalLauncher(db_path=db)._store(rec)
    with ResultStore(db, create=False) as store:
        assert [r["run_id"] for r in store.list_runs()] == [rec.run_id]
    assert LocalLauncher().grace == launcher.GRACE_SECONDS and LocalLauncher().store is True
    assert LocalLauncher().db_path is None and LocalLauncher().output is None


# ---- the outcome envelope -----------------------------------------------------------------------

def test_outcome_round_trips_through_json() -> None:
    rec = record(status="ok")
    outcome = Outcome(kind="result", record=rec, error=None, traceback_path="/tmp/tb.txt", exit_status=3)
    data = json.loads(json.dumps(outcome.to_dict()))
    assert data == {"schema_version": OUTCOME_SCHEMA_VERSION, "kind": "result", "record": rec.to_dict(),
                    "error": None, "traceback_path": "/tmp/tb.txt", "exit_status": 3}
    assert Outcome.from_dict(data, "x") == outcome
    bare = Outcome(kind="error", error="boom")
    assert bare.to_dict()["record"] is None and bare.exit_status == 0
    assert Outcome.from_dict({"schema_version": 1, "kind": "error", "error": "boom"}, "x") == bare


@pytest.mark.parametrize("version", [OUTCOME_SCHEMA_VERSION + 1, None, "1"])
def test_an_outcome_of_another_schema_is_refused_in_one_line(version: object) -> None:
    with pytest.raises(UserError) as raised:
        Outcome.from_dict({"schema_version": version, "kind": "result"}, "/w/outcome.json")
    assert str(raised.value) == (f"/w/outcome.json: outcome schema_version {version!r} is newer than this mlharness "
                                 f"reads ({OUTCOME_SCHEMA_VERSION}); upgrade mlharness")


# ---- the parent: a child that left no envelope -------------------------------------------------

def request(tmp_path: Path, timeout: float = 30) -> RunRequest:
    return RunRequest(model="null", scenario="Offline", results_dir=tmp_path / "results", timeout=timeout)


def started(workdir: Path, staging: Path | None, run_id: str, seconds_ago: float) -> None:
    workdir.mkdir(exist_ok=True)
    (workdir / "started.json").write_text(json.dumps({"staging": str(staging), "run_id": run_id,
                                                      "monotonic": time.monotonic() - seconds_ago}))


def test_the_childs_own_outcome_is_taken_as_it_is(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    written = Outcome(kind="error", error="its own word", exit_status=7)
    (workdir / "outcome.json").write_text(json.dumps(written.to_dict()))
    assert LocalLauncher()._outcome(workdir, -signal.SIGKILL, signal.SIGINT, request(tmp_path)) == written


def test_an_outcome_of_a_newer_mlharness_names_its_file(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "outcome.json").write_text(json.dumps({"schema_version": OUTCOME_SCHEMA_VERSION + 1, "kind": "result"}))
    with pytest.raises(UserError) as raised:
        LocalLauncher()._outcome(workdir, 0, None, request(tmp_path))
    assert str(raised.value).startswith(f"{workdir / 'outcome.json'}: outcome schema_version ")


def test_a_child_that_exited_without_an_outcome_is_a_failed_run(tmp_path: Path) -> None:
    rec = record()
    staging = staging_of(tmp_path / "results", rec, owner=my_owner())
    workdir = tmp_path / "w"
    started(workdir, staging, rec.run_id, 1)
    outcome = LocalLauncher()._outcome(workdir, 3, None, request(tmp_path))
    target = staging.with_name(f"failed-{rec.run_id}")
    why = "the run's process exited with status 3 before finishing the run"
    assert outcome.kind == "error" and outcome.exit_status == 1
    assert outcome.error == f"run failed: {why} (logs kept in {target})"
    assert outcome.record is not None and outcome.record.error == why and outcome.record.results_path == str(target)
    assert json.loads((target / "run.json").read_text())["error"] == why


def test_a_child_killed_by_a_signal_without_a_started_run(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    outcome = LocalLauncher()._outcome(workdir, -signal.SIGSEGV, None, request(tmp_path))
    assert outcome == Outcome(kind="error", error="run failed: the run's process was killed by SIGSEGV before "
                                                  "finishing the run", exit_status=1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_child_is_interrupted_with_128_plus_the_signal(tmp_path: Path, sig: int) -> None:
    rec = record()
    staging = staging_of(tmp_path / "results", rec, owner=my_owner())
    workdir = tmp_path / "w"
    started(workdir, staging, rec.run_id, 1)
    outcome = LocalLauncher()._outcome(workdir, -signal.SIGKILL, sig, request(tmp_path))
    name = signal.Signals(sig).name
    assert outcome.exit_status == 128 + sig
    assert outcome.error.startswith(f"run failed: interrupted by {name} (logs kept in ")
    assert outcome.record.error == f"interrupted by {name}"


def test_a_killed_child_past_its_timeout_timed_out(tmp_path: Path) -> None:
    rec = record()
    staging = staging_of(tmp_path / "results", rec, owner=my_owner())
    workdir = tmp_path / "w"
    started(workdir, staging, rec.run_id, 100)
    outcome = LocalLauncher()._outcome(workdir, -signal.SIGKILL, None, request(tmp_path, timeout=2.5))
    assert outcome.exit_status == 1
    assert outcome.error.startswith("run failed: timed out after 2.5 s (logs kept in ")
    # Killed before its timeout (by someone else): not a timeout.
    rec2 = record()
    staging2 = staging_of(tmp_path / "results2", rec2, owner=my_owner())
    started(workdir, staging2, rec2.run_id, 1)
    outcome = LocalLauncher()._outcome(workdir, -signal.SIGKILL, None, request(tmp_path, timeout=30))
    assert outcome.error.startswith("run failed: the run's process was killed by SIGKILL before finishing the run")
    # Killed, a timeout reached, but the exit was not a SIGKILL: told as it was.
    rec3 = record()
    staging3 = staging_of(tmp_path / "results3", rec3, owner=my_owner())
    started(workdir, staging3, rec3.run_id, 100)
    outcome = LocalLauncher()._outcome(workdir, -signal.SIGTERM, None, request(tmp_path, timeout=2.5))
    assert outcome.error.startswith("run failed: the run's process was killed by SIGTERM")


def test_timed_out_reads_the_childs_start(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    assert run_folders.timed_out(workdir, request(tmp_path, 60)), "never started: the whole time went by"
    (workdir / "started.json").write_text("{")
    assert run_folders.timed_out(workdir, request(tmp_path, 60))
    (workdir / "started.json").write_text(json.dumps({"staging": "x"}))
    assert run_folders.timed_out(workdir, request(tmp_path, 60))
    started(workdir, None, "id", 4)  # the 56 s left cannot run out between these lines
    assert not run_folders.timed_out(workdir, request(tmp_path, 60))
    started(workdir, None, "id", 60.5)  # time passing only makes it later
    assert run_folders.timed_out(workdir, request(tmp_path, 60))


def test_started_staging(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    assert run_folders.started_staging(workdir) is None
    (workdir / "started.json").write_text("not json")
    assert run_folders.started_staging(workdir) is None
    (workdir / "started.json").write_text(json.dumps({"run_id": "x"}))
    assert run_folders.started_staging(workdir) is None
    started(workdir, tmp_path / "s", "x", 0)
    assert run_folders.started_staging(workdir) == tmp_path / "s"
    # The folder it names is gone (finalized elsewhere): no record, no "logs kept".
    outcome = LocalLauncher()._outcome(workdir, 1, None, request(tmp_path))
    assert outcome.record is None and outcome.error.endswith("before finishing the run")


# ---- signals in the parent -----------------------------------------------------------------------

def test_stop_signals_are_caught_once_and_restored(tmp_path: Path) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop: list[int] = []
    restore = launcher._catch_stop_signals(stop)
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with pytest.raises(launcher._StopRequested):
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises in this thread before this ends
        assert stop == [signal.SIGTERM], "the first signal is the one that asked to stop"
    finally:
        restore()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_stop_signals_outside_the_main_thread_are_left_alone() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    got: list = []
    thread = threading.Thread(target=lambda: got.append(launcher._catch_stop_signals([])))
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    got[0]()  # the undo does nothing
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_signal_group_reaches_the_whole_group_and_ignores_an_ended_one() -> None:
    # Both would live an hour: ended within the test, they were killed.
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); time.sleep(3600)"],
                             start_new_session=True)
    grandchildren: list[psutil.Process] = []
    try:
        wait_for(lambda: len(psutil.Process(child.pid).children()) >= 1, "the grandchild started")
        grandchildren = psutil.Process(child.pid).children()
        (grandchild,) = grandchildren
        launcher._signal_group(child, signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
        wait_for(lambda: ended(grandchild), "the grandchild killed")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for left in grandchildren:
            if not ended(left):
                left.kill()
    launcher._signal_group(child, signal.SIGKILL)  # ended and reaped: nothing happens


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling fallback"])
def test_the_exit_waiter_gives_the_status_when_the_child_ends_and_none_before(pidfd: bool) -> None:
    # The child ends when told (its stdin closed), not after a time.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"], stdin=subprocess.PIPE)
    waiter = launcher._ExitWaiter(child)
    if not pidfd:
        waiter.close()  # as where pidfd_open is missing: Popen's own wait
    try:
        assert waiter(0.05) is None, "still running"
        child.stdin.close()
        started = time.monotonic()
        assert waiter(120.0) == 3
        # A hang guard: it returns as the child ends (milliseconds), where waiting out the timeout takes 120 s.
        assert time.monotonic() - started < 60, "returned at the timeout, not when the child ended"
        assert waiter(0.0) == 3, "an ended child stays ended"
    finally:
        waiter.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_exit_waiter_sleeps_instead_of_polling() -> None:
    """The parent waits beside a benchmark: Popen.wait(timeout) wakes about 40 times a second, the
    pidfd wait only when the child ends or the timeout passes."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    waiter = launcher._ExitWaiter(child)
    try:
        if waiter.fd is None:
            pytest.skip("no pidfd_open here (Linux 5.3+): the launcher polls as Popen does")
        import resource

        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        assert waiter(1.0) is None
        wakes = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
        assert wakes <= 3, f"{wakes} voluntary context switches in a 1 s wait"
    finally:
        waiter.close()
        child.kill()
        child.wait()


# ---- the child's guard --------------------------------------------------------------------------

class FailRecorder:
    """The SystemUnderTest's fail_staging only (what the guard calls)."""

    def __init__(self) -> None:
        self.failed: list[BaseException] = []

    def fail_staging(self, exc: BaseException) -> None:
        self.failed.append(exc)


def test_only_one_thread_finalizes_and_it_may_ask_again() -> None:
    """The main thread claims the run's end when LoadGen returns and asks again when it writes it; an
    abort's thread, asking after it, is refused (and so does not exit over the main thread's writing)."""
    guard = RunGuard(None)
    assert guard.finalizing() is True
    assert guard.finalizing() is True
    others: list[bool] = []
    other = threading.Thread(target=lambda: others.append(guard.finalizing()))
    other.start()
    other.join()
    assert others == [False] and guard.finalizing() is True


def test_a_run_claims_its_end_as_soon_as_loadgen_returns(tmp_path: Path) -> None:
    """A run in this process (as the launcher's child runs it) with the real guard: the first thread to
    ask for the run's end is the main one, from inside the LoadGen test's function, before the SUT's
    outcome (and a network run's requests log) is written; so a failed request's abort, coming then,
    leaves the writing to it (under load the abort once wrote the failed run first and the log was lost)."""
    import traceback

    from mlharness.running import runner

    class Watched(RunGuard):
        def __init__(self) -> None:
            super().__init__(None)
            self.first_asked_from: list[str] = []

        def finalizing(self) -> bool:
            if not self.first_asked_from:
                self.first_asked_from = [frame.name for frame in traceback.extract_stack()]
            return super().finalizing()

    guard = Watched()
    record = runner.run_here(RunRequest(model="null", scenario="Offline", quick=True, results_dir=tmp_path / "r"), guard)
    assert record.status == "ok"
    assert "run_loadgen" in guard.first_asked_from and "publish" not in guard.first_asked_from


def test_started_writes_the_preliminary_record_the_owner_and_the_start(tmp_path: Path) -> None:
    rec = record()
    where = ScenarioDir(tmp_path / "results" / "sys" / "null" / "Offline", rec.run_id)
    workdir = tmp_path / "w"
    workdir.mkdir()
    guard = RunGuard(workdir)
    before = time.monotonic()
    guard.started(rec, where)
    assert guard.record is rec and guard.where is where
    assert json.loads((where.staging / "run.json").read_text()) == rec.to_dict()
    assert json.loads((where.staging / "owner.json").read_text()) == my_owner()
    start = json.loads((workdir / "started.json").read_text())
    assert (start["staging"], start["run_id"]) == (str(where.staging), rec.run_id)
    assert before <= start["monotonic"] <= time.monotonic()
    assert run_folders.owner_alive(where.staging), "a running run's folder is not abandoned"
    RunGuard(None).started(record(), ScenarioDir(tmp_path / "r2", "id2"))  # no workdir: no started.json
    assert (tmp_path / "r2" / ".staging-id2" / "run.json").is_file()


def _abort_from_another_thread(guard: RunGuard, reason: str, exit_status: int) -> None:
    """As a signal's watcher, a timer or a failed request calls it: from a thread of its own."""
    aborting = threading.Thread(target=guard.abort, args=(reason, exit_status))
    aborting.start()
    aborting.join()


def test_an_abort_before_any_sut_is_attached(tmp_path: Path) -> None:
    """A signal during model load: nothing to fail yet; the abort is kept for the SUT to come."""
    guard = RunGuard(None)
    assert (guard.sut, guard.aborted, guard.parent_gone) == (None, None, False)
    assert guard.finalizing()
    _abort_from_another_thread(guard, "interrupted by SIGTERM", 143)
    assert str(guard.aborted) == "interrupted by SIGTERM"
    sut = FailRecorder()
    guard.attach_sut(sut)
    assert sut.failed == [guard.aborted]


def test_an_abort_fails_the_sut_once_and_a_later_sut_too(tmp_path: Path) -> None:
    guard = RunGuard(None)
    sut = FailRecorder()
    guard.attach_sut(sut)
    assert sut.failed == []
    assert guard.finalizing()  # the main thread is writing the outcome: abort must not exit
    _abort_from_another_thread(guard, "interrupted by SIGINT", 130)
    assert isinstance(guard.aborted, RunInterrupted)
    assert (str(guard.aborted), guard.aborted.exit_status) == ("interrupted by SIGINT", 130)
    assert sut.failed == [guard.aborted]
    _abort_from_another_thread(guard, "a second reason", 1)
    assert str(guard.aborted) == "interrupted by SIGINT" and sut.failed == [guard.aborted]
    later = FailRecorder()
    guard.attach_sut(later)
    assert later.failed == [guard.aborted]


def test_a_watch_aborts_when_user_code_overruns_and_not_when_it_ends(tmp_path: Path) -> None:
    guard = RunGuard(None)
    assert guard.finalizing()
    done = guard.watch(30, "LoadQuerySamples (load and preprocess of 4 samples)")
    done()
    assert guard.aborted is None
    assert guard.watch(0, "anything")() is None and guard.watch(None, "anything")() is None
    sut = FailRecorder()
    guard.attach_sut(sut)
    guard.watch(0.05, "LoadQuerySamples (load and preprocess of 4 samples)")
    wait_for(lambda: bool(sut.failed), "the watch's abort")
    assert str(guard.aborted) == ("LoadQuerySamples (load and preprocess of 4 samples) did not finish within 0.05 s "
                                  "(raise the harness key load_timeout if that is expected)")
    assert guard.aborted.exit_status == 1 and sut.failed == [guard.aborted]
    # The guard's timers never keep the process alive (pytest-timeout's own timer, named after it, aside).
    assert all(t.daemon for t in threading.enumerate()
               if isinstance(t, threading.Timer) and not t.name.startswith("pytest_timeout"))


def test_failing_from_outside_finalizes_the_run_and_stores_it_when_the_parent_is_gone(tmp_path: Path,
                                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    monkeypatch.setenv("MLHARNESS_DB", str(tmp_path / "db.sqlite"))
    for parent_gone in (False, True):
        rec = record()
        where = ScenarioDir(results / "sys" / "null" / "Offline", rec.run_id)
        guard = RunGuard(None)
        guard.started(rec, where)
        if parent_gone:  # else as a guard starts: the parent is there
            guard.parent_gone = True
        outcome = guard._fail_from_outside("the launching process ended", 1)
        target = where.root / f"failed-{rec.run_id}"
        assert outcome == Outcome(kind="error", record=outcome.record, exit_status=1,
                                  error=f"run failed: the launching process ended (logs kept in {target})")
        assert outcome.record.status == "failed" and outcome.record.results_path == str(target)
        assert outcome.record.error == "the launching process ended"
        stored = (tmp_path / "db.sqlite").exists() and rec.run_id in [
            r["run_id"] for r in ResultStore(tmp_path / "db.sqlite").list_runs()]
        assert stored is parent_gone, "only a run whose parent is gone stores itself"
    nothing = RunGuard(None)._fail_from_outside("interrupted by SIGTERM", 143)
    assert nothing == Outcome(kind="error", error="run failed: interrupted by SIGTERM", exit_status=143)


# ---- errors as outcomes, outcomes as results ----------------------------------------------------

def test_error_outcomes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    user = outcome_mod.error_outcome(UserError("bad flag"))
    assert user == Outcome(kind="error", error="bad flag", exit_status=1)
    rec = record(status="failed")
    failed = outcome_mod.error_outcome(RunFailed("it failed", rec, 130))
    assert failed == Outcome(kind="error", record=rec, error="it failed", exit_status=130)
    kept = UserError("with a traceback")
    kept.traceback_path = "/somewhere/tb.txt"  # type: ignore[attr-defined]
    assert outcome_mod.error_outcome(kept).traceback_path == "/somewhere/tb.txt"
    try:
        {}["missing"]
    except KeyError as caught:
        exc = caught
        bug = outcome_mod.error_outcome(exc)
    assert bug.kind == "error" and bug.record is None and bug.exit_status == 1
    assert bug.error == "internal error: KeyError: 'missing'"
    path = Path(bug.traceback_path)
    assert path.parent == tmp_path and path.name.startswith("mlharness-traceback-")
    import traceback

    assert path.read_text() == "".join(traceback.format_exception(exc))


class Given:
    """A launcher that answers with a given outcome (what a remote launcher carries back)."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.got: list[RunRequest] = []

    def submit(self, req: RunRequest) -> Outcome:
        self.got.append(req)
        return self.outcome


def test_run_request_turns_outcomes_into_records_and_errors(tmp_path: Path) -> None:
    req = request(tmp_path)
    ok = record(status="ok")
    given = Given(Outcome(kind="result", record=ok))
    assert run_request(req, given) is ok and given.got == [req]
    given = Given(Outcome(kind="result", record=ok))
    assert launcher.run(req, given) is ok and given.got == [req]

    failed = record(status="failed")
    with pytest.raises(RunFailed) as raised:
        run_request(req, Given(Outcome(kind="error", record=failed, error="run failed: x", exit_status=130)))
    assert (str(raised.value), raised.value.record, raised.value.exit_status) == ("run failed: x", failed, 130)

    with pytest.raises(RunFailed) as raised:
        run_request(req, Given(Outcome(kind="error", record=failed, traceback_path="/t/tb.txt", exit_status=1)))
    assert str(raised.value) == "run failed (traceback in /t/tb.txt)" and raised.value.exit_status == 1

    for status in (130, 129):
        with pytest.raises(RunInterrupted) as interrupted:
            run_request(req, Given(Outcome(kind="error", error="run failed: interrupted", exit_status=status)))
        assert (str(interrupted.value), interrupted.value.exit_status) == ("run failed: interrupted", status)

    for status in (1, 128):
        with pytest.raises(UserError) as raised:
            run_request(req, Given(Outcome(kind="error", error="bad flag", exit_status=status)))
        assert type(raised.value) is UserError and str(raised.value) == "bad flag"

    with pytest.raises(UserError) as raised:
        run_request(req, Given(Outcome(kind="result", record=None)))
    assert type(raised.value) is UserError and str(raised.value) == "run failed"


def test_each_run_kind_has_its_runner() -> None:
    import mlharness.bricks.runner
    import mlharness.running.runner

    assert run_child.runner_for("loadgen") is mlharness.running.runner
    assert run_child.runner_for("bricks") is mlharness.bricks.runner
    with pytest.raises(KeyError):
        run_child.runner_for("other")


# ---- real runs through the launcher, the parent in this process --------------------------------

LONG = HOUR_LONG_SETTINGS
TIMEOUT = HOUR_LONG_TIMEOUT_S


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder the launcher makes its work folders in."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder


def under_way(results: Path) -> bool:
    """LoadGen's test has begun in the run's staging folder (its detail log is written)."""
    return any(p.stat().st_size > 0 for p in results.rglob(".staging-*/performance/run_1/mlperf_log_detail.txt"))


def sent_signals(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The signals the parent sends its run's process group, in order (sent as they were)."""
    sent: list[int] = []
    real = launcher._signal_group

    def recording(child: subprocess.Popen, sig: int) -> None:
        sent.append(sig)
        real(child, sig)

    monkeypatch.setattr(launcher, "_signal_group", recording)
    return sent


def when_claimed(results: Path, then: Callable[[], None]) -> threading.Thread:
    """Call `then` from another thread once a run's staging folder is claimed (owner.json written)."""
    def wait() -> None:
        wait_for(lambda: bool(list(results.rglob(".staging-*/owner.json"))), "the run's folder claimed")
        then()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_a_run_comes_back_as_its_record_and_is_stored(tmp_path: Path, private_tmp: Path) -> None:
    """And first, a folder abandoned by an earlier run is closed and stored; the child's output goes
    to the given file; the work folder is removed."""
    results, db, out = tmp_path / "results", tmp_path / "db.sqlite", tmp_path / "out.txt"
    abandoned = record()
    staging_of(results, abandoned, owner={"pid": 1, "create_time": 0})
    req = RunRequest(model="null", scenario="Offline", quick=True, results_dir=results, timeout=60)
    outcome = LocalLauncher(db_path=db, output=out).submit(req)
    assert (outcome.kind, outcome.error, outcome.exit_status) == ("result", None, 0)
    rec = outcome.record
    assert rec.status == "ok" and Path(rec.results_path).parent.name == "runs"
    assert json.loads((Path(rec.results_path) / "run.json").read_text())["run_id"] == rec.run_id
    with ResultStore(db, create=False) as store:
        assert {r["run_id"]: r["status"] for r in store.list_runs()} == {rec.run_id: "ok", abandoned.run_id: "failed"}
    assert out.is_file()
    assert list(private_tmp.glob("mlharness-launch-*")) == []
    assert not list(results.rglob(".staging-*"))


def test_a_child_that_exits_mid_run_is_a_failed_run(tmp_path: Path, private_tmp: Path) -> None:
    results, db = tmp_path / "results", tmp_path / "db.sqlite"
    model = null_model_with(tmp_path / "models", preprocess="import os\n\ndef preprocess(sample, ctx):\n    os._exit(3)\n")
    req = RunRequest(model=str(model), scenario="Offline", quick=True, results_dir=results, timeout=60)
    outcome = LocalLauncher(db_path=db, output=tmp_path / "out.txt").submit(req)
    why = "the run's process exited with status 3 before finishing the run"
    assert outcome.kind == "error" and outcome.exit_status == 1
    assert outcome.error == f"run failed: {why} (logs kept in {outcome.record.results_path})"
    assert Path(outcome.record.results_path).name == f"failed-{outcome.record.run_id}"
    with ResultStore(db, create=False) as store:
        assert store.get_record(outcome.record.run_id).error == why
    with pytest.raises(RunFailed) as raised:
        run_request(req, LocalLauncher(db_path=db, output=tmp_path / "out.txt"))
    assert raised.value.exit_status == 1 and why in str(raised.value)
    assert list(private_tmp.glob("mlharness-launch-*")) == []


def test_ctrl_c_to_the_launching_process_stops_the_run(tmp_path: Path, private_tmp: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT to this process (the parent) is forwarded to the run's process group; the run stops
    itself (no kill follows), keeps its logs as a failed run and exits 130; the parent's handlers are
    put back."""
    results, db = tmp_path / "results", tmp_path / "db.sqlite"
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    model = hour_long_null(tmp_path / "models")
    req = RunRequest(model=str(model), scenario="SingleStream", overrides=LONG,
                     results_dir=results, timeout=120)
    workfolders: list[str] = []

    def look_then_interrupt() -> None:
        workfolders.extend(p.name for p in private_tmp.iterdir())
        os.kill(os.getpid(), signal.SIGINT)

    sent = sent_signals(monkeypatch)
    when_claimed(results, look_then_interrupt)
    outcome = LocalLauncher(grace=60, db_path=db, output=tmp_path / "out.txt").submit(req)
    assert sent == [signal.SIGINT], "forwarded once, and the run stopped itself: no kill after the grace"
    assert outcome.kind == "error" and outcome.exit_status == 130
    assert outcome.error.startswith("run failed: interrupted by SIGINT (logs kept in ")
    assert outcome.record.status == "failed" and outcome.record.error == "interrupted by SIGINT"
    with ResultStore(db, create=False) as store:
        assert store.get_record(outcome.record.run_id).status == "failed"
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert not list(results.rglob(".staging-*"))
    assert len(workfolders) == 1 and workfolders[0].startswith("mlharness-launch-"), workfolders
    assert list(private_tmp.iterdir()) == [], "the work folder goes with the run"


def test_a_run_past_its_timeout_is_failed_by_its_own_process(tmp_path: Path, private_tmp: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    model = hour_long_null(tmp_path / "models")
    req = RunRequest(model=str(model), scenario="SingleStream", overrides=LONG,
                     results_dir=results, timeout=TIMEOUT)
    sent = sent_signals(monkeypatch)
    outcome = LocalLauncher(grace=60, store=False, output=tmp_path / "out.txt").submit(req)
    assert sent == [], "the run ended itself: the parent never had to kill it"
    assert (outcome.kind, outcome.exit_status) == ("error", 1)
    assert outcome.error.startswith(f"run failed: timed out after {TIMEOUT} s (logs kept in ")
    assert outcome.record.error == f"timed out after {TIMEOUT} s"


def test_a_child_that_cannot_stop_itself_is_killed_after_its_timeout(tmp_path: Path, private_tmp: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """User code holding the GIL in C (here libc's sleep through ctypes.PyDLL, far longer than the
    timeout) lets neither the child's deadline nor its signal watcher run: the parent kills the
    process group, not before the timeout, the grace and 5 s have passed, and the failed run says it
    timed out."""
    results = tmp_path / "results"
    model = null_model_with(tmp_path / "models", preprocess="import ctypes\n\ndef preprocess(sample, ctx):\n"
                                           "    ctypes.PyDLL(None).sleep(120)\n")
    req = RunRequest(model=str(model), scenario="Offline", quick=True, results_dir=results, timeout=TIMEOUT)
    sent = sent_signals(monkeypatch)
    began = time.monotonic()
    outcome = LocalLauncher(grace=0.2, store=False, output=tmp_path / "out.txt").submit(req)
    took = time.monotonic() - began
    assert sent == [signal.SIGKILL], "the parent killed it"
    assert took >= TIMEOUT + 0.2 + 5, f"killed after {took:.1f} s, before the timeout, the grace and 5 s"
    assert (outcome.kind, outcome.exit_status) == ("error", 1)
    assert outcome.error == f"run failed: timed out after {TIMEOUT} s (logs kept in {outcome.record.results_path})"
    assert outcome.record.error == f"timed out after {TIMEOUT} s"


def test_a_child_that_ignores_the_forwarded_signal_is_killed_after_the_grace(tmp_path: Path, private_tmp: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """User code that ignores SIGINT and SIGTERM: the parent forwards Ctrl-C, waits `grace` seconds,
    then kills the process group; the failed run says it was interrupted, exit 130. (Were the kill to
    wait for the run's timeout instead, the run would end itself first, saying it timed out.)"""
    results = tmp_path / "results"
    ignoring = tmp_path / "ignoring"
    model = null_model_with(tmp_path / "models", preprocess="import signal, time\n\ndef preprocess(sample, ctx):\n"
                                           "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                           "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                           f"    open({str(ignoring)!r}, 'w').close()\n"
                                           "    time.sleep(120)\n")
    req = RunRequest(model=str(model), scenario="Offline", quick=True, results_dir=results, timeout=60)

    def interrupt_once_ignored() -> None:
        wait_for(ignoring.exists, "the user code ignoring signals")
        os.kill(os.getpid(), signal.SIGINT)

    sent = sent_signals(monkeypatch)
    threading.Thread(target=interrupt_once_ignored, daemon=True).start()
    outcome = LocalLauncher(grace=0.5, store=False, output=tmp_path / "out.txt").submit(req)
    assert sent == [signal.SIGINT, signal.SIGKILL], "forwarded, then killed after the grace"
    assert (outcome.kind, outcome.exit_status) == ("error", 130)
    assert outcome.error == f"run failed: interrupted by SIGINT (logs kept in {outcome.record.results_path})"
    assert outcome.record.error == "interrupted by SIGINT"


def test_the_child_imports_this_harness_and_keeps_the_callers_path(tmp_path: Path, private_tmp: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's process imports the harness the parent runs (this checkout), with the folder that
    holds a plain `mlharness` folder first on PYTHONPATH (none for an editable install) and the caller's
    entries after it; its stderr goes to `output`."""
    import mlharness

    seen = tmp_path / "seen.json"
    extra = str(tmp_path / "on-the-callers-path")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (extra, os.environ.get("PYTHONPATH")) if p))
    model = null_model_with(tmp_path / "models", preprocess="import json, os, sys\nimport numpy as np\nimport mlharness\n\n"
                                           "def preprocess(sample, ctx):\n"
                                           f"    with open({str(seen)!r}, 'w') as out:\n"
                                           "        json.dump([mlharness.__file__, os.environ['PYTHONPATH']], out)\n"
                                           "    print('stderr of the run', file=sys.stderr)\n"
                                           "    return np.array([sample], dtype=np.float32)\n")
    out = tmp_path / "out.txt"
    req = RunRequest(model=str(model), scenario="Offline", quick=True, results_dir=tmp_path / "results", timeout=60)
    outcome = LocalLauncher(store=False, output=out).submit(req)
    assert outcome.kind == "result", outcome.error
    imported, path = json.loads(seen.read_text())
    root = launcher.package_root()
    # a folder on the child's path holds a plain `mlharness` package, never a checkout's `harness`, `specs`...
    assert root is None or (Path(root) / "mlharness" / "__init__.py").is_file(), root
    assert Path(imported).resolve() == Path(mlharness.__file__).resolve()
    expected = [root, extra] if root else [extra]  # an editable install's finder needs no folder on the path
    assert path.split(os.pathsep)[:len(expected)] == expected
    assert "stderr of the run" in out.read_text()


def test_the_run_process_dies_with_its_parent() -> None:
    """Linux: the child asks for SIGHUP when the launching process dies (prctl PR_SET_PDEATHSIG)."""
    code = ("import ctypes\nfrom mlharness.running import run_child\nrun_child._die_with_parent()\n"
            "sig = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(sig))\nprint(sig.value)\n")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == signal.SIGHUP
    # The parent died before the request took effect (its pid is no longer our parent's): SIGHUP now.
    # The run's child installs its SIGHUP handler first (_watch_signals); the default stands in for it here, not
    # what this process inherited (under nohup SIGHUP is ignored, and the child would live on).
    code = ("import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\nfrom mlharness.running import run_child\n"
            "run_child._PARENT_PID = -1\nrun_child._die_with_parent()\nprint('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGHUP and "alive" not in done.stdout


# ---- the run's process itself ---------------------------------------------------------------------
# The launcher starts it as `python -m mlharness.running.run_child`, where the module is __main__: a
# mutation run would neither see nor switch its code there. These tests start child_main imported.

CHILD = "import sys\nfrom pathlib import Path\nfrom mlharness.running import run_child\nrun_child.child_main(Path(sys.argv[1]))\n"


def start_child(workdir: Path, req: RunRequest | None, tmp: Path) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    if req is not None:
        (workdir / "request.json").write_text(req.to_json())
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TMPDIR=str(tmp),
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(workdir)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def envelope(workdir: Path) -> Outcome:
    return Outcome.from_dict(json.loads((workdir / "outcome.json").read_text()), "outcome.json")


def test_the_run_process_runs_the_request_and_writes_its_outcome(tmp_path: Path, private_tmp: Path) -> None:
    results, workdir = tmp_path / "results", tmp_path / "w"
    child = start_child(workdir, RunRequest(model="null", scenario="Offline", quick=True, results_dir=results,
                                            timeout=60), private_tmp)
    assert child.wait(120) == 0, child.stderr.read()
    outcome = envelope(workdir)
    assert (outcome.kind, outcome.error, outcome.exit_status) == ("result", None, 0)
    assert outcome.record.status == "ok" and Path(outcome.record.results_path).parent.name == "runs"
    start = json.loads((workdir / "started.json").read_text())
    assert start["run_id"] == outcome.record.run_id
    assert Path(start["staging"]).name == f".staging-{outcome.record.run_id}" and not Path(start["staging"]).exists()


def test_the_run_process_turns_errors_into_envelopes(tmp_path: Path, private_tmp: Path) -> None:
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "request.json").write_text(json.dumps({"schema_version": 99, "request": {}}))
    child = start_child(newer, None, private_tmp)
    assert child.wait(60) == 1
    outcome = envelope(newer)
    assert outcome.kind == "error" and outcome.record is None and outcome.traceback_path is None
    assert outcome.error.startswith("run request schema_version 99 is newer than this mlharness reads")

    missing = tmp_path / "missing"
    child = start_child(missing, None, private_tmp)  # no request.json at all: a bug, with its traceback
    assert child.wait(60) == 1
    outcome = envelope(missing)
    assert outcome.error.startswith("internal error: FileNotFoundError: ")
    assert Path(outcome.traceback_path).parent == private_tmp
    assert "FileNotFoundError" in Path(outcome.traceback_path).read_text()


@pytest.mark.parametrize("how, status, why", [
    (signal.SIGTERM, 128 + signal.SIGTERM, "interrupted by SIGTERM"),
    (signal.SIGINT, 128 + signal.SIGINT, "interrupted by SIGINT"),
    (signal.SIGHUP, 1, "the launching process ended"),
    ("timeout", 1, f"timed out after {TIMEOUT} s"),
], ids=["SIGTERM", "SIGINT", "SIGHUP", "timeout"])
def test_the_run_process_stops_itself(tmp_path: Path, private_tmp: Path, how: object, status: int, why: str) -> None:
    """A signal (or the run's timeout) mid-run: the run's process fails the run itself, keeps its
    logs, writes the envelope and exits with the status the CLI will use. SIGHUP means the
    launching process is gone, so the run stores its own record."""
    results, workdir = tmp_path / "results", tmp_path / "w"
    model = hour_long_null(tmp_path / "models")
    req = RunRequest(model=str(model), scenario="SingleStream", overrides=LONG,
                     results_dir=results, timeout=TIMEOUT if how == "timeout" else 600)
    child = start_child(workdir, req, private_tmp)
    try:
        if how != "timeout":
            def running_and_under_way() -> bool:
                assert child.poll() is None, child.stderr.read()
                return under_way(results)

            wait_for(running_and_under_way, "LoadGen's test under way")
            os.kill(child.pid, how)
        # It stops in about a second; its test would last an hour. 120 s is a hang guard.
        assert child.wait(120) == status, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    outcome = envelope(workdir)
    assert outcome.kind == "error" and outcome.exit_status == status
    assert outcome.error == f"run failed: {why} (logs kept in {outcome.record.results_path})"
    assert outcome.record.status == "failed" and outcome.record.error == why
    assert (Path(outcome.record.results_path) / "run.json").is_file()
    stored = (results / "mlharness.sqlite").is_file()
    assert stored is (how == signal.SIGHUP), "only a run whose launcher is gone stores itself"
    if stored:
        with ResultStore(results / "mlharness.sqlite", create=False) as store:
            assert store.get_record(outcome.record.run_id).error == why


def test_without_an_output_file_the_run_writes_to_the_callers_own_descriptors(tmp_path: Path, private_tmp: Path,
                                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """LocalLauncher(output=None), as the CLI runs it: the run's process inherits stdout and stderr, each
    to its own (what user code prints to stderr must not land on stdout)."""
    model = null_model_with(tmp_path / "models", preprocess="import sys\nimport numpy as np\n\ndef preprocess(sample, ctx):\n"
                                           "    if sample == 0:\n"
                                           "        print('from the run: out', flush=True)\n"
                                           "        print('from the run: err', file=sys.stderr, flush=True)\n"
                                           "    return np.array([sample], dtype=np.float32)\n")
    req = RunRequest(model=str(model), scenario="Offline", quick=True, results_dir=tmp_path / "results", timeout=60)
    outcome = LocalLauncher(store=False).submit(req)
    assert (outcome.kind, outcome.exit_status) == ("result", 0)
    captured = capfd.readouterr()
    assert "from the run: out" in captured.out and "from the run: err" not in captured.out
    assert "from the run: err" in captured.err and "from the run: out" not in captured.err


def test_an_unexpected_error_while_waiting_kills_the_run_and_propagates(tmp_path: Path, private_tmp: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the parent's wait loop (here its clock raising once the run is under way) must not leave
    the run's process behind: it is killed (SIGKILL to its group) and the error goes on up."""
    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    calls = {"n": 0}
    real_monotonic = time.monotonic

    def failing_clock() -> float:
        calls["n"] += 1
        if calls["n"] == 2:  # the first call sets the deadline; the second is inside the wait loop
            raise RuntimeError("the clock broke")
        return real_monotonic()

    monkeypatch.setattr(launcher.subprocess, "Popen", Recorded)
    monkeypatch.setattr(launcher.time, "monotonic", failing_clock)
    model = hour_long_null(tmp_path / "models")
    req = RunRequest(model=str(model), scenario="SingleStream", overrides=LONG,
                     results_dir=tmp_path / "results", timeout=120)
    with pytest.raises(RuntimeError, match="the clock broke"):
        LocalLauncher(store=False, output=tmp_path / "out.txt")._run_child(req, tmp_path / "work")
    monkeypatch.undo()
    assert len(started) == 1 and started[0].returncode == -signal.SIGKILL
