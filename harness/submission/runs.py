"""Which recorded runs go into a submission: per model and scenario, the latest ok performance run
and the latest ok accuracy run. The files come from the results tree
(results/<system>/<model>/<Scenario>/); the run records come from, newest first, the steps file
`submission run` keeps, the results database when it is there, and the scenario's run.json. A run
pinned with --run whose logs a later run has overwritten is refused, not packaged silently. A
record of another kind than a LoadGen test (a layer benchmark, an LLM token run) is left out with
the reason in `ScenarioRuns.skipped`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlharness.errors import UserError
from mlharness.records.loadgen_logs import parse_summary
from mlharness.records.run_record import LOADGEN, RunRecord

STEPS_FILE = "submission_steps.json"
PERF_MODES = ("performance", "submission")
ACCURACY_MODES = ("accuracy", "submission")


@dataclass
class ScenarioRuns:
    model: str
    scenario: str
    path: Path                       # results/<system>/<model>/<Scenario>
    performance: RunRecord | None = None
    accuracy: RunRecord | None = None
    compliance: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # why records found here were left out

    @property
    def system(self) -> str:
        return self.path.parent.parent.name


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read run record: {exc}") from None


def _store_records(results_dir: Path, system: str, model: str, scenario: str) -> list[RunRecord]:
    """Ok records from the results database; none when the database (or its module) is absent."""
    try:
        from mlharness.store import result_store
    except ImportError:
        return []
    db = result_store.default_db_path(results_dir)
    if not db.exists():
        return []
    with result_store.ResultStore(db, create=False) as store:
        return store.run_records(result_store.RunFilter(model=model, scenario=scenario, system=system, status="ok"))


def candidate_records(results_dir: Path, scenario_dir: Path, skipped: list[str] | None = None) -> list[RunRecord]:
    """The ok LoadGen records of a scenario folder, newest first; why any other record found was left
    out goes into `skipped`."""
    system, model, scenario = scenario_dir.parent.parent.name, scenario_dir.parent.name, scenario_dir.name
    found: dict[str, RunRecord] = {}
    steps = scenario_dir / STEPS_FILE
    if steps.is_file():
        for mode, data in (_read_json(steps).get("records") or {}).items():
            record = RunRecord.from_json_dict(data, f"{steps}: records.{mode}")
            found[record.run_id] = record
    for record in _store_records(results_dir, system, model, scenario):
        found.setdefault(record.run_id, record)
    if (scenario_dir / "run.json").is_file():
        record = RunRecord.load(scenario_dir / "run.json")
        found[record.run_id] = record  # the tree's copy carries the latest compliance outcomes
    kept = []
    for record in found.values():
        if not record.is_ok:
            continue
        if not record.is_loadgen:
            if skipped is not None:
                skipped.append(f"{scenario_dir}: run {record.run_id} left out: a {record.kind!r} record, not a "
                               f"{LOADGEN} test (a submission packages LoadGen runs only)")
            continue
        kept.append(record)
    return sorted(kept, key=lambda r: (r.started_at or "", r.run_id), reverse=True)


def _latest(records: list[RunRecord], modes: tuple[str, ...]) -> RunRecord | None:
    return next((r for r in records if r.mode in modes), None)


def _check_logs_are_from(record: RunRecord, scenario_dir: Path) -> None:
    """The performance logs in the tree must be the ones this record describes."""
    summary = scenario_dir / "performance" / "run_1" / "mlperf_log_summary.txt"
    recorded = dict(record.perf.raw) if record.perf else None
    if recorded and summary.is_file() and parse_summary(summary)["raw"] != recorded:
        raise UserError(f"{summary}: run {record.run_id}'s performance logs were overwritten by a later run; "
                        f"package the latest run or rerun it")


def collect(results_dir: Path, *, system: str | None = None, models: list[str] | None = None,
            scenarios: list[str] | None = None, pinned: list[str] | None = None) -> list[ScenarioRuns]:
    """Every scenario folder under results_dir that matches, with its chosen records."""
    systems = [p for p in sorted(results_dir.iterdir()) if p.is_dir() and not p.name.startswith(".")] \
        if results_dir.is_dir() else []
    if system:
        systems = [p for p in systems if p.name == system]
        if not systems:
            raise UserError(f"{results_dir / system}: no such system folder in the results tree")
    elif len(systems) > 1:
        raise UserError(f"{results_dir}: runs from several systems ({', '.join(p.name for p in systems)}); "
                        f"pass --results-system")
    chosen: list[ScenarioRuns] = []
    used: set[str] = set()
    skipped: list[str] = []
    for system_dir in systems:
        for model_dir in sorted(p for p in system_dir.iterdir() if p.is_dir()):
            if models and model_dir.name not in models:
                continue
            for scenario_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                if scenarios and scenario_dir.name not in scenarios:
                    continue
                if not (scenario_dir / "performance").is_dir() and not (scenario_dir / "accuracy").is_dir():
                    continue
                runs = ScenarioRuns(model_dir.name, scenario_dir.name, scenario_dir)
                records = candidate_records(results_dir, scenario_dir, runs.skipped)
                runs.performance, runs.accuracy = _latest(records, PERF_MODES), _latest(records, ACCURACY_MODES)
                used |= _apply_pins(runs, records, pinned or [])
                if runs.performance:
                    _check_logs_are_from(runs.performance, scenario_dir)
                    runs.compliance = runs.performance.compliance or {}
                skipped += runs.skipped
                chosen.append(runs)
    unused = [p for p in pinned or [] if p not in used]
    if unused:
        why = next((reason for reason in skipped if f"run {unused[0]}" in reason), None)
        raise UserError(f"--run {unused[0]}: " + (why or "no ok run with that id among the selected scenario folders"))
    if not chosen:
        raise UserError(f"{results_dir}: no recorded runs match (model {models or 'any'}, "
                        f"scenarios {scenarios or 'any'})")
    return chosen


def _apply_pins(runs: ScenarioRuns, records: list[RunRecord], pinned: list[str]) -> set[str]:
    used = set()
    for run_id in pinned:
        match = [r for r in records if r.run_id == run_id or r.run_id.startswith(run_id)]
        if not match:
            continue
        record = match[0]
        used.add(run_id)
        if record.mode in PERF_MODES:
            runs.performance = record
        if record.mode in ACCURACY_MODES:
            runs.accuracy = record
    return used
