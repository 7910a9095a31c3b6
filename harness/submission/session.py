"""`mlharness submission run`: for each scenario, the performance run, the accuracy run, then the
compliance audits, each LoadGen test in its own process, with a progress line. A state file
(results/<system>/<model>/submission_run.json) records finished steps, so the same command run
again resumes where it stopped; changing the settings, or --restart, starts over; --redo runs chosen
steps again (a scenario's later steps follow, since they compare with the earlier ones)."""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json
from mlharness.errors import UserError
from mlharness.running.progress import Steps
from mlharness.running.request import RunRequest
from mlharness.running.settings import SCENARIOS
from mlharness.submission.compliance import parse_tests, record_outcomes, run_audit
from mlharness.submission.runs import STEPS_FILE

STATE_FILE = "submission_run.json"
STATE_SCHEMA_VERSION = 1
FULL_LENGTH_S = 600


@dataclass(frozen=True)
class SessionOptions:
    """A submission session: `request` is what every step's run shares (its scenario and mode are set per
    step), the rest is the session's own."""
    request: RunRequest
    scenarios: tuple[str, ...]
    division: str = "open"
    compliance: tuple[str, ...] | None = None  # None: the benchmark's tests for closed, none for open
    restart: bool = False
    redo: tuple[str, ...] = ()  # "Scenario" or "Scenario/step" to run again


def session_options(fields: dict[str, Any], scenarios: list[str], **own: Any) -> SessionOptions:
    """Options from the run-request fields the command parsed and the session's own; the scenarios are
    checked first, so that a wrong one is named as --scenarios."""
    check_scenarios(scenarios)
    return SessionOptions(request=RunRequest(**fields, scenario=scenarios[0]), scenarios=tuple(scenarios), **own)


def _fingerprint(options: SessionOptions) -> str:
    """What makes two sessions the same runs: a different value starts the steps over."""
    request = options.request
    conf = request.user_conf.read_text() if request.user_conf and request.user_conf.is_file() else None
    key = {"model": request.model, "backend": request.backend, "dataset": request.dataset,
           "hardware": request.hardware, "user_conf": conf, "overrides": list(request.overrides),
           "presets": list(request.presets), "quick": request.quick}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _request(options: SessionOptions, scenario: str, command: str) -> RunRequest:
    return replace(options.request, scenario=scenario, mode="performance", command=command)


def check_scenarios(scenarios: list[str] | tuple[str, ...]) -> None:
    for scenario in scenarios:
        if scenario not in SCENARIOS:
            raise UserError(f"--scenarios: expected names from {', '.join(SCENARIOS)}, got {scenario!r}")
    if not scenarios:
        raise UserError("--scenarios: expected at least one scenario")


def plan(options: SessionOptions, benchmark_tests: tuple[str, ...]) -> list[tuple[str, str]]:
    """(scenario, step) in order: performance, accuracy, then each compliance test."""
    check_scenarios(options.scenarios)
    tests = options.compliance if options.compliance is not None else \
        (list(benchmark_tests) if options.division == "closed" else [])
    tests = parse_tests(",".join(tests))
    return [(s, step) for s in options.scenarios for step in ("performance", "accuracy", *tests)]


def _load_state(path: Path, fingerprint: str, restart: bool) -> dict[str, Any]:
    if path.is_file() and not restart:
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError:
            state = {}
        if state.get("fingerprint") == fingerprint and state.get("schema_version") == STATE_SCHEMA_VERSION:
            return state
        if state:
            print(f"{path}: settings changed since the last session; starting the steps over")
    return {"schema_version": STATE_SCHEMA_VERSION, "fingerprint": fingerprint, "steps": {}}


def _expected_seconds(state: dict[str, Any], scenario: str, step: str) -> float:
    """An audit takes about as long as the scenario's performance run (Offline's can run well past
    600 s: its one query holds min_query_count samples); otherwise the minimum duration."""
    measured = state["steps"].get(f"{scenario}/performance", {}).get("seconds")
    return measured if step != "performance" and measured else FULL_LENGTH_S * 1.1


def _redo_keys(requested: list[str], steps: list[tuple[str, str]]) -> set[str]:
    """`SingleStream` -> every SingleStream step; `SingleStream/TEST01` -> that step. Unknown: UserError."""
    keys: set[str] = set()
    for item in requested:
        matched = {f"{sc}/{st}" for sc, st in steps if item in (sc, f"{sc}/{st}")}
        if not matched:
            known = ", ".join(f"{sc}/{st}" for sc, st in steps)
            raise UserError(f"--redo {item}: not a step of this run; expected a scenario or one of: {known}")
        keys |= matched
    return keys


def _step_output_exists(scenario_dir: Path, step: str) -> bool:
    expected = {"performance": scenario_dir / "performance" / "run_1" / "mlperf_log_summary.txt",
                "accuracy": scenario_dir / "accuracy" / "mlperf_log_accuracy.json"}.get(step, scenario_dir / step)
    return expected.exists()


def _save_record(scenario_dir: Path, mode: str, record: dict[str, Any]) -> None:
    steps = scenario_dir / STEPS_FILE
    data = json.loads(steps.read_text()) if steps.is_file() else {"schema_version": 1, "records": {}}
    data["records"][mode] = record
    write_json(steps, data)


@dataclass
class _Session:
    """A session under way: its steps, its state file, and what the steps have found so far."""
    options: SessionOptions
    model_name: str
    steps: list[tuple[str, str]]
    model_dir: Path
    state_path: Path
    state: dict[str, Any]
    redo: set[str]
    rerun: set[str] = field(default_factory=set)  # scenarios where an earlier step ran again: later steps follow
    failed_compliance: list[str] = field(default_factory=list)


def _open_session(options: SessionOptions) -> _Session:
    """The model, the steps and the state the session resumes from."""
    from mlharness.running import system as system_mod
    from mlharness.running.resolve import select_model
    from mlharness.submission.rules import benchmark_for
    from mlharness.specs.index import default_index

    index, request = default_index(), options.request
    model = select_model(index, request.model, request.backend)
    benchmark = benchmark_for(model.mlperf_benchmark or model.name)
    steps = plan(options, benchmark.compliance_tests if benchmark else ())
    device = index.find("hardware", request.hardware).device
    system = system_mod.system_name(system_mod.detect_system(), device)
    model_dir = Path(request.results_dir) / system / model.name
    state_path = model_dir / STATE_FILE
    state = _load_state(state_path, _fingerprint(options), options.restart)
    return _Session(options, model.name, steps, model_dir, state_path, state, _redo_keys(list(options.redo), steps))


def run_session(options: SessionOptions) -> int:
    session = _open_session(options)
    started = time.monotonic()
    # Each step's run draws its own plan and progress (mlharness.running.progress); the session adds its
    # lines: a step started (with its expected length) and how it ended.
    progress = Steps(len(session.steps), sys.stdout, quiet=True, numbered=False)
    for number, (scenario, step) in enumerate(session.steps, 1):
        label = f"[{number}/{len(session.steps)}] {session.model_name} {scenario} {step}"
        if not _skipped(session, scenario, step, label):
            _run_and_keep(session, scenario, step, label, progress)
    print(f"submission run: {len(session.steps)} step(s) for {session.model_name} in "
          f"{time.monotonic() - started:.0f} s; state in {session.state_path}")
    print(f"next: mlharness submission package --division {options.division} --submitter <NAME> --out <DIR> "
          f"--results-dir {options.request.results_dir} --model {session.model_name}")
    if session.failed_compliance:
        print(f"compliance failed: {', '.join(session.failed_compliance)}", file=sys.stderr)
        return 1
    return 0


def _skipped(session: _Session, scenario: str, step: str, label: str) -> bool:
    """A step done earlier, whose output is still there and which is not to run again, is skipped (saying so)."""
    key = f"{scenario}/{step}"
    previous = session.state["steps"].get(key, {})
    if (previous.get("status") != "done" or scenario in session.rerun or key in session.redo
            or not _step_output_exists(session.model_dir / scenario, step)):
        return False
    verdict = previous.get("verdict")
    print(f"{label}: done earlier (run {previous.get('run_id')}{f', {verdict}' if verdict else ''}), skipped")
    if verdict == "FAIL":  # a resumed session reports the same verdict as the one that ran it
        session.failed_compliance.append(key)
    return True


def _run_and_keep(session: _Session, scenario: str, step: str, label: str, progress: Steps) -> None:
    """Run one step and keep how it ended in the state file (a failure too, then raised in one line)."""
    key = f"{scenario}/{step}"
    session.rerun.add(scenario)
    quick = session.options.request.quick
    expected = None if quick or step == "accuracy" else _expected_seconds(session.state, scenario, step)
    started = time.monotonic()
    progress.starting(label, expected, announce=True)
    try:
        outcome = _run_step(session.options, scenario, step, session.model_dir / scenario)
    except UserError as exc:
        progress.finished(label, "failed", time.monotonic() - started)
        session.state["steps"][key] = {"status": "failed", "error": str(exc)}
        write_json(session.state_path, session.state)
        failure = UserError(f"{label} failed: {exc} (run the same command again to resume)")
        failure.exit_status = getattr(exc, "exit_status", 1)  # 130 after Ctrl-C, as for `run`
        raise failure from None
    progress.finished(label, "done", time.monotonic() - started)
    session.state["steps"][key] = {"status": "done", "seconds": round(time.monotonic() - started, 1), **outcome}
    write_json(session.state_path, session.state)
    if outcome.get("verdict") == "FAIL":
        session.failed_compliance.append(key)
    for line in outcome.get("summary", []):
        print(f"    {line}")


def _run_step(options: SessionOptions, scenario: str, step: str, scenario_dir: Path) -> dict[str, Any]:
    if step in ("performance", "accuracy"):
        from mlharness.commands.run import format_summary
        from mlharness.running.launcher import run_request
        from mlharness.running.arguments import command_line
        from mlharness.running.resolve import resolved_for_run

        request = resolved_for_run(replace(_request(options, scenario, ""), mode=step))  # its command names the environment's
        request = replace(request, command=command_line(request, complete=True))
        record = run_request(request)  # a fresh process; a failed run raises with its one line
        data = record.to_dict()
        _save_record(scenario_dir, step, data)
        summary = [line.strip() for line in format_summary(record).splitlines()[1:] if "results :" not in line]
        return {"run_id": record.run_id, "summary": summary}
    perf = json.loads((scenario_dir / STEPS_FILE).read_text())["records"]["performance"]
    run_dir = Path(perf["results_path"])  # the audited run's own folder
    outcome = run_audit(_request(options, scenario, perf.get("command", "")), step, run_dir)
    _save_record(scenario_dir, "performance", record_outcomes(run_dir, {step: outcome}, perf))
    return {"run_id": outcome["run_id"], "verdict": outcome["verdict"],
            "summary": [f"{step}: {outcome['verdict']}"] + [l for l in outcome["performance_detail"]
                                                             if l.startswith(("reference score", "test score"))]}
