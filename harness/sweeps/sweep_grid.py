"""A sweep grid (YAML): its validation (its schema is mlharness.sweeps.grid_schema) and its expansion
into cells.

A cell is one run configuration, a RunRequest: model x backend x dataset x hardware x software x
scenario x batch size x thread count x any other setting (the sweep supplies its results dir and
timeout, and runs it once per repeat index). Its key is a hash of what it runs, so a resumed or
edited grid finds the cells it already ran."""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlharness.errors import UserError
from mlharness.running.arguments import REQUEST_FLAGS
from mlharness.running.request import RunRequest
from mlharness.running.settings import SCENARIOS
from mlharness.sweeps.grid_schema import GridDoc
from mlharness.specs.endpoint import parse_endpoint
from mlharness.specs.validation import ManifestError, load_yaml, problems_from

# Axis names usable in `exclude` entries besides setting keys.
CELL_FIELDS = ("model", "backend", "dataset", "hardware", "software", "scenario")
# What a cell's params hold (sweep_cells.params_json) and its key hashes: the model and every request
# field that decides the run and has a run-request flag (mlharness.running.arguments.REQUEST_FLAGS,
# the one table of them), less the timeout the sweep sets for every cell. The fields of every cell's
# params before the manifest axes existed are always there; the others only when not at their default,
# so a cell that does not use them keeps its key and a resumed sweep still finds its finished cells
# (also when a field with a flag is added to the table).
ALWAYS_IN_PARAMS = ("model", "backend", "scenario", "mode", "quick", "presets", "overrides", "profile")
SET_BY_THE_SWEEP = ("timeout",)
PARAM_FIELDS = ("model",) + tuple(flag.field for flag in REQUEST_FLAGS
                                  if flag.decides_run and flag.field not in SET_BY_THE_SWEEP)
# The manifests and files a cell may set to other than their default: shown in its label.
MANIFEST_FIELDS = ("dataset", "hardware", "software", "user_conf", "endpoint")
_DEFAULTS = {f.name: f.default for f in fields(RunRequest)}


def _stored(value: Any) -> Any:
    """A request field's value as JSON holds it (read back by RunRequest, which makes tuples and Paths)."""
    if isinstance(value, tuple):
        return list(value)
    return str(value) if isinstance(value, Path) else value


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
        """The dataset, hardware, software, user.conf and endpoint this cell sets to other than their default."""
        return {name: str(getattr(self.request, name)) for name in MANIFEST_FIELDS
                if getattr(self.request, name) != _DEFAULTS[name]}

    def label(self) -> str:
        parts = [f"{self.model}/{self.backend or 'default'}/{self.scenario}"]
        parts += [f"{name}={value}" for name, value in self.manifests().items()]
        parts += [item for item in self.overrides]
        return " ".join(parts)

    def params(self) -> dict[str, Any]:
        """What the cell runs, as stored in sweep_cells.params_json and hashed into its key (PARAM_FIELDS)."""
        return {name: _stored(getattr(self.request, name)) for name in PARAM_FIELDS
                if name in ALWAYS_IN_PARAMS or getattr(self.request, name) != _DEFAULTS[name]}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Cell":
        """A stored cell back (the rows of every version so far hold a subset of PARAM_FIELDS)."""
        return cls.of(**{k: v for k, v in params.items() if k in PARAM_FIELDS})


@dataclass(frozen=True)
class Grid:
    path: Path
    name: str
    cells: list[Cell]
    repeat: int
    timeout_s: float
    document: dict[str, Any] = field(default_factory=dict)
    cells_per_node: int = 1  # `cluster: {cells_per_node: N}`: cells a cluster node runs at once (mlharness.cluster)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _scoped(value: dict[str, Any] | None) -> dict[str, Any]:
    """A checked settings mapping (grid_schema), flat or scoped by '*' and scenario names, as scoped."""
    if not value:
        return {"scoped": {}}
    scoped = all(k == "*" or k in SCENARIOS for k in value)
    return {"scoped": value} if scoped else {"scoped": {"*": value}}


def _scoped_for(settings: dict[str, Any], scenario: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for scope in ("*", scenario):
        for key, value in ((settings.get("scoped") or {}).get(scope) or {}).items():
            merged[str(key)] = _text(value)
    return merged


def _manifest_axis(values: list[str] | None, where: str, kind: str, default: str | None) -> list[str | None]:
    """A datasets, hardware or software axis: manifest names or paths, or 'default' (the model's
    dataset, the software named after the backend; for hardware, cpu). Every one must exist, so a
    typo is an error before the first cell runs rather than a failed cell per combination."""
    from mlharness.specs.index import default_index

    if values is None:
        return [default]
    found: list[str | None] = []
    index = None
    for i, value in enumerate(values):
        if value == "default":
            found.append(default)
            continue
        index = index or default_index()
        try:
            index.find(kind, value)
        except UserError as exc:
            raise UserError(f"{where}[{i}]: {str(exc).splitlines()[0]}") from None
        found.append(value)
    return found


def _backend(value: str) -> str | None:
    return None if value == "default" else value


def _excluded(cell: Cell, batch: Any, threads: Any, rules: list[dict[str, Any]]) -> bool:
    values = {"model": cell.model, "backend": cell.backend or "default", "scenario": cell.scenario,
              "dataset": cell.dataset or "default", "hardware": cell.hardware, "software": cell.software or "default",
              "endpoint": cell.request.endpoint or "none"}
    values.update(dict(item.partition("=")[::2] for item in cell.overrides))
    if batch is not None:
        values["batch_size"] = _text(batch)
    if threads is not None:
        values["threads"] = _text(threads)
    return any(all(values.get(k) == _text(v) for k, v in rule.items()) for rule in rules)


def load_grid(path: Path) -> Grid:
    """Read and check a grid file: its schema (grid_schema; every problem at once, one line each
    naming the file and the field), then the manifests and files it names; then its cells."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such sweep grid file")
    raw = load_yaml(path)
    try:
        doc = GridDoc.model_validate(raw)
    except ValidationError as exc:
        raise ManifestError(problems_from(exc, str(path), GridDoc, raw)) from None
    where = str(path)
    datasets = _manifest_axis(doc.datasets, f"{where}: datasets", "dataset", None)
    hardware_axis = _manifest_axis(doc.hardware, f"{where}: hardware", "hardware", "cpu")
    software_axis = _manifest_axis(doc.software, f"{where}: software", "software", None)
    if doc.user_conf is not None and not Path(doc.user_conf).is_file():
        # relative to the current folder, as for `mlharness run --user-conf`
        raise UserError(f"{where}: user_conf: expected a user.conf file, got {doc.user_conf!r}")
    axes = _axes(doc)
    fixed = _scoped(doc.set)
    presets, profile = tuple(doc.presets), tuple(doc.profile)
    cells: list[Cell] = []
    for i, entry in enumerate(doc.models):
        backends = entry.backends if entry.backends is not None else doc.backends
        model_datasets = _manifest_axis(entry.datasets, f"{where}: models[{i}]: datasets", "dataset", None) \
            if entry.datasets is not None else datasets
        model_set = _scoped(entry.set)
        endpoint = parse_endpoint(entry.endpoint, f"{where}: models[{i}]: endpoint").url if entry.endpoint else None
        for backend_value, dataset, hardware, software, scenario in itertools.product(
                backends, model_datasets, hardware_axis, software_axis, doc.scenarios):
            for combo in itertools.product(*(values for _, values in axes)):
                overrides = _scoped_for(fixed, scenario) | _scoped_for(model_set, scenario)
                overrides |= {key: _text(value) for (key, _), value in zip(axes, combo)}
                cell = Cell.of(model=entry.name, backend=_backend(backend_value), dataset=dataset, hardware=hardware,
                               software=software, scenario=scenario, mode=doc.mode, quick=doc.quick, presets=presets,
                               user_conf=doc.user_conf, profile=profile, endpoint=endpoint,
                               overrides=tuple(f"{k}={v}" for k, v in sorted(overrides.items())))
                if not _excluded(cell, cell.setting("max_batch_size"), cell.setting("intra_op_threads"), doc.exclude):
                    cells.append(cell)
    if not cells:
        raise UserError(f"{where}: the grid has no cells (every combination is excluded)")
    return Grid(path=path, name=doc.name or path.stem, cells=_unique(cells), repeat=doc.repeat,
                timeout_s=doc.timeout, document=raw,
                cells_per_node=doc.cluster.cells_per_node if doc.cluster is not None else 1)


def _axes(doc: GridDoc) -> list[tuple[str, list[Any]]]:
    """(setting key, values) per swept axis: batch_sizes, threads, then each `settings` entry."""
    axes: list[tuple[str, list[Any]]] = []
    if doc.batch_sizes is not None:
        axes.append(("max_batch_size", doc.batch_sizes))
    if doc.threads is not None:
        axes.append(("intra_op_threads", doc.threads))
    axes += [(str(key), values) for key, values in doc.settings.items()]
    return axes


def _unique(cells: list[Cell]) -> list[Cell]:
    seen: set[str] = set()
    return [c for c in cells if not (c.key in seen or seen.add(c.key))]
