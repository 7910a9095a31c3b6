"""RunRequest: everything that decides one run, frozen and validated when built. Its JSON form
(`to_json`/`from_json`) is the only form that crosses a process boundary (see harness.launcher)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.settings import MODES, SCENARIOS

DEFAULT_RESULTS_DIR = Path("results")
# A whole run (all its LoadGen tests) longer than this is stopped and recorded as failed. Full-length
# submission tests take 10 to 20 minutes each on a small machine; --timeout raises it.
DEFAULT_RUN_TIMEOUT = 4 * 3600.0
REQUEST_SCHEMA_VERSION = 1

_PATH_FIELDS = ("user_conf", "results_dir", "audit_config", "specs_root")
_TUPLE_FIELDS = ("presets", "overrides", "profile")


@dataclass(frozen=True)
class RunRequest:
    model: str
    scenario: str
    mode: str = "performance"
    dataset: str | None = None
    backend: str | None = None
    software: str | None = None
    hardware: str = "cpu"
    reference: str | None = None
    quick: bool = False
    presets: tuple[str, ...] = ()
    user_conf: Path | None = None
    results_dir: Path = DEFAULT_RESULTS_DIR
    overrides: tuple[str, ...] = ()
    profile: tuple[str, ...] = ()
    audit_config: Path | None = None
    command: str = ""
    timeout: float = DEFAULT_RUN_TIMEOUT  # seconds for the whole run, in its own process
    specs_root: Path | None = None  # None: $MLHARNESS_SPECS or the shipped specs

    def __post_init__(self) -> None:
        # Lists and strings become tuples and Paths, so a request is immutable and compares by value.
        for name in _TUPLE_FIELDS:
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value or ()))
        for name in _PATH_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if not self.model:
            raise UserError("model: expected a model manifest name or path, got nothing")
        if self.scenario not in SCENARIOS:
            raise UserError(f"--scenario: expected one of {', '.join(SCENARIOS)}, got {self.scenario!r}")
        if self.mode not in MODES:
            raise UserError(f"--mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        try:
            timeout = float(self.timeout)
        except (TypeError, ValueError):
            raise UserError(f"--timeout: expected a number of seconds, got {self.timeout!r}") from None
        if not timeout > 0 or timeout == float("inf"):
            raise UserError(f"--timeout: expected a number of seconds > 0, got {self.timeout!r}")
        object.__setattr__(self, "timeout", timeout)

    def to_json(self) -> str:
        data = asdict(self)
        for name in _PATH_FIELDS:
            data[name] = str(data[name]) if data[name] is not None else None
        for name in _TUPLE_FIELDS:
            data[name] = list(data[name])
        return json.dumps({"schema_version": REQUEST_SCHEMA_VERSION, "request": data}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunRequest":
        envelope = json.loads(text)
        version = envelope.get("schema_version")
        if not isinstance(version, int) or version > REQUEST_SCHEMA_VERSION:
            raise UserError(f"run request schema_version {version!r} is newer than this mlharness reads "
                            f"({REQUEST_SCHEMA_VERSION}); upgrade mlharness")
        known = {f.name for f in fields(cls)}
        data: dict[str, Any] = {k: v for k, v in envelope["request"].items() if k in known}
        return cls(**data)
