"""RunRequest: everything that decides one run, frozen and validated when built. Its JSON form
(`to_json`/`from_json`) is the only form that crosses a process boundary (see mlharness.running.launcher);
its command-line form is mlharness.running.arguments."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from mlharness.errors import UserError
from mlharness.running.settings import MODES, SCENARIOS
from mlharness.specs.endpoint import parse_endpoint

DEFAULT_RESULTS_DIR = Path("results")
# A whole run (all its LoadGen tests) longer than this is stopped and recorded as failed. Full-length
# submission tests take 10 to 20 minutes each on a small machine; --timeout raises it.
DEFAULT_RUN_TIMEOUT = 4 * 3600.0
# Version 2 added `kind` and the layer-benchmark fields (batch, measured_run, variants, brick_time_cap);
# version 3 the environment's settings (handoff, issue_path) and `resolved`; version 4 scenarios_root.
REQUEST_SCHEMA_VERSION = 4
# What a run measures, and so which runner executes it in the run's process (mlharness.running.launcher):
# a LoadGen test, or a layer-level benchmark of the model's bricks (mlharness.bricks).
RUN_KINDS = ("loadgen", "bricks")
BRICK_ESTIMATES = ("only", "measure-missing")

_PATH_FIELDS = ("user_conf", "results_dir", "audit_config", "specs_root", "scenarios_root")
_TUPLE_FIELDS = ("presets", "overrides", "profile", "compliance")


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
    # The user.conf's content, read when the request is resolved for a run (mlharness.running.resolve.
    # resolved_for_run), not when it is built: what crosses to another process or machine is the settings
    # themselves, not a path that may not exist there, and a request kept with a sweep still loads once
    # its user.conf has moved.
    user_conf_text: str | None = None
    results_dir: Path = DEFAULT_RESULTS_DIR
    overrides: tuple[str, ...] = ()
    profile: tuple[str, ...] = ()
    audit_config: Path | None = None
    command: str = ""
    timeout: float = DEFAULT_RUN_TIMEOUT  # seconds for the whole run, in its own process
    specs_root: Path | None = None  # None: $MLHARNESS_SPECS or the shipped specs
    compliance: tuple[str, ...] = ()  # audits (TEST01, TEST04) to run on the run once it is done
    kind: str = "loadgen"  # one of RUN_KINDS
    # kind "bricks": the batch the model is decomposed at, the LoadGen run that measured the model whole
    # (its id, compared with the estimate), whether to measure the lower bound's variants, and the
    # time cap in seconds of one brick's measurement.
    batch: int = 1
    measured_run: str | None = None
    variants: bool = True
    brick_time_cap: float = 2.0
    # None: measure the bricks; "only": compose from the bricks stored for this system, measuring nothing;
    # "measure-missing": the same, measuring only the bricks not stored (`mlharness bricks --estimate-only`).
    brick_estimate: str | None = None
    quiet: bool = False  # no progress display (mlharness.running.progress)
    use_tuned: bool = True  # start from the configuration `mlharness tune` stored for this model and system
    # A server that runs the model (grpc://HOST:PORT, http://HOST:PORT): the LoadGen test runs here and
    # forwards each sample to it (mlharness.sut.network); None runs the model in the run's own process.
    endpoint: str | None = None
    # The environment's settings that decide a run, read from the submitting process's environment when
    # the request is resolved for a run (mlharness.running.resolve.resolved_for_run), so that a run on a
    # cluster node runs as the driver asked, not as the node's environment says: how samples are handed
    # between the stages ($MLHARNESS_HANDOFF: native or python) and LoadGen's issue path for Server
    # ($MLHARNESS_ISSUE: native or python); specs_root takes $MLHARNESS_SPECS the same way. Checked
    # where they are used (mlharness.sut.handoff), as the environment variable always was.
    handoff: str | None = None
    issue_path: str | None = None
    scenarios_root: Path | None = None  # the presets' folder: $MLHARNESS_SCENARIOS, taken in the same way
    # user.conf's text and the environment's settings have been read in (resolved_for_run): wherever the
    # request goes, it runs as it is, reading neither the file nor that process's environment.
    resolved: bool = False

    def __post_init__(self) -> None:
        # Checks values only, reads nothing: a data type stays pure (the file is read by resolved_for_run).
        # Lists and strings become tuples and Paths, so a request is immutable and compares by value.
        for name in _TUPLE_FIELDS:
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value or ()))
        for name in _PATH_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if self.endpoint is not None:
            object.__setattr__(self, "endpoint", parse_endpoint(self.endpoint).url)
        if self.kind not in RUN_KINDS:
            raise UserError(f"run kind: expected one of {', '.join(RUN_KINDS)}, got {self.kind!r}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise UserError(f"--batch: expected a batch size >= 1, got {self.batch!r}")
        try:
            cap = float(self.brick_time_cap)
        except (TypeError, ValueError):
            cap = float("nan")
        if not cap > 0 or cap == float("inf"):
            raise UserError(f"--time-cap: expected a number of seconds > 0, got {self.brick_time_cap!r}")
        object.__setattr__(self, "brick_time_cap", cap)
        if self.brick_estimate not in (None, *BRICK_ESTIMATES):
            raise UserError(f"brick estimate: expected one of {', '.join(BRICK_ESTIMATES)}, got {self.brick_estimate!r}")
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
