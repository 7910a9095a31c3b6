"""The run lifecycle's failure path (harness/running/lifecycle.py, part of the launcher module in
tools/mutation/modules.toml), as mutation testing found it untested by that module's selection:
fail_run keeps the failed run in failed-<run id>/ with its record (status, error, finish time,
traceback of a bug, not of a user's mistake), without the staging folder's owner file, and raises
RunFailed with that record and the failure's exit status. In process, with the real guard (mlharness.running.run_child.RunGuard). docs/notes/mutation-2026-11-27.md names the mutants."""
from __future__ import annotations

import json
import os
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest

from mlharness.errors import RunFailed, UserError
from mlharness.records.results import scenario_dir
from mlharness.records.run_record import RunRecord
from mlharness.running import lifecycle
from mlharness.running.run_child import RunGuard


def started() -> RunRecord:
    return RunRecord(run_id="r1", command="mlharness run null", model={"name": "null"}, dataset={},
                     backend="null", scenario="Offline", mode="performance", error_traceback="before")


def staged(folder: Path, owner: bool = True):
    """A run staged under `folder` with a log in it, and its owner file unless `owner` is false."""
    where = scenario_dir(folder, "sys", "null", "Offline", "r1")
    where.staging.mkdir(parents=True)
    (where.staging / "mlperf_log_summary.txt").write_text("kept")
    if owner:
        (where.staging / "owner.json").write_text("{}")
    return where


def fail(tmp_path: Path, exc: BaseException, aborted: BaseException | None = None,
         owner: bool = True) -> tuple[RunFailed, Path]:
    where = staged(tmp_path, owner)
    guard = RunGuard(None)  # asked first from this thread: this thread writes the failed run
    guard.aborted = aborted
    with pytest.raises(RunFailed) as info:
        lifecycle.fail_run(started(), where, exc, guard)
    return info.value, where.root / "failed-r1"


def test_a_users_mistake_is_kept_without_a_traceback(tmp_path: Path) -> None:
    failed, folder = fail(tmp_path, UserError("bad setting"))
    assert sorted(p.name for p in folder.iterdir()) == ["mlperf_log_summary.txt", "run.json"]  # owner.json gone
    stored = json.loads((folder / "run.json").read_text())
    assert (stored["status"], stored["error"], stored["results_path"]) == ("failed", "bad setting", str(folder))
    assert stored["finished_at"] and stored["finished_at"] == failed.record.finished_at
    assert stored["error_traceback"] == "before"  # nothing new to point at
    assert failed.record.status == "failed" and failed.record.error == "bad setting"
    assert (str(failed), failed.exit_status) == (f"run failed: bad setting (logs kept in {folder})", 1)


def test_a_bug_is_kept_with_its_traceback(tmp_path: Path) -> None:
    try:
        raise ValueError("boom")
    except ValueError as raised:
        bug = raised
    failed, folder = fail(tmp_path, bug, owner=False)  # no owner file to remove: no error either
    trace = folder / "traceback.txt"
    assert trace.read_text() == "".join(traceback.format_exception(bug))
    assert json.loads((folder / "run.json").read_text())["error_traceback"] == str(trace)
    assert failed.record.error == "ValueError: boom" and failed.record.error_traceback == str(trace)
    assert str(failed) == f"run failed: ValueError: boom (logs kept in {folder}); traceback in {trace}"


@pytest.mark.parametrize("how", ["cause", "__cause__"])
def test_a_bug_behind_a_users_error_is_kept_with_its_traceback(tmp_path: Path, how: str) -> None:
    error = UserError("sample 3: the loader failed")
    setattr(error, how, KeyError("pixels"))
    failed, folder = fail(tmp_path, error)
    assert failed.record.error == "sample 3: the loader failed"
    assert "KeyError: 'pixels'" in (folder / "traceback.txt").read_text()


def test_a_users_error_behind_a_users_error_has_no_traceback(tmp_path: Path) -> None:
    error = UserError("outer")
    error.__cause__ = UserError("inner")
    failed, folder = fail(tmp_path, error)
    assert not (folder / "traceback.txt").exists() and failed.record.error_traceback == "before"


def test_the_guards_abort_is_the_failure_and_gives_the_exit_status(tmp_path: Path) -> None:
    stop = UserError("stopped by SIGTERM")
    stop.exit_status = 143  # type: ignore[attr-defined]
    failed, _ = fail(tmp_path, KeyboardInterrupt(), aborted=stop)
    assert (failed.record.error, failed.exit_status) == ("stopped by SIGTERM", 143)


def test_a_failure_while_the_guard_is_not_finalizing_waits_for_its_abort(tmp_path: Path) -> None:
    """The guard's abort writes the failed run and ends the process: fail_run leaves it to that and waits
    (here a daemon thread left waiting; the test process ends it)."""
    where = scenario_dir(tmp_path, "sys", "null", "Offline", "r1")
    where.staging.mkdir(parents=True)
    guard = RunGuard(None)
    claim = threading.Thread(target=guard.finalizing)  # the abort's thread claimed the run's end first
    claim.start()
    claim.join()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            lifecycle.fail_run(started(), where, UserError("x"), guard)
        except BaseException as exc:  # noqa: BLE001 - what the wait let through
            errors.append(exc)

    waiter = threading.Thread(target=body, daemon=True)
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive() and errors == [] and not (where.root / "failed-r1").exists()


def test_a_staging_folder_whose_owner_is_another_live_process_is_not_abandoned(tmp_path: Path) -> None:
    import subprocess
    import sys

    import psutil

    from mlharness.running.run_folders import owner_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "owner.json").write_text(json.dumps(
            {"pid": child.pid, "create_time": psutil.Process(child.pid).create_time()}))
        assert owner_alive(tmp_path)
    finally:
        child.kill()
        child.wait()
    assert not owner_alive(tmp_path)


def test_the_exit_waiter_falls_back_to_popen_where_pidfd_open_fails() -> None:
    """pidfd_open fails for a child already reaped (ProcessLookupError, an OSError, as it does on a kernel
    without it): the waiter keeps no descriptor and asks Popen, which has the status. The launcher's
    mutation run at 24f27bb found the fallback untested (_ExitWaiter.__init__: fd "" instead of None)."""
    import subprocess
    import sys

    from mlharness.running.launcher import _ExitWaiter

    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    assert child.wait(120) == 4
    waiter = _ExitWaiter(child)
    assert waiter.fd is None
    assert waiter(0.0) == 4
    waiter.close()
    waiter.close()  # closing twice is harmless


def test_a_finished_run_is_published_with_its_finish_time_and_without_its_owner_file(tmp_path: Path) -> None:
    """lifecycle publish 4, 7 (no finished_at), 17, 19 to 21 (owner.json left in, or an error without one)."""
    for owner in (True, False):
        where = staged(tmp_path / str(owner), owner)
        guard = RunGuard(None)
        assert guard.finalizing()  # asked first from this thread: this thread publishes
        record = lifecycle.publish(started(), where, guard)
        assert sorted(p.name for p in where.run_dir.iterdir()) == ["mlperf_log_summary.txt", "run.json"]
        stored = json.loads((where.run_dir / "run.json").read_text())
        assert stored["finished_at"] and stored["finished_at"] == record.finished_at >= "2026"
        assert stored["results_path"] == record.results_path == str(where.run_dir) and not where.staging.exists()


def test_a_runs_record_gets_its_peak_memory_beside_its_cold_start() -> None:
    """lifecycle with_usage 2, 4: the process's peak memory joins the cold-start figures already there."""
    from types import SimpleNamespace

    record = lifecycle.with_usage(RunRecord.from_dict({**started().to_dict(), "cold_start": {"load_seconds": 1.5}}),
                                  SimpleNamespace(device="cpu"))
    assert record.cold_start["load_seconds"] == 1.5 and record.cold_start["device_memory"] is None
    assert isinstance(record.cold_start["peak_rss_bytes"], int) and record.cold_start["peak_rss_bytes"] > 0


def test_the_host_is_the_checked_software_its_environment_and_the_system_on_its_device(monkeypatch) -> None:
    """lifecycle prepare_host 1 to 20: the software manifest's packages are checked (unless told
    not to: the framework runs on a server), its environment set where the caller has not set it, and
    the system named for the hardware's device."""
    from importlib.metadata import version

    from mlharness.running import system
    from mlharness.specs.index import default_index

    index = default_index()
    software = index.find("software", "onnxruntime")
    software = software.model_copy(update={"environment": {"MLHARNESS_TEST_SET": "manifest",
                                                           "MLHARNESS_TEST_KEPT": "manifest"}})
    monkeypatch.setenv("MLHARNESS_TEST_SET", "")  # recorded as absent before the test, so it is removed after
    monkeypatch.delenv("MLHARNESS_TEST_SET")
    monkeypatch.setenv("MLHARNESS_TEST_KEPT", "caller")
    gpu = index.find("hardware", "cpu").model_copy(update={"device": "cuda:0"})
    host = lifecycle.prepare_host(software, gpu)
    assert host.installed["onnxruntime"] == version("onnxruntime") and set(host.installed) == set(software.packages)
    assert (os.environ["MLHARNESS_TEST_SET"], os.environ["MLHARNESS_TEST_KEPT"]) == ("manifest", "caller")
    assert host.detected == system.detect_system() and host.name == system.system_name(host.detected, "cuda:0")
    assert host.name.endswith("_cuda0")
    assert lifecycle.prepare_host(software, gpu, check_software=False).installed == {}


def test_a_new_runs_record_says_what_runs_where_and_with_which_settings(tmp_path: Path) -> None:
    """lifecycle new_record 2 to 35: the record a run starts with, from the manifests the runner resolves."""
    from mlharness.running.request import RunRequest
    from mlharness.running.resolve import prepare_settings, resolve_manifests
    from mlharness.running.system import software_versions

    request = RunRequest(model="null", scenario="Offline", results_dir=tmp_path)
    model, backend_name, dataset, hardware, software, _ = resolve_manifests(request)
    settings = prepare_settings(request, model)
    host = lifecycle.prepare_host(software, hardware)
    where = lifecycle.new_place(tmp_path, host, model.name, "Offline")
    record = lifecycle.new_record(where, host, model, dataset, backend_name, software, hardware, settings,
                                  command="mlharness run null", scenario="Offline", mode="performance")
    assert (record.run_id, record.command, record.scenario, record.mode) == (where.run_id, "mlharness run null",
                                                                            "Offline", "performance")
    assert (record.model, record.dataset, record.backend) == (model.identity(), dataset.identity(), backend_name)
    assert (record.system_name, record.system) == (host.name, host.detected) and host.name
    assert record.software == {"manifest": software.identity(), "checked": host.installed, "versions": software_versions()}
    assert record.hardware == hardware.identity() | {"device": "cpu", "cpu_affinity": list(hardware.cpu_affinity or ())}
    assert record.settings == settings.as_record() and record.settings["scenario"] == "Offline"
    assert record.results_path == str(where.staging) and where.staging.parent == tmp_path / host.name / "null" / "Offline"


class _StandInBackend:
    """The backend of a body's runtime, as the lifecycle sees it: described into the record, closed once."""

    def __init__(self) -> None:
        self.closed = 0

    def describe(self) -> dict:
        return {"name": "stand-in"}

    def close(self) -> None:
        self.closed += 1


def test_a_staged_run_adopts_its_runtime_into_the_record_and_closes_it_however_the_body_ends(tmp_path: Path) -> None:
    """lifecycle StagedRun.__init__ 2, adopt 1, 2: the adopted runtime's backend, sources and cold start
    are in the record, published or failed, and its backend is closed once; a body that fails before it
    adopts one fails with its own error (nothing to close)."""
    from types import SimpleNamespace

    cpu = SimpleNamespace(device="cpu")
    for fails in (False, True):
        where = scenario_dir(tmp_path / str(fails), "sys", "null", "Offline", "r1")
        backend = _StandInBackend()
        runtime = SimpleNamespace(backend=backend, artifacts={"model.weights": {"path": "w"}}, cold_start={"load_seconds": 0.5})

        def body(run: lifecycle.StagedRun) -> None:
            assert run.adopt(runtime) is runtime and run.runtime is runtime
            if fails:
                raise UserError("bad setting")

        if fails:
            with pytest.raises(RunFailed) as info:
                lifecycle.run_staged(started(), where, RunGuard(None), cpu, body)
            record = info.value.record
        else:
            record = lifecycle.run_staged(started(), where, RunGuard(None), cpu, body)
        assert backend.closed == 1 and record.status == ("failed" if fails else "ok")
        assert (record.backend_info, record.artifacts) == ({"name": "stand-in"}, {"model.weights": {"path": "w"}})
        assert record.cold_start["load_seconds"] == 0.5 and record.cold_start["peak_rss_bytes"] > 0

    def early(run: lifecycle.StagedRun) -> None:
        raise UserError("no model")

    with pytest.raises(RunFailed) as info:
        lifecycle.run_staged(started(), scenario_dir(tmp_path / "early", "sys", "null", "Offline", "r1"), RunGuard(None),
                             cpu, early)
    assert str(info.value).startswith("run failed: no model (logs kept in ")
