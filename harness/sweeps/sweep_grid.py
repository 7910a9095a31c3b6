"""A sweep grid (YAML): its validation and its expansion into cells.

A cell is one run configuration, a RunRequest: model x backend x dataset x hardware x software x
scenario x batch size x thread count x any other setting (the sweep supplies its results dir and
timeout, and runs it once per repeat index). Its key is a hash of what it runs, so a resumed or
edited grid finds the cells it already ran."""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.running.request import RunRequest
from harness.running.settings import HARNESS_KEYS, LOADGEN_KEYS, MODES, SCENARIOS
from specs.validation import load_yaml

GRID_SCHEMA_VERSION = 1
GRID_KEYS = frozenset({"schema_version", "name", "description", "models", "backends", "datasets", "hardware",
                       "software", "scenarios", "mode", "batch_sizes", "threads", "settings", "set", "quick",
                       "presets", "user_conf", "repeat", "timeout", "exclude", "profile",
                       "cluster"})  # cluster: {cells_per_node: N}, read by harness.cluster.resources
MODEL_KEYS = frozenset({"name", "backends", "datasets", "set"})
# Axis names usable in `exclude` entries besides setting keys.
CELL_FIELDS = ("model", "backend", "dataset", "hardware", "software", "scenario")
# What a cell's key hashes: these request fields always (the key of every grid before the manifest
# axes existed), and dataset, hardware, software and user_conf only when not their default, so a
# cell that does not use them keeps its key and a resumed sweep still finds its finished cells.
KEY_FIELDS = ("model", "backend", "scenario", "mode", "quick", "presets", "overrides", "profile")
OPTIONAL_KEY_FIELDS = {"dataset": None, "hardware": "cpu", "software": None, "user_conf": None}
DEFAULT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Cell:
    """One configuration of a sweep: the RunRequest it submits, less the sweep's results dir and
    timeout (`request_for`). The sweep runs it once per repeat index."""
    request: RunRequest

    @classmethod
    def of(cls, **fields: Any) -> "Cell":
        return cls(RunRequest(**fields))

    # The request's fields the sweep's tables, exclude rules and reports read.
    model = property(lambda self: self.request.model)
    backend = property(lambda self: self.request.backend)  # None: the model manifest's own framework
    dataset = property(lambda self: self.request.dataset)  # None: the model manifest's own dataset
    hardware = property(lambda self: self.request.hardware)
    software = property(lambda self: self.request.software)  # None: the one named after the backend
    scenario = property(lambda self: self.request.scenario)
    mode = property(lambda self: self.request.mode)
    quick = property(lambda self: self.request.quick)
    presets = property(lambda self: self.request.presets)
    overrides = property(lambda self: self.request.overrides)  # "key=value", sorted by key
    profile = property(lambda self: self.request.profile)

    @property
    def key(self) -> str:
        text = json.dumps(self.params(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def request_for(self, results_dir: Path, timeout_s: float) -> RunRequest:
        return replace(self.request, results_dir=results_dir, timeout=timeout_s)

    def setting(self, key: str) -> str | None:
        for item in self.overrides:
            name, _, value = item.partition("=")
            if name == key:
                return value
        return None

    def manifests(self) -> dict[str, str]:
        """The dataset, hardware, software and user.conf this cell sets to other than their default."""
        found = {}
        for name, default in OPTIONAL_KEY_FIELDS.items():
            value = getattr(self.request, name)
            if value != default:
                found[name] = str(value)
        return found

    def label(self) -> str:
        parts = [f"{self.model}/{self.backend or 'default'}/{self.scenario}"]
        parts += [f"{name}={value}" for name, value in self.manifests().items()]
        parts += [item for item in self.overrides]
        return " ".join(parts)

    def params(self) -> dict[str, Any]:
        """What the cell runs, as stored in sweep_cells.params_json and hashed into its key."""
        params: dict[str, Any] = {}
        for name in KEY_FIELDS:
            value = getattr(self.request, name)
            params[name] = list(value) if isinstance(value, tuple) else value
        return params | self.manifests()

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Cell":
        known = set(KEY_FIELDS) | set(OPTIONAL_KEY_FIELDS)
        return cls.of(**{k: v for k, v in params.items() if k in known})


@dataclass(frozen=True)
class Grid:
    path: Path
    name: str
    cells: list[Cell]
    repeat: int
    timeout_s: float
    document: dict[str, Any] = field(default_factory=dict)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _list(doc: dict[str, Any], key: str, where: str, default: list[Any]) -> list[Any]:
    value = doc.get(key, default)
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise UserError(f"{where}: {key}: expected a non-empty list")
    return value


def _check_setting(key: str, where: str) -> None:
    if key not in LOADGEN_KEYS | HARNESS_KEYS:
        known = ", ".join(sorted(LOADGEN_KEYS | HARNESS_KEYS))
        raise UserError(f"{where}: unknown setting {key!r} (known: {known})")


def _settings_mapping(value: Any, where: str) -> dict[str, Any]:
    """A flat {key: value} or a scenario-scoped {'*' | Scenario: {key: value}} mapping, checked."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a mapping of settings")
    scoped = bool(value) and all(k == "*" or k in SCENARIOS for k in value)
    entries = value.values() if scoped else [value]
    for entry in entries:
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping of settings under each scenario")
        for key in entry:
            _check_setting(str(key), where)
    return {"scoped": value} if scoped else {"scoped": {"*": value}}


def _scoped_for(settings: dict[str, Any], scenario: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for scope in ("*", scenario):
        for key, value in ((settings.get("scoped") or {}).get(scope) or {}).items():
            merged[str(key)] = _text(value)
    return merged


def _models(doc: dict[str, Any], where: str, backends: list[Any],
            datasets: list[Any]) -> list[tuple[str, list[Any], list[Any], dict[str, Any]]]:
    found = []
    for i, entry in enumerate(_list(doc, "models", where, [])):
        at = f"{where}: models[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            hint = " (quote \"null\": YAML reads a bare null as nothing)" if entry is None else ""
            raise UserError(f"{at}: expected a model name or {{name, backends, datasets, set}}{hint}")
        unknown = set(entry) - MODEL_KEYS
        if unknown:
            raise UserError(f"{at}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(MODEL_KEYS))})")
        model_backends = _list(entry, "backends", at, backends) if "backends" in entry else backends
        model_datasets = _manifest_axis(entry, "datasets", at, "dataset") if "datasets" in entry else datasets
        found.append((entry["name"], model_backends, model_datasets, _settings_mapping(entry.get("set"), f"{at}: set")))
    return found


def _manifest_axis(doc: dict[str, Any], key: str, where: str, kind: str) -> list[str | None]:
    """A datasets, hardware or software axis: manifest names or paths, or 'default' (None: the model's
    dataset, the software named after the backend; for hardware, cpu). Every one must exist, so a
    typo is an error before the first cell runs rather than a failed cell per combination."""
    from specs.index import default_index

    values: list[str | None] = []
    index = None
    for i, value in enumerate(_list(doc, key, where, [])):
        at = f"{where}: {key}[{i}]"
        if not isinstance(value, str) or not value:
            raise UserError(f"{at}: expected a {kind} manifest name or path, or 'default'")
        if value == "default":
            values.append("cpu" if kind == "hardware" else None)
            continue
        index = index or default_index()
        try:
            index.find(kind, value)
        except UserError as exc:
            raise UserError(f"{at}: {str(exc).splitlines()[0]}") from None
        values.append(value)
    return values


def _backend(value: Any, where: str) -> str | None:
    if not isinstance(value, str):
        raise UserError(f"{where}: expected a backend name or 'default' (quote \"null\": YAML reads a bare "
                        "null as nothing)")
    return None if value == "default" else value


def _excluded(cell: Cell, batch: Any, threads: Any, rules: list[dict[str, Any]]) -> bool:
    values = {"model": cell.model, "backend": cell.backend or "default", "scenario": cell.scenario,
              "dataset": cell.dataset or "default", "hardware": cell.hardware, "software": cell.software or "default"}
    values.update(dict(item.partition("=")[::2] for item in cell.overrides))
    if batch is not None:
        values["batch_size"] = _text(batch)
    if threads is not None:
        values["threads"] = _text(threads)
    return any(all(values.get(k) == _text(v) for k, v in rule.items()) for rule in rules)


def load_grid(path: Path) -> Grid:
    """Read and check a grid file; every problem names the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such sweep grid file")
    doc = load_yaml(path)
    where = str(path)
    if not isinstance(doc, dict):
        raise UserError(f"{where}: expected a mapping with models, scenarios, ...")
    unknown = set(doc) - GRID_KEYS
    if unknown:
        raise UserError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(GRID_KEYS))})")
    version = doc.get("schema_version", GRID_SCHEMA_VERSION)
    if version != GRID_SCHEMA_VERSION:
        raise UserError(f"{where}: schema_version: expected {GRID_SCHEMA_VERSION}, got {version!r}")
    scenarios = _list(doc, "scenarios", where, [])
    for i, scenario in enumerate(scenarios):
        if scenario not in SCENARIOS:
            raise UserError(f"{where}: scenarios[{i}]: expected one of {', '.join(SCENARIOS)}, got {scenario!r}")
    mode = doc.get("mode", "performance")
    if mode not in MODES:
        raise UserError(f"{where}: mode: expected one of {', '.join(MODES)}, got {mode!r}")
    backends = _list(doc, "backends", where, ["default"])
    for i, backend in enumerate(backends):
        _backend(backend, f"{where}: backends[{i}]")
    axes = _axes(doc, where)
    fixed = _settings_mapping(doc.get("set"), f"{where}: set")
    exclude = doc.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(rule, dict) for rule in exclude):
        raise UserError(f"{where}: exclude: expected a list of mappings such as {{model: m, scenario: S}}")
    presets = tuple(str(p) for p in (doc.get("presets") or []))
    profile = tuple(str(p) for p in (doc.get("profile") or []))
    quick = bool(doc.get("quick", False))
    datasets = _manifest_axis(doc, "datasets", where, "dataset") if "datasets" in doc else [None]
    hardware_axis = _manifest_axis(doc, "hardware", where, "hardware") if "hardware" in doc else ["cpu"]
    software_axis = _manifest_axis(doc, "software", where, "software") if "software" in doc else [None]
    user_conf = _user_conf(doc.get("user_conf"), where)
    cells: list[Cell] = []
    for model, model_backends, model_datasets, model_set in _models(doc, where, backends, datasets):
        for backend_value, dataset, hardware, software, scenario in itertools.product(
                model_backends, model_datasets, hardware_axis, software_axis, scenarios):
            backend = _backend(backend_value, f"{where}: models: {model}: backends")
            for combo in itertools.product(*(values for _, values in axes)):
                overrides = _scoped_for(fixed, scenario) | _scoped_for(model_set, scenario)
                overrides |= {key: _text(value) for (key, _), value in zip(axes, combo)}
                cell = Cell.of(model=model, backend=backend, dataset=dataset, hardware=hardware, software=software,
                               scenario=scenario, mode=mode, quick=quick, presets=presets, user_conf=user_conf,
                               overrides=tuple(f"{k}={v}" for k, v in sorted(overrides.items())), profile=profile)
                if not _excluded(cell, cell.setting("max_batch_size"), cell.setting("intra_op_threads"), exclude):
                    cells.append(cell)
    if not cells:
        raise UserError(f"{where}: the grid has no cells (every combination is excluded)")
    return Grid(path=path, name=str(doc.get("name") or path.stem), cells=_unique(cells),
                repeat=_positive_int(doc.get("repeat", 1), f"{where}: repeat"),
                timeout_s=_positive_float(doc.get("timeout", DEFAULT_TIMEOUT_S), f"{where}: timeout"), document=doc)


def _user_conf(value: Any, where: str) -> str | None:
    """A LoadGen user.conf for every cell (a path, relative to the current folder as for `mlharness run`)."""
    if value is None:
        return None
    if not isinstance(value, str) or not Path(value).is_file():
        raise UserError(f"{where}: user_conf: expected a user.conf file, got {value!r}")
    return value


def _axes(doc: dict[str, Any], where: str) -> list[tuple[str, list[Any]]]:
    """(setting key, values) per swept axis: batch_sizes, threads, then each `settings` entry."""
    axes: list[tuple[str, list[Any]]] = []
    if "batch_sizes" in doc:
        axes.append(("max_batch_size", _list(doc, "batch_sizes", where, [])))
    if "threads" in doc:
        axes.append(("intra_op_threads", _list(doc, "threads", where, [])))
    settings = doc.get("settings") or {}
    if not isinstance(settings, dict):
        raise UserError(f"{where}: settings: expected a mapping of setting -> list of values")
    for key, values in settings.items():
        _check_setting(str(key), f"{where}: settings")
        axes.append((str(key), _list(settings, key, f"{where}: settings", [])))
    return axes


def _unique(cells: list[Cell]) -> list[Cell]:
    seen: set[str] = set()
    return [c for c in cells if not (c.key in seen or seen.add(c.key))]


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where}: expected an integer >= 1, got {value!r}")
    return value


def _positive_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UserError(f"{where}: expected a number of seconds > 0, got {value!r}")
    return float(value)
