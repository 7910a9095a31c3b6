"""What a run comes back as, from whichever process or machine ran it: the Outcome envelope (a result or
an error, a schema version, the RunRecord, the error and where its traceback was written), and the
Launcher protocol that returns one for a RunRequest."""
from __future__ import annotations

import signal
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlharness.atomic_io import write_text
from mlharness.errors import RunFailed, UserError
from mlharness.records.run_record import RunRecord, new_run_id
from mlharness.running.request import RunRequest

OUTCOME_SCHEMA_VERSION = 1


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


def error_outcome(exc: BaseException) -> Outcome:
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

