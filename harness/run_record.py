"""The record of one run (run.json and the results database row), with a schema version."""
from __future__ import annotations

import datetime as _dt
import json
import secrets
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from harness.errors import UserError

# MIGRATIONS[n] takes a version n + 1 record (a run.json dict) to version n + 2, as the results
# database migrates (harness.result_store); version 1 is the first, so there is none yet. Older
# records are migrated forward when read, newer ones are refused rather than guessed at.
MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = []
RUN_SCHEMA_VERSION = 1 + len(MIGRATIONS)


def new_run_id() -> str:
    # Microseconds: ids sort in start order even for runs started within one second.
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunRecord:
    run_id: str
    command: str
    model: dict[str, Any]
    dataset: dict[str, Any]
    backend: str
    scenario: str
    mode: str
    schema_version: int = RUN_SCHEMA_VERSION
    status: str = "running"  # running -> ok | failed
    error: str | None = None
    error_traceback: str | None = None  # where the traceback of a failure that is not a user's mistake was kept
    started_at: str = field(default_factory=utc_now)
    finished_at: str | None = None
    system_name: str = ""
    system: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    backend_info: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)  # every resolved source file and its sha256
    # Cold start and resources: artifact resolution and model load seconds, first inference, the
    # warm-up before the timed test, peak memory (see README: run.json).
    cold_start: dict[str, Any] = field(default_factory=dict)
    performance: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    loadgen: dict[str, Any] = field(default_factory=dict)  # errors/warnings LoadGen logged, per mode
    profile: dict[str, Any] | None = None
    compliance: dict[str, Any] | None = None
    results_path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json_dict(cls, data: Any, where: str) -> "RunRecord":
        """A record read from JSON (`where` names its file), checked and migrated by migrate_record."""
        return cls.from_dict(migrate_record(data, where))

    @classmethod
    def load(cls, path: Path | str) -> "RunRecord":
        """A run.json file; unreadable, truncated or newer-schema files are one-line UserErrors."""
        return cls.from_dict(read_record_file(path))


_REQUIRED = tuple(f.name for f in fields(RunRecord) if f.default is MISSING and f.default_factory is MISSING)


def migrate_record(data: Any, where: str) -> dict[str, Any]:
    """A run record dict brought to RUN_SCHEMA_VERSION: a newer schema is refused, an older one
    migrated forward, a missing field refused, each in one line naming `where`. Keys this version
    does not know are kept, so a reader that writes the record back loses nothing."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a run record (a JSON object), got {type(data).__name__}")
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UserError(f"{where}: schema_version: expected a run record's version (an integer >= 1), "
                        f"got {version!r}")
    if version > RUN_SCHEMA_VERSION:
        raise UserError(f"{where}: schema_version {version} is newer than this mlharness reads "
                        f"({RUN_SCHEMA_VERSION}); upgrade mlharness")
    while version < RUN_SCHEMA_VERSION:
        data = MIGRATIONS[version - 1](dict(data))
        version += 1
        data["schema_version"] = version
    for name in _REQUIRED:
        if name not in data:
            raise UserError(f"{where}: {name}: missing (every run record has one)")
    if not isinstance(data["run_id"], str):
        raise UserError(f"{where}: run_id: expected a run id string, got {data['run_id']!r}")
    return data


def read_record_file(path: Path | str) -> dict[str, Any]:
    """A run.json file as a dict, checked and migrated (migrate_record)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read run record: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg} "
                        f"(a truncated or damaged run record)") from None
    return migrate_record(data, str(path))
