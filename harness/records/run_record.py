"""The record of one run (run.json and the results database row), with a schema version."""
from __future__ import annotations

import datetime as _dt
import json
import secrets
import types
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Union, get_args, get_origin, get_type_hints

from mlharness.errors import UserError
from mlharness.records import record_metrics
from mlharness.records.bricks_payload import BricksResult, BricksSummary
from mlharness.records.migrations import MIGRATIONS, RUN_SCHEMA_VERSION
from mlharness.records.payloads import (
    AccuracyResult,
    ColdStart,
    LoadGenLog,
    ManifestRef,
    Performance,
)

# What a record measured. A LoadGen test (every run so far) has a scenario, LoadGen settings and a
# LoadGen summary; later kinds (layer benchmarks, LLM token runs) will not, so a reader that needs
# LoadGen's fields checks `is_loadgen` and skips, with a reason, a record of another kind.
LOADGEN = "loadgen"
BRICKS = "bricks"  # a layer-level benchmark (mlharness.bricks): `bricks` holds its figures


def _key(part: Any, key: str) -> Any:
    """One key of a record's dict field (settings, software, hardware), None when the field is null or
    not a mapping: the one place the record's own accessors read its dicts."""
    return part.get(key) if isinstance(part, Mapping) else None


def new_run_id() -> str:
    # Microseconds: ids sort in start order even for runs started within one second.
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)  # frozen once made: a writer makes a new record (dataclasses.replace)
class RunRecord:
    run_id: str
    command: str
    model: dict[str, Any]
    dataset: dict[str, Any]
    backend: str
    scenario: str
    mode: str
    schema_version: int = RUN_SCHEMA_VERSION
    kind: str = LOADGEN  # what the record measured (LOADGEN); readers of LoadGen fields skip other kinds
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
    bricks: dict[str, Any] | None = None  # kind BRICKS: estimate, lower bound, measured, every brick
    results_path: str = ""
    # Keys this version does not know (written by a newer mlharness, or added by hand), kept so a
    # record read and written back loses nothing: to_dict puts them back beside the known fields.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as run.json holds it: every field, then the unknown keys it was read with."""
        data = asdict(self)
        unknown = data.pop("extra")
        # A known field wins over an unknown key of the same name (extra set by hand can hold one).
        return data | {k: v for k, v in unknown.items() if k not in data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunRecord":
        """A record from its dict (to_dict's shape); keys this version does not know go to `extra`."""
        known = _FIELDS - {"extra"}  # "extra" is never a key of run.json: a key of that name is unknown
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})

    # ---- typed accessors: what readers need, without digging in the nested dicts --------------
    # The payload fields above are the dicts run.json holds (what is written); readers take these typed
    # views of them (mlharness.records.payloads), built when asked, so a record's file keeps its shape.

    @property
    def perf(self) -> Performance | None:
        """LoadGen's performance summary, None when the run has none (an accuracy run, a layer benchmark,
        a run that failed before LoadGen wrote one)."""
        return Performance.from_dict(self.performance) if self.performance else None

    @property
    def accuracy_result(self) -> AccuracyResult | None:
        """The accuracy test's score, None when accuracy was not measured."""
        return AccuracyResult.from_dict(self.accuracy) if self.accuracy else None

    @property
    def cold(self) -> ColdStart | None:
        """Cold start and memory, None for a record from before they were measured."""
        return ColdStart.from_dict(self.cold_start) if self.cold_start else None

    @property
    def bricks_result(self) -> BricksResult | None:
        """A layer benchmark's figures (kind BRICKS), None for other records."""
        return BricksResult.from_dict(self.bricks) if self.bricks else None

    @property
    def bricks_summary(self) -> BricksSummary | None:
        """A layer benchmark's composed figures, None for other records (and one that never composed)."""
        result = self.bricks_result
        return result.summary if result else None

    @property
    def loadgen_logs(self) -> dict[str, LoadGenLog]:
        """Each LoadGen test the run ran (accuracy, performance), in the order run."""
        return {str(mode): LoadGenLog.from_dict(logged) for mode, logged in (self.loadgen or {}).items()
                if isinstance(logged, Mapping)}

    @property
    def is_ok(self) -> bool:
        """The run finished (LoadGen may still have judged it INVALID)."""
        return self.status == "ok"

    @property
    def is_loadgen(self) -> bool:
        """A LoadGen test: settings, performance and accuracy have LoadGen's shape."""
        return self.kind == LOADGEN

    @property
    def model_ref(self) -> ManifestRef:
        """The model manifest's identity (name, version, sha256, path)."""
        return ManifestRef.from_dict(self.model)

    @property
    def dataset_ref(self) -> ManifestRef:
        return ManifestRef.from_dict(self.dataset)

    @property
    def hardware_ref(self) -> ManifestRef:
        return ManifestRef.from_dict(self.hardware)

    @property
    def software_ref(self) -> ManifestRef:
        """The software manifest's identity (`software.manifest`)."""
        return ManifestRef.from_dict(_key(self.software, "manifest"))

    @property
    def model_name(self) -> str | None:
        """The model manifest's name."""
        return self.model_ref.name

    @property
    def device(self) -> str | None:
        """The device the run used (cpu, cuda:0), as the hardware manifest named it."""
        device = _key(self.hardware, "device")
        return device if isinstance(device, str) else None

    @property
    def harness_settings(self) -> dict[str, Any]:
        """The harness keys the run used (max_batch_size, workers, ...)."""
        return self._settings_part("harness")

    @property
    def loadgen_settings(self) -> dict[str, Any]:
        """The LoadGen keys written to the run's user.conf."""
        return self._settings_part("loadgen")

    def _settings_part(self, name: str) -> dict[str, Any]:
        part = _key(self.settings, name)
        return dict(part) if isinstance(part, Mapping) else {}

    def harness_setting(self, key: str, default: Any = None) -> Any:
        """One harness key's value, `default` when the run did not record it."""
        return self.harness_settings.get(key, default)

    def loadgen_setting(self, key: str, default: Any = None) -> Any:
        """One LoadGen key's value, `default` when the run's user.conf did not set it."""
        return self.loadgen_settings.get(key, default)

    def setting_origin(self, key: str) -> str | None:
        """The settings layer that set a key (model, measured, a preset, user.conf, --set), None if unknown."""
        return self.setting_origins.get(key)

    @property
    def setting_origins(self) -> dict[str, str]:
        """Every key's settings layer."""
        return self._settings_part("origin")

    @property
    def setting_layers(self) -> list[str]:
        """The settings layers the run applied, lowest first (model, presets, user.conf, --set, ...)."""
        layers = _key(self.settings, "layers")
        return [str(layer) for layer in layers] if isinstance(layers, list) else []

    @property
    def conf_model(self) -> str | None:
        """The benchmark name the run's user.conf lines start with (MLPerf's model name)."""
        name = _key(self.settings, "conf_model")
        return name if isinstance(name, str) and name else None

    @property
    def batch_size(self) -> int | None:
        """The largest batch the workers formed (max_batch_size)."""
        value = self.harness_setting("max_batch_size")
        return int(value) if value is not None else None

    @property
    def threads(self) -> int | None:
        """intra_op_threads as set, else as the backend reported it."""
        value = self.harness_setting("intra_op_threads", _key(self.backend_info, "intra_op_threads"))
        return int(value) if value is not None else None

    @property
    def loadgen_result(self) -> str | None:
        """LoadGen's verdict string (VALID, INVALID), None without a performance summary."""
        perf = self.perf
        return perf.result if perf else None

    @property
    def valid(self) -> bool | None:
        """LoadGen's VALID/INVALID as a bool, None without a performance summary."""
        perf = self.perf
        return perf.valid if perf else None

    @property
    def accuracy_values(self) -> dict[str, float]:
        """The accuracy metric's values (top1, ...), empty when accuracy was not measured."""
        result = self.accuracy_result
        return dict(result.values) if result else {}

    @property
    def accuracy_verdict(self) -> str | None:
        """PASS/FAIL against the reference log, None without one."""
        result = self.accuracy_result
        return result.verdict if result else None

    @property
    def software_versions(self) -> dict[str, str]:
        """Installed versions of the packages that matter (frameworks, LoadGen)."""
        return self._software_part("versions")

    @property
    def software_checked(self) -> dict[str, str]:
        """The software manifest's packages as found installed when the run started (empty against a server)."""
        return self._software_part("checked")

    def _software_part(self, name: str) -> dict[str, Any]:
        part = _key(self.software, name)
        return dict(part) if isinstance(part, Mapping) else {}

    @property
    def system_description(self) -> dict[str, Any]:
        """The detected system (CPU model, cores, GPUs, ...)."""
        return dict(self.system or {})

    def manifest_refs(self) -> list[tuple[str, ManifestRef]]:
        """(specs folder, identity) of every manifest the run named: model, dataset, hardware, software, reference."""
        refs = [("models", self.model), ("datasets", self.dataset), ("hardware", self.hardware),
                ("software", _key(self.software, "manifest")), ("references", self.reference)]
        return [(kind, ManifestRef.from_dict(ref)) for kind, ref in refs if ref]

    def figures(self) -> dict[str, float]:
        """Every named numeric figure (mlharness.records.record_metrics.flatten)."""
        return record_metrics.flatten(self)

    def headline(self) -> tuple[str, float | None]:
        """(figure name, value) of the scenario's headline metric (mlharness.records.record_metrics.headline)."""
        return record_metrics.headline(self)

    @classmethod
    def from_json_dict(cls, data: Any, where: str) -> "RunRecord":
        """A record read from JSON (`where` names its file), checked and migrated by migrate_record."""
        return cls.from_dict(migrate_record(data, where))

    @classmethod
    def load(cls, path: Path | str) -> "RunRecord":
        """A run.json file; unreadable, truncated or newer-schema files are one-line UserErrors."""
        return cls.from_dict(read_record_file(path))


_FIELDS = frozenset(f.name for f in fields(RunRecord))
_REQUIRED = tuple(f.name for f in fields(RunRecord) if f.default is MISSING and f.default_factory is MISSING)


def _kind(hint: Any) -> type:
    """A field's JSON type (dict, str or int), `X | None` read as X."""
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if get_origin(hint) in (Union, types.UnionType) else hint
    return get_origin(base) or base


# What each field of a record holds, from RunRecord's own annotations. Null is a part the run never
# reached (readers take it as empty), but a `settings` that is a string would be stored and then break
# every reader, so a value of another type is refused where the record is read.
_KINDS = {name: _kind(hint) for name, hint in get_type_hints(RunRecord).items() if name != "extra"}
_WORDS = {dict: "a mapping (a JSON object)", str: "a string", int: "an integer"}
# Mappings inside the top-level ones that readers walk (settings layers, accuracy values, figures).
_NESTED_MAPPINGS = (("settings", "harness"), ("settings", "loadgen"), ("settings", "origin"), ("accuracy", "values"),
                    ("cold_start", "device_memory"), ("bricks", "summary"), ("software", "versions"))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_shapes(data: dict[str, Any], where: str) -> None:
    """Each known field holds its type or null, in one line naming the field otherwise."""
    for name, kind in _KINDS.items():
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise UserError(f"{where}: {name}: expected {_WORDS[kind]}, got {_short(value)}")
    for outer, inner in _NESTED_MAPPINGS:
        value = _key(data.get(outer), inner)
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{where}: {outer}.{inner}: expected {_WORDS[dict]}, got {_short(value)}")


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
    if not isinstance(data.get("kind"), str) or not data["kind"]:
        raise UserError(f"{where}: kind: expected what the record measured (e.g. {LOADGEN!r}), "
                        f"got {data.get('kind')!r}")
    _check_shapes(data, where)
    return data


def read_saved_record(path: Path | str) -> RunRecord | None:
    """A JSON file that may hold a run record (a saved `results show --json`): the record, checked and
    migrated, or None when the file is not JSON or holds something else (no run id and scenario)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and isinstance(data.get("run_id"), str) and "scenario" in data:
        return RunRecord.from_json_dict(data, str(path))
    return None


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
