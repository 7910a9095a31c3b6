"""`mlharness submission run`: for each scenario, the performance run, the accuracy run, then the
compliance audits, each LoadGen test in its own process, with a progress line. A state file
(results/<system>/<model>/submission_run.json) records finished steps, so the same command run
again resumes where it stopped; changing the settings, or --restart, starts over; --redo runs chosen
steps again (a scenario's later steps follow, since they compare with the earlier ones)."""
from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json
from mlharness.errors import UserError
from mlharness.running.progress import Steps
from mlharness.running.settings import SCENARIOS
from mlharness.submission.compliance import parse_tests, record_outcomes, run_audit
from mlharness.submission.runs import STEPS_FILE

STATE_FILE = "submission_run.json"
STATE_SCHEMA_VERSION = 1
FULL_LENGTH_S = 600


@dataclass
class SessionOptions:
    model: str
    scenarios: list[str]
    division: str = "open"
    compliance: list[str] | None = None   # None: the benchmark's tests for closed, none for open
    results_dir: Path = Path("results")
    backend: str | None = None
    dataset: str | None = None
    hardware: str = "cpu"
    user_conf: Path | None = None
    overrides: list[str] = field(default_factory=list)
    presets: list[str] = field(default_factory=list)
    quick: bool = False
    restart: bool = False
    redo: list[str] = field(default_factory=list)  # "Scenario" or "Scenario/step" to run again
    quiet: bool = False  # no plan or progress from each step's run


def _fingerprint(options: SessionOptions) -> str:
    """What makes two sessions the same runs: a different value starts the steps over."""
    conf = options.user_conf.read_text() if options.user_conf and options.user_conf.is_file() else None
    key = {"model": options.model, "backend": options.backend, "dataset": options.dataset,
           "hardware": options.hardware, "user_conf": conf, "overrides": options.overrides,
           "presets": options.presets, "quick": options.quick}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _request(options: SessionOptions, scenario: str, command: str) -> Any:
    from mlharness.running.request import RunRequest

    return RunRequest(model=options.model, scenario=scenario, mode="performance", dataset=options.dataset,
                      backend=options.backend, hardware=options.hardware, quick=options.quick,
                      presets=list(options.presets), user_conf=options.user_conf,
                      results_dir=Path(options.results_dir), overrides=list(options.overrides), command=command,
                      quiet=options.quiet)


def plan(options: SessionOptions, benchmark_tests: tuple[str, ...]) -> list[tuple[str, str]]:
    """(scenario, step) in order: performance, accuracy, then each compliance test."""
    for scenario in options.scenarios:
        if scenario not in SCENARIOS:
            raise UserError(f"--scenarios: expected names from {', '.join(SCENARIOS)}, got {scenario!r}")
    if not options.scenarios:
        raise UserError("--scenarios: expected at least one scenario")
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


def run_session(options: SessionOptions) -> int:
    from mlharness.running import system as system_mod
    from mlharness.running.resolve import select_model
    from mlharness.submission.rules import benchmark_for
    from mlharness.specs.index import default_index

    index = default_index()
    model = select_model(index, options.model, options.backend)
    benchmark = benchmark_for(model.mlperf_benchmark or model.name)
    steps = plan(options, benchmark.compliance_tests if benchmark else ())
    device = index.find("hardware", options.hardware).device
    system = system_mod.system_name(system_mod.detect_system(), device)
    model_dir = Path(options.results_dir) / system / model.name
    state_path = model_dir / STATE_FILE
    state = _load_state(state_path, _fingerprint(options), options.restart)
    redo = _redo_keys(options.redo, steps)
    rerun: set[str] = set()  # scenarios where an earlier step ran again: later steps must follow
    failed_compliance = []
    session_started = time.monotonic()
    # Each step's run draws its own plan and progress (mlharness.running.progress); the session adds its
    # lines: a step started (with its expected length) and how it ended.
    progress = Steps(len(steps), sys.stdout, quiet=True, numbered=False)
    for number, (scenario, step) in enumerate(steps, 1):
        key = f"{scenario}/{step}"
        scenario_dir = model_dir / scenario
        label = f"[{number}/{len(steps)}] {model.name} {scenario} {step}"
        previous = state["steps"].get(key, {})
        if (previous.get("status") == "done" and scenario not in rerun and key not in redo
                and _step_output_exists(scenario_dir, step)):
            verdict = previous.get("verdict")
            print(f"{label}: done earlier (run {previous.get('run_id')}{f', {verdict}' if verdict else ''}), skipped")
            if verdict == "FAIL":  # a resumed session reports the same verdict as the one that ran it
                failed_compliance.append(key)
            continue
        rerun.add(scenario)
        expected = None if options.quick or step == "accuracy" else _expected_seconds(state, scenario, step)
        started = time.monotonic()
        progress.starting(label, expected, announce=True)
        try:
            outcome = _run_step(options, scenario, step, scenario_dir)
        except UserError as exc:
            progress.finished(label, "failed", time.monotonic() - started)
            state["steps"][key] = {"status": "failed", "error": str(exc)}
            write_json(state_path, state)
            failure = UserError(f"{label} failed: {exc} (run the same command again to resume)")
            failure.exit_status = getattr(exc, "exit_status", 1)  # 130 after Ctrl-C, as for `run`
            raise failure from None
        progress.finished(label, "done", time.monotonic() - started)
        state["steps"][key] = {"status": "done", "seconds": round(time.monotonic() - started, 1), **outcome}
        write_json(state_path, state)
        if outcome.get("verdict") == "FAIL":
            failed_compliance.append(key)
        for line in outcome.get("summary", []):
            print(f"    {line}")
    print(f"submission run: {len(steps)} step(s) for {model.name} in {time.monotonic() - session_started:.0f} s; "
          f"state in {state_path}")
    print(f"next: mlharness submission package --division {options.division} --submitter <NAME> --out <DIR> "
          f"--results-dir {options.results_dir} --model {model.name}")
    if failed_compliance:
        print(f"compliance failed: {', '.join(failed_compliance)}", file=sys.stderr)
        return 1
    return 0


def _run_step(options: SessionOptions, scenario: str, step: str, scenario_dir: Path) -> dict[str, Any]:
    if step in ("performance", "accuracy"):
        from mlharness.commands.run import format_summary
        from mlharness.running.launcher import run_request
        from mlharness.running.arguments import run_arguments

        request = replace(_request(options, scenario, ""), mode=step)
        request = replace(request, command=shlex.join(["mlharness", *run_arguments(request, complete=True)]))
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
