"""Compliance tests TEST01 and TEST04 through LoadGen's audit.config mechanism.

Each audit runs the same model, scenario and settings in performance mode with an audit.config
we write from the documented keys, in a fresh process (mlharness.running.launcher). Its logs go to
<Scenario>/<TEST>/performance/run_1/ (TEST01 also keeps its sampled accuracy log in
<TEST>/accuracy/), and verify_accuracy.txt / verify_performance.txt say TEST PASS or TEST FAIL with
the numbers, judged as the official compliance scripts judge:
- TEST01 accuracy: every sampled response equals the accuracy run's response for that sample;
- TEST01 performance: the audit's score within 10% of the submission run (either way);
- TEST04 performance: the audit (same sample every time) not more than 10% faster.
Both runs must be VALID. SingleStream/MultiStream thresholds relax to 20% below the scripts' limits."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mlharness.atomic_io import move_file, write_json, write_text
from mlharness.errors import UserError
from mlharness.records.loadgen_logs import detail_values
from mlharness.records.run_record import RunRecord
from mlharness.submission.rules import COMPLIANCE, ComplianceRule

# The submission run's figure each scenario is judged by, as named in the detail log.
SCORE_KEYS = {"Offline": "result_samples_per_second", "Server": "result_completed_samples_per_sec",
              "SingleStream": "early_stopping_latency_ss", "MultiStream": "early_stopping_latency_ms"}
LATENCY_SCENARIOS = ("SingleStream", "MultiStream")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    lines: list[str]

    def text(self) -> str:
        return "\n".join(self.lines + ["TEST PASS" if self.passed else "TEST FAIL"]) + "\n"


def parse_tests(text: str | None) -> list[str]:
    """`TEST01,TEST04` -> ['TEST01', 'TEST04']; unknown names are a UserError."""
    tests = [t.strip().upper() for t in (text or "").split(",") if t.strip()]
    for test in tests:
        if test not in COMPLIANCE:
            raise UserError(f"--compliance: expected tests from {', '.join(COMPLIANCE)}, got {test!r}")
    return list(dict.fromkeys(tests))


def audit_config_text(test: str) -> str:
    rule = COMPLIANCE[test]
    lines = [f"# {test} audit.config written by mlharness (keys as in mlcommons/inference compliance/{test})"]
    lines += [f"*.*.{key} = {value}" for key, value in rule.audit_config.items()]
    return "\n".join(lines) + "\n"


# ---- verification --------------------------------------------------------------------------

def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text() or "[]")
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: expected LoadGen's accuracy log (a JSON list): {exc}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: expected LoadGen's accuracy log (a JSON list), got {type(data).__name__}")
    for i, entry in enumerate(data):
        if not (isinstance(entry, dict) and isinstance(entry.get("qsl_idx"), int) and "data" in entry):
            raise UserError(f"{path}: entry {i}: expected {{qsl_idx: integer, data: ...}}, got {str(entry)[:80]}")
    return data


def verify_accuracy(reference_log: Path, test_log: Path, labels: tuple[str, str] | None = None) -> Verdict:
    """TEST01: each response sampled in performance mode must equal the accuracy run's response."""
    reference, sampled = _entries(reference_log), _entries(test_log)
    by_index: dict[int, str] = {}
    duplicates = mismatched_duplicates = 0
    for entry in reference:
        index = int(entry["qsl_idx"])
        if index in by_index:
            duplicates += 1
            mismatched_duplicates += int(by_index[index] != entry["data"])
        else:
            by_index[index] = entry["data"]
    matched = mismatched = missing = 0
    for entry in sampled:
        expected = by_index.get(int(entry["qsl_idx"]))
        if expected is None:
            missing += 1
        elif expected == entry["data"]:
            matched += 1
        else:
            mismatched += 1
    ref_label, test_label = labels or (str(reference_log), str(test_log))
    lines = [f"reference accuracy log = {ref_label}", f"test accuracy log = {test_label}",
             f"num_acc_log_entries = {len(reference)}", f"num_acc_log_duplicate_keys = {duplicates}",
             f"num_acc_log_data_mismatch = {mismatched_duplicates}", f"num_perf_log_entries = {len(sampled)}",
             f"num_perf_log_qsl_idx_match = {matched + mismatched}", f"num_perf_log_data_mismatch = {mismatched}",
             f"num_missing_qsl_idxs = {missing}"]
    return Verdict(mismatched == 0 and matched > 0, lines)


def run_score(detail_log: Path) -> tuple[str, float | None, bool]:
    """(scenario, the figure the scenario is judged by, VALID?) from a performance detail log;
    the figure is None when the log has none or it is not a number."""
    values = detail_values(detail_log, ("effective_scenario", "result_validity", *SCORE_KEYS.values()))
    scenario = str(values.get("effective_scenario", ""))
    score = values.get(SCORE_KEYS.get(scenario, ""))
    try:
        number = float(score) if score is not None and not isinstance(score, bool) else None
    except (TypeError, ValueError):
        number = None
    return scenario, number, values.get("result_validity") == "VALID"


def verify_performance(test: str, reference_detail: Path, test_detail: Path,
                       labels: tuple[str, str] | None = None) -> Verdict:
    rule = COMPLIANCE[test]
    ref_scenario, ref_raw, ref_valid = run_score(reference_detail)
    test_scenario, test_raw, test_valid = run_score(test_detail)
    ref_label, test_label = labels or (str(reference_detail), str(test_detail))
    lines = [f"reference = {ref_label} ({'VALID' if ref_valid else 'INVALID'})",
             f"test = {test_label} ({'VALID' if test_valid else 'INVALID'})", f"scenario = {ref_scenario}"]
    if ref_raw is None or test_raw is None:
        return Verdict(False, lines + ["score missing from a detail log"])
    if ref_scenario != test_scenario:
        return Verdict(False, lines + [f"scenarios differ: {ref_scenario} vs {test_scenario}"])
    unusable = [name for name, raw in (("reference", ref_raw), ("test", test_raw))
                if not (math.isfinite(raw) and raw > 0)]
    if unusable:
        # LoadGen logs 0 when it has no figure, e.g. a latency run too short for early stopping.
        return Verdict(False, lines + [f"reference score = {ref_raw:g}", f"test score = {test_raw:g}",
                                       f"no comparison: the {' and '.join(unusable)} "
                                       f"{'runs have' if len(unusable) > 1 else 'run has'} no positive score "
                                       f"(LoadGen logs 0 when it could not compute the figure)"])
    # TEST04 compares throughput (1e9 / latency for the latency scenarios); TEST01 compares the raw figure.
    as_rate = test == "TEST04" and ref_scenario in LATENCY_SCENARIOS
    ref_score = 1e9 / ref_raw if as_rate else ref_raw
    test_score = 1e9 / test_raw if as_rate else test_raw
    threshold = _threshold(rule, ref_scenario, ref_score)
    lines += [f"reference score = {ref_score:.6g}", f"test score = {test_score:.6g}",
              f"ratio = {test_score / ref_score:.4f}",
              f"threshold = {threshold:.0%}"]
    if test == "TEST04":
        within = test_score < ref_score * (1 + threshold)
        lines.append(f"rule: test score < reference score x {1 + threshold:.2f}")
    else:
        within = ref_score * (1 - threshold) <= test_score <= ref_score * (1 + threshold)
        lines.append(f"rule: test score within ±{threshold:.0%} of reference score")
    if not (ref_valid and test_valid):
        lines.append("a run is INVALID: the comparison does not count")
    return Verdict(within and ref_valid and test_valid, lines)


def _threshold(rule: ComplianceRule, scenario: str, ref_score: float) -> float:
    limit = rule.relaxed_below.get(scenario)
    return rule.relaxed_threshold if limit is not None and ref_score <= limit else rule.threshold


# ---- running ---------------------------------------------------------------------------------

def run_audit(request: Any, test: str, run_dir: Path) -> dict[str, Any]:
    """Run one audit of the performance run in `run_dir` (its own folder, runs/<run id>/) for
    `request` (a RunRequest) and file it there as <test>/. TEST01 compares with that run's accuracy
    log, or, for a performance-only run, with the scenario's chosen accuracy run (its view)."""
    reference_detail = run_dir / "performance" / "run_1" / "mlperf_log_detail.txt"
    reference_accuracy = run_dir / "accuracy" / "mlperf_log_accuracy.json"
    if not reference_accuracy.is_file():
        reference_accuracy = _scenario_root(run_dir) / "accuracy" / "mlperf_log_accuracy.json"
    if not reference_detail.is_file():
        raise UserError(f"{reference_detail}: missing: {test} compares with the performance run; run it first")
    if test == "TEST01" and not reference_accuracy.is_file():
        raise UserError(f"{reference_accuracy}: missing: TEST01 compares with the accuracy run; "
                        f"run --mode accuracy (or submission) first")
    with tempfile.TemporaryDirectory(prefix=f".{test}-", dir=run_dir) as tmp:
        work = Path(tmp)
        audit = work / "audit.config"
        write_text(audit, audit_config_text(test))
        audit_request = dataclasses.replace(
            request, mode="performance", audit_config=audit, results_dir=work / "results",
            command=f"{request.command or 'mlharness run'} [{test} audit]")
        record = _run_audit_test(audit_request, test)
        produced = Path(record.results_path)
        staged = work / test
        perf = produced / "performance" / "run_1"
        for name in ("mlperf_log_summary.txt", "mlperf_log_detail.txt"):
            move_file(perf / name, staged / "performance" / "run_1" / name)
        accuracy: Verdict | None = None
        if test == "TEST01":
            sampled = perf / "mlperf_log_accuracy.json"
            if not sampled.is_file():  # nothing sampled: keep an empty log so the verdict can say so
                write_text(sampled, "[\n]\n")
            move_file(sampled, staged / "accuracy" / "mlperf_log_accuracy.json")
            accuracy = verify_accuracy(reference_accuracy, staged / "accuracy" / "mlperf_log_accuracy.json",
                                       ("accuracy/mlperf_log_accuracy.json", f"{test}/accuracy/mlperf_log_accuracy.json"))
            write_text(staged / "verify_accuracy.txt", accuracy.text())
        performance = verify_performance(test, reference_detail,
                                         staged / "performance" / "run_1" / "mlperf_log_detail.txt",
                                         ("performance/run_1/mlperf_log_detail.txt",
                                          f"{test}/performance/run_1/mlperf_log_detail.txt"))
        write_text(staged / "verify_performance.txt", performance.text())
        _replace_dir(staged, run_dir / test)
    return audit_outcome(record.run_id, performance, accuracy)


def audit_outcome(run_id: str, performance: Verdict, accuracy: Verdict | None) -> dict[str, Any]:
    """What the audited run's record keeps of one audit (its run is dropped): each check's PASS or FAIL,
    the performance comparison's figures, and the verdict, PASS when every check passed."""
    def word(passed: bool) -> str:
        return "PASS" if passed else "FAIL"

    outcome: dict[str, Any] = {"run_id": run_id, "performance": word(performance.passed),
                               "performance_detail": performance.lines[3:]}  # from "reference score = ..."
    if accuracy is not None:
        outcome["accuracy"] = word(accuracy.passed)
    outcome["verdict"] = word(performance.passed and (accuracy is None or accuracy.passed))
    return outcome


def _run_audit_test(request: Any, test: str) -> Any:
    """The audit's LoadGen test in a fresh process (mlharness.running.launcher); its record stays out of the
    results database (the audit outcome is recorded on the run it audits)."""
    from mlharness.running.launcher import LocalLauncher, run_request

    try:
        return run_request(request, LocalLauncher(store=False))
    except UserError as exc:
        raise UserError(f"{test} audit run failed: {exc}") from None


def _replace_dir(staged: Path, target: Path) -> None:
    """Put a finished folder in place of the old one: the old one is moved aside first, then dropped."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)


def _scenario_root(run_dir: Path) -> Path:
    """results/<system>/<model>/<Scenario> of a run folder (runs/<run id>/ inside it)."""
    return run_dir.parent.parent


def run_compliance(request: Any, tests: list[str], run_dir: Path) -> dict[str, Any]:
    """Run each audit of the run in `run_dir` in turn, then record the outcomes on that run."""
    outcomes = {test: run_audit(request, test, run_dir) for test in tests}
    record_outcomes(run_dir, outcomes)
    return outcomes


def record_outcomes(run_dir: Path, outcomes: dict[str, Any],
                    record: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Attach the outcomes to the performance run's record (default: the run.json in `run_dir` when it
    is a performance run): in that run's run.json and in the results database; then the scenario's
    view is rebuilt so it shows the audits of the run it shows. `record` and the result are the
    record's dict, the form a submission session keeps its steps in."""
    from mlharness.records.results import rebuild_view

    run_json = run_dir / "run.json"
    current = RunRecord.load(run_json) if run_json.is_file() else None
    if record is None:
        if not current or current.mode not in ("performance", "submission"):
            return None
        audited = current
    else:
        audited = RunRecord.from_json_dict(dict(record), "the audited run's record")
    audited = dataclasses.replace(audited, compliance=(audited.compliance or {}) | outcomes)
    if current and current.run_id == audited.run_id:
        write_json(run_json, audited.to_dict())
    rebuild_view(_scenario_root(run_dir))
    try:
        from mlharness.store import result_store
    except ImportError:
        return audited.to_dict()
    db = result_store.default_db_path(_scenario_root(run_dir).parent.parent.parent)
    if db.exists():
        with result_store.ResultStore(db) as store:
            store.add_run(audited)
    return audited.to_dict()


def format_outcomes(outcomes: dict[str, Any]) -> str:
    lines = []
    for test, outcome in outcomes.items():
        parts = [f"performance {outcome['performance']}"]
        if "accuracy" in outcome:
            parts.insert(0, f"accuracy {outcome['accuracy']}")
        lines.append(f"  {test} : {outcome['verdict']} ({', '.join(parts)})")
        lines += [f"    {line}" for line in outcome["performance_detail"] if line.startswith(("reference score",
                                                                                               "test score"))]
    return "\n".join(lines)
