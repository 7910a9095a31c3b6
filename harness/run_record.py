"""The record of one run (run.json and the results database row), with a schema version."""
from __future__ import annotations

import datetime as _dt
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

RUN_SCHEMA_VERSION = 1


def new_run_id() -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
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
