"""One run's lifecycle, whatever kind of run it is (LoadGen: mlharness.running.runner; bricks:
mlharness.bricks.runner), in the run's own process (mlharness.running.run_child):

    prepare_host -> new_record (staged under results/<system>/<model>/<folder>/.staging-<run id>/)
    -> run_staged: the guard told, the kind's body (which builds its runtime through `adopt`),
       then the record published into runs/<run id>/, or the failed run kept in failed-<run id>/.

A kind of run supplies its record's own fields and its body; staging, the runtime's closing, memory
use and fail/publish are written once, here, so every kind of run ends the same way."""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import RunFailed, UserError
from mlharness.records import results
from mlharness.records.run_record import RunRecord, new_run_id, utc_now
from mlharness.resources import usage
from mlharness.running import system as system_mod


class Guard(Protocol):
    """What a run reports to the guard that can stop it (mlharness.running.run_child.RunGuard): the
    lifecycle its start and end, a body where user code begins and which SUT serves it."""
    aborted: BaseException | None

    def started(self, record: RunRecord, where: Any) -> None: ...

    def watch(self, timeout: float | None, what: str) -> Callable[[], None]: ...

    def attach_sut(self, sut: Any) -> None: ...

    def finalizing(self) -> bool: ...


class Backend(Protocol):
    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Runtime(Protocol):
    """What the lifecycle reads of a built runtime (mlharness.sut.runtime and its network and LLM kin)."""
    backend: Backend
    artifacts: dict[str, Any]
    cold_start: dict[str, Any]


@dataclass(frozen=True)
class Host:
    """The system the run runs on, as its record states it."""
    detected: dict[str, Any]  # mlharness.running.system.detect_system
    name: str  # the system's name in the results tree
    installed: dict[str, Any]  # the software manifest's packages, as found installed


def prepare_host(software: Any, hardware: Any, check_software: bool = True) -> Host:
    """The software manifest checked (skipped where the framework runs elsewhere, on a server) and its
    environment set, then the system detected: after both, so detection sees what the run will."""
    installed = system_mod.check_software(software) if check_software else {}
    for var, value in software.environment.items():
        os.environ.setdefault(var, value)
    detected = system_mod.detect_system()
    return Host(detected=detected, name=system_mod.system_name(detected, hardware.device), installed=installed)


def new_place(results_dir: str | Path, host: Host, model_name: str, folder: str) -> results.ScenarioDir:
    """Where a new run is staged and then published: results/<system>/<model>/<folder>/, under a new run id."""
    return results.scenario_dir(Path(results_dir), host.name, model_name, folder, new_run_id())


def new_record(where: results.ScenarioDir, host: Host, model: Any, dataset: Any, backend_name: str, software: Any,
               hardware: Any, settings: Any, **kind_fields: Any) -> RunRecord:
    """The run's record as it starts: what runs, where, with which settings; `kind_fields` are the
    kind's own (command, scenario, mode, kind, reference)."""
    return RunRecord(
        run_id=where.run_id, model=model.identity(), dataset=dataset.identity(), backend=backend_name,
        system_name=host.name, system=host.detected,
        software={"manifest": software.identity(), "checked": host.installed,
                  "versions": system_mod.software_versions()},
        hardware=hardware.identity() | {"device": hardware.device, "cpu_affinity": list(hardware.cpu_affinity or ())},
        settings=settings.as_record(), results_path=str(where.staging), **kind_fields)


class StagedRun:
    """A run between its start and its end, as its body sees it: the record so far, the staged folder to
    write into, the guard to report to, and `adopt` for the runtime it builds. A record is not changed
    once made: each step the body takes makes the next one (`update`), and the lifecycle publishes the
    last."""

    def __init__(self, record: RunRecord, where: results.ScenarioDir, guard: Guard):
        self.record, self.where, self.guard = record, where, guard
        self.runtime: Runtime | None = None

    def update(self, **changes: Any) -> RunRecord:
        """The record with these fields replaced becomes the run's record (the old one is left as it was)."""
        self.record = replace(self.record, **changes)
        return self.record

    def adopt(self, runtime: Runtime) -> Runtime:
        """The body's runtime: its backend, sources and cold start go into the record, and the
        lifecycle closes it however the body ends."""
        self.runtime = runtime
        self.update(backend_info=runtime.backend.describe(), artifacts=runtime.artifacts,
                    cold_start=dict(runtime.cold_start))
        return runtime


def run_staged(record: RunRecord, where: results.ScenarioDir, guard: Guard, hardware: Any,
               body: Callable[[StagedRun], None]) -> RunRecord:
    """Run `body` for the staged run; publish it when the body returns (the published record is returned),
    or keep it as failed and raise RunFailed when it raises (anything: a signal's abort arrives as an
    exception too)."""
    guard.started(record, where)
    run = StagedRun(record, where, guard)
    try:
        body(run)
        run.update(status="ok")
    except BaseException as exc:
        fail_run(with_usage(run.record, hardware), where, exc, guard)
    finally:
        if run.runtime is not None:
            run.runtime.backend.close()
    return publish(with_usage(run.record, hardware), where, guard)


def publish(record: RunRecord, where: results.ScenarioDir, guard: Guard) -> RunRecord:
    """The finished run's record written and its staged folder moved into runs/ (unless an abort,
    already writing the failed run, will end this process first); returns the record as written."""
    if not guard.finalizing():
        wait_for_abort()
    record = replace(record, finished_at=utc_now(), results_path=str(where.run_dir))
    write_json(where.stage() / "run.json", record.to_dict())
    (where.staging / "owner.json").unlink(missing_ok=True)
    where.publish()
    return record


def with_usage(record: RunRecord, hardware: Any) -> RunRecord:
    """The record with the peak memory of the run's process (and of the device where one was used)."""
    return replace(record, cold_start=record.cold_start | usage(hardware.device))


def fail_run(record: RunRecord, where: results.ScenarioDir, exc: BaseException, guard: Guard) -> None:
    """Keep the failed run in failed-<run id>/ with its record (and the traceback of anything that is
    not a user's mistake) and raise RunFailed with that record; unless an abort is already writing it."""
    if not guard.finalizing():
        wait_for_abort()
    failure = guard.aborted or exc
    error = str(failure) if isinstance(failure, UserError) else f"{type(failure).__name__}: {failure}"
    finished_at = utc_now()
    (where.staging / "owner.json").unlink(missing_ok=True)
    failed_dir = where.keep_failed()
    cause = _bug_behind(failure)
    traceback_path = None
    if cause is not None:
        traceback_path = failed_dir / "traceback.txt"
        write_text(traceback_path, "".join(traceback.format_exception(cause)))
    record = replace(record, status="failed", error=error, finished_at=finished_at, results_path=str(failed_dir),
                     error_traceback=str(traceback_path) if traceback_path is not None else record.error_traceback)
    write_json(failed_dir / "run.json", record.to_dict())
    message = f"run failed: {record.error} (logs kept in {failed_dir})"
    if traceback_path is not None:
        message += f"; traceback in {traceback_path}"
    raise RunFailed(message, record, getattr(failure, "exit_status", 1)) from exc


def _bug_behind(failure: BaseException) -> BaseException | None:
    """The exception whose traceback is worth keeping: anything but a user's mistake, including what
    user code or a backend raised behind a SampleError."""
    if not isinstance(failure, UserError):
        return failure
    cause = getattr(failure, "cause", None) or failure.__cause__
    return cause if cause is not None and not isinstance(cause, UserError) else None


def wait_for_abort() -> None:
    """The guard's abort is writing the failed run and will end this process; wait for it."""
    while True:
        time.sleep(60)
