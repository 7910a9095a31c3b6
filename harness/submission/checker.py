"""`mlharness submission check`: our pre-flight check of a submission tree against the official
v6.x checker's rules (see rules.py), plus what the official checker lets through in the open
division: runs LoadGen marked INVALID and runs that overrode protected settings. One Problem per
finding; a run problem ("kind" run) is waived only on a tree marked NOT_FOR_SUBMISSION when the
caller allows it."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlharness.records.loadgen_logs import detail_problems, detail_values
from mlharness.submission import accuracy_txt
from mlharness.submission.layout import SubmitterTree, find_trees
from mlharness.submission.rules import (
    ACCURACY_FILES,
    ACCURACY_PATTERNS,
    BENCHMARKS,
    COMPLIANCE_FILES,
    COMPLIANCE_TOLERATED_ERRORS,
    EARLY_STOPPING_SCENARIOS,
    MAX_ACCURACY_LOG_SIZE,
    MEASUREMENTS_FIELDS,
    MIN_DURATION_MS,
    MIN_QUERIES,
    PERFORMANCE_FILES,
    SCENARIO_FILES,
    SCENARIOS,
    SEEDS,
    SYSTEM_FIELDS,
    SYSTEM_INTEGER_FIELDS,
    SYSTEM_MEANINGFUL_FIELDS,
    SYSTEM_STATUS,
    SYSTEM_TYPES,
    Benchmark,
    benchmark_for,
    required_scenarios,
)
from mlharness.specs.artifacts import sha256_file

KINDS = ("tree", "system", "run", "scenarios", "accuracy", "dataset", "compliance")
# Why a waived problem does not count, by kind.
WAIVERS = {"run": "not for submission", "dataset": "--skip-dataset-size-check"}


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    kind: str = "tree"

    def line(self, base: Path | None = None) -> str:
        where = self.path
        if base is not None:
            try:
                where = self.path.relative_to(base)
            except ValueError:
                pass
        return f"{where}: {self.message}"


@dataclass
class Report:
    problems: list[Problem]
    waived: list[Problem]
    trees: list[SubmitterTree]

    @property
    def ok(self) -> bool:
        return not self.problems


def check(root: Path, allow_invalid: bool = False, skip_dataset_size_check: bool = False) -> Report:
    """Every problem in the trees under root. allow_invalid waives run problems in trees marked
    NOT_FOR_SUBMISSION; skip_dataset_size_check waives accuracy runs on part of the dataset, as the
    official checker's flag of that name does."""
    problems: list[Problem] = []
    trees = find_trees(Path(root))
    for tree in trees:
        problems += check_tree(tree)
    waived: list[Problem] = []
    if allow_invalid:
        marked = {t.base for t in trees if t.marker.is_file()}
        waived = [p for p in problems if p.kind == "run" and any(_under(p.path, b) for b in marked)]
        problems = [p for p in problems if p not in waived]
        problems += [Problem(t.base, "--allow-invalid: tree is not marked NOT_FOR_SUBMISSION; its run problems "
                                     "still count", "tree") for t in trees if t.base not in marked]
    if skip_dataset_size_check:
        waived += [p for p in problems if p.kind == "dataset"]
        problems = [p for p in problems if p.kind != "dataset"]
    return Report(problems, waived, trees)


def _under(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def _read_json(path: Path, problems: list[Problem], what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError:
        problems.append(Problem(path, f"missing: expected {what}"))
    except json.JSONDecodeError as exc:
        problems.append(Problem(path, f"not valid JSON (line {exc.lineno}: {exc.msg}): expected {what}"))
    return None


def _nonempty_file(path: Path, problems: list[Problem], kind: str = "tree") -> bool:
    if not path.is_file():
        problems.append(Problem(path, "missing: required file", kind))
        return False
    if path.stat().st_size == 0:
        problems.append(Problem(path, "empty: required file must have content", kind))
        return False
    return True


def check_tree(tree: SubmitterTree) -> list[Problem]:
    problems: list[Problem] = []
    if not tree.src.is_dir():
        problems.append(Problem(tree.src, "missing: src/ must hold the code that ran"))
    if not tree.systems.is_dir():
        problems.append(Problem(tree.systems, "missing: systems/ must hold <system>.json per system"))
    mapping = _model_mapping(tree, problems)
    if not tree.results.is_dir():
        problems.append(Problem(tree.results, "missing: results/ holds the runs"))
        return problems
    provenance = _provenance(tree)
    for system_dir in sorted(p for p in tree.results.iterdir() if p.is_dir()):
        system = _check_system_json(tree, system_dir.name, problems)
        for bench_dir in sorted(p for p in system_dir.iterdir() if p.is_dir()):
            benchmark = benchmark_for(bench_dir.name, mapping)
            if benchmark is None:
                problems.append(Problem(bench_dir, f"unknown benchmark folder {bench_dir.name!r}: expected one of "
                                                   f"{', '.join(BENCHMARKS)}, an alias, or a model_mapping.json entry"))
                continue
            if tree.division == "closed" and bench_dir.name != benchmark.name:
                problems.append(Problem(bench_dir, f"closed division: the folder must be the official name "
                                                   f"{benchmark.name!r}"))
            present = []
            for scenario_dir in sorted(p for p in bench_dir.iterdir() if p.is_dir()):
                if scenario_dir.name not in SCENARIOS:
                    problems.append(Problem(scenario_dir, f"unknown scenario: expected one of {', '.join(SCENARIOS)}"))
                    continue
                present.append(scenario_dir.name)
                problems += check_scenario(tree, scenario_dir, benchmark, provenance)
            if tree.division == "closed" and system is not None:
                system_type = str(system.get("system_type", ""))
                missing = [s for s in required_scenarios(benchmark, system_type) if s not in present]
                if missing:
                    systems = f"{system_type} systems" if system_type else \
                        "systems without a system_type (edge and datacenter together)"
                    problems.append(Problem(bench_dir, f"closed division: {systems} need scenarios "
                                                       f"{', '.join(missing)} for {benchmark.name}", "scenarios"))
    return problems


def _model_mapping(tree: SubmitterTree, problems: list[Problem]) -> dict[str, str]:
    if not tree.model_mapping.is_file():
        return {}
    data = _read_json(tree.model_mapping, problems, "a JSON object: folder name -> benchmark")
    if not isinstance(data, dict):
        if data is not None:
            problems.append(Problem(tree.model_mapping, "expected a JSON object: folder name -> benchmark"))
        return {}
    if tree.division == "closed":
        problems.append(Problem(tree.model_mapping, "closed division: model_mapping.json is for the open division"))
    for folder, bench in data.items():
        if not isinstance(bench, str) or benchmark_for(bench) is None:
            problems.append(Problem(tree.model_mapping, f"{folder}: maps to {bench!r}, expected one of "
                                                        f"{', '.join(BENCHMARKS)}"))
    return {str(k): str(v) for k, v in data.items()}


def _check_system_json(tree: SubmitterTree, system: str, problems: list[Problem]) -> dict[str, Any] | None:
    path = tree.system_json(system)
    data = _read_json(path, problems, "the system description (35 fields)")
    if not isinstance(data, dict):
        if data is not None:
            problems.append(Problem(path, "expected a JSON object", "system"))
        return None
    for key in SYSTEM_FIELDS:
        if key not in data:
            problems.append(Problem(path, f"{key}: missing field", "system"))
    for key in SYSTEM_MEANINGFUL_FIELDS:
        value = data.get(key)
        if key in data and (not isinstance(value, str) or not value.strip()):
            problems.append(Problem(path, f"{key}: expected a non-empty string (write \"0\", not 0), "
                                          f"got {value!r}", "system"))
    for key in SYSTEM_INTEGER_FIELDS:
        if key in data:
            try:
                int(str(data[key]).strip())
            except ValueError:
                problems.append(Problem(path, f"{key}: expected a count that parses as an integer, "
                                              f"got {data[key]!r}", "system"))
    if data.get("division") != tree.division:
        problems.append(Problem(path, f"division: {data.get('division')!r} does not match the folder "
                                      f"{tree.division!r}", "system"))
    if data.get("submitter") != tree.submitter:
        problems.append(Problem(path, f"submitter: {data.get('submitter')!r} does not match the folder "
                                      f"{tree.submitter!r}", "system"))
    if "status" in data and str(data["status"]).lower() not in SYSTEM_STATUS:
        problems.append(Problem(path, f"status: expected one of {', '.join(SYSTEM_STATUS)}, got {data['status']!r}",
                                "system"))
    if "system_type" in data and data["system_type"] not in SYSTEM_TYPES:
        problems.append(Problem(path, f"system_type: expected one of {', '.join(SYSTEM_TYPES)}, "
                                      f"got {data['system_type']!r}", "system"))
    return data


def _provenance(tree: SubmitterTree) -> dict[str, dict[str, Any]]:
    """Packaged runs by results folder, from src/mlharness_runs.json (absent for trees made elsewhere)."""
    try:
        data = json.loads(tree.provenance.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return {entry["folder"]: entry for entry in entries or [] if isinstance(entry, dict) and "folder" in entry}


def check_scenario(tree: SubmitterTree, where: Path, benchmark: Benchmark,
                   provenance: dict[str, dict[str, Any]]) -> list[Problem]:
    problems: list[Problem] = []
    for name in SCENARIO_FILES:
        _nonempty_file(where / name, problems)
    measurements = where / "measurements.json"
    if measurements.is_file():
        data = _read_json(measurements, problems, "measurements.json fields")
        if isinstance(data, dict):
            for key in MEASUREMENTS_FIELDS:
                if not str(data.get(key, "")).strip():
                    problems.append(Problem(measurements, f"{key}: expected a non-empty value"))
    perf_dir = where / "performance" / "run_1"
    if all(_nonempty_file(perf_dir / name, problems) for name in PERFORMANCE_FILES):
        extra = sorted(p.name for p in perf_dir.iterdir() if p.name not in PERFORMANCE_FILES
                       and p.name != "mlperf_log_accuracy.json")
        if extra:
            problems.append(Problem(perf_dir, f"unexpected files {', '.join(extra)} (the checker compares the list)"))
        problems += check_performance_log(perf_dir / "mlperf_log_detail.txt", where.name, benchmark, tree.division)
    acc_dir = where / "accuracy"
    if all([_nonempty_file(acc_dir / name, problems) for name in ACCURACY_FILES]):
        problems += check_accuracy(tree, acc_dir, benchmark)
    if tree.division == "closed":
        for test in benchmark.compliance_tests:
            problems += check_compliance(where / test, test, where.name, benchmark)
    entry = provenance.get(str(where.relative_to(tree.base)))
    for kind in ("performance", "accuracy"):
        # provenance.json as found in the submission tree (edited or not): free-form JSON, read defensively.
        info = (entry or {}).get(kind) or {}
        if info.get("overridden_protected"):
            problems.append(Problem(where, f"{kind} run {info.get('run_id')} overrode protected settings "
                                           f"{', '.join(info['overridden_protected'])}", "run"))
    return problems


def check_performance_log(detail: Path, scenario: str, benchmark: Benchmark, division: str = "open",
                          compliance: bool = False) -> list[Problem]:
    keys = ("result_validity", "effective_scenario", "effective_min_duration_ms", "effective_performance_sample_count",
            "effective_min_query_count", "effective_samples_per_query", "early_stopping_met",
            *(f"effective_{k}" for k in SEEDS))
    values = detail_values(detail, keys)
    problems: list[Problem] = []
    errors = [e for e in detail_problems(detail)["errors"]
              if not (compliance and any(t in e for t in COMPLIANCE_TOLERATED_ERRORS))]
    for error in errors:
        problems.append(Problem(detail, f"LoadGen error: {error[:200]}", "run"))
    if values.get("result_validity") != "VALID":
        problems.append(Problem(detail, f"LoadGen marked the run {values.get('result_validity', 'unknown')}, "
                                        f"expected VALID", "run"))
    if values.get("effective_scenario") not in (None, scenario):
        problems.append(Problem(detail, f"log is for scenario {values.get('effective_scenario')}, "
                                        f"folder says {scenario}"))
    for key, expected in SEEDS.items():
        found = values.get(f"effective_{key}")
        if found != expected:
            problems.append(Problem(detail, f"{key}: expected LoadGen's mlperf.conf seed {expected}, found {found}",
                                    "run"))
    count = values.get("effective_performance_sample_count")
    if not isinstance(count, int) or count < benchmark.performance_sample_count:
        problems.append(Problem(detail, f"performance_sample_count: expected >= {benchmark.performance_sample_count} "
                                        f"for {benchmark.name}, found {count}", "run"))
    duration = values.get("effective_min_duration_ms")
    if not isinstance(duration, int) or duration < MIN_DURATION_MS:
        problems.append(Problem(detail, f"min_duration: expected >= {MIN_DURATION_MS} ms, found {duration}", "run"))
    if scenario in EARLY_STOPPING_SCENARIOS and values.get("early_stopping_met") is not True:
        problems.append(Problem(detail, f"{scenario}: early stopping condition not met", "run"))
    if scenario in MIN_QUERIES and (values.get("effective_min_query_count") or 0) < MIN_QUERIES[scenario]:
        problems.append(Problem(detail, f"min_query_count: expected >= {MIN_QUERIES[scenario]}", "run"))
    # The official checker reads samples_per_query, not min_query_count, for this floor: LoadGen folds an
    # Offline min_query_count into the one query's size and logs effective_min_query_count as 1.
    spq = values.get("effective_samples_per_query")
    if (division == "closed" and scenario == "Offline" and not compliance and benchmark.offline_min_samples_per_query
            and (not isinstance(spq, int) or spq < benchmark.offline_min_samples_per_query)):
        problems.append(Problem(detail, f"closed division: Offline samples_per_query: expected >= "
                                        f"{benchmark.offline_min_samples_per_query} for {benchmark.name}, found {spq}",
                                "run"))
    return problems


def accuracy_value(accuracy_file: Path, benchmark: Benchmark) -> float | None:
    pattern = ACCURACY_PATTERNS.get(benchmark.accuracy_metric)
    for line in accuracy_file.read_text(errors="replace").splitlines():
        match = re.match(pattern, line) if pattern else None
        if match:
            try:
                return float(match.group(1))
            except ValueError:
                return None
    return None


def check_accuracy(tree: SubmitterTree, acc_dir: Path, benchmark: Benchmark) -> list[Problem]:
    problems: list[Problem] = []
    acc_txt, acc_log = acc_dir / "accuracy.txt", acc_dir / "mlperf_log_accuracy.json"
    value = accuracy_value(acc_txt, benchmark)
    if value is None:
        problems.append(Problem(acc_txt, f"no {benchmark.accuracy_metric} line in the official format "
                                         f"(e.g. 'accuracy=76.500%, good=38250, total=50000')"))
    elif tree.division == "closed" and value < benchmark.accuracy_target:
        problems.append(Problem(acc_txt, f"closed division: accuracy {value:g} is below {benchmark.name}'s target "
                                         f"{benchmark.accuracy_target:.3f} (99% of the reference)", "accuracy"))
    recorded = accuracy_txt.read_hash(acc_txt)
    if recorded is None:
        problems.append(Problem(acc_txt, "no 'hash=<sha256 of the accuracy log>' line"))
    size = acc_log.stat().st_size
    if size > MAX_ACCURACY_LOG_SIZE:
        problems.append(Problem(acc_log, f"not truncated: {size} bytes, the checker allows {MAX_ACCURACY_LOG_SIZE}"))
    if recorded is not None:
        system, bench, scenario = acc_dir.parent.parent.parent.name, acc_dir.parent.parent.name, acc_dir.parent.name
        full = tree.full_accuracy_log(system, bench, scenario)
        source = full if full.is_file() else (acc_log if size <= MAX_ACCURACY_LOG_SIZE else None)
        if source is not None and sha256_file(source) != recorded:
            problems.append(Problem(acc_txt, f"hash does not match the full accuracy log {source.name}"))
    acc_detail = acc_dir / "mlperf_log_detail.txt"
    for error in detail_problems(acc_detail)["errors"]:
        problems.append(Problem(acc_detail, f"LoadGen error: {error[:200]}", "run"))
    # The official checker applies this in both divisions unless run with --skip-dataset-size-check.
    covered = detail_values(acc_detail, ("qsl_reported_total_count",)).get("qsl_reported_total_count")
    if benchmark.dataset_size and covered != benchmark.dataset_size:
        problems.append(Problem(acc_detail, f"accuracy run covers {covered} of {benchmark.name}'s "
                                            f"{benchmark.dataset_size} dataset samples (qsl_reported_total_count; "
                                            f"--skip-dataset-size-check waives this, as in the official checker)",
                                "dataset"))
    return problems


def check_compliance(test_dir: Path, test: str, scenario: str, benchmark: Benchmark) -> list[Problem]:
    if not test_dir.is_dir():
        return [Problem(test_dir, f"missing: closed division needs {test} for {benchmark.name}", "compliance")]
    problems: list[Problem] = []
    for name in COMPLIANCE_FILES[test]:
        _nonempty_file(test_dir / name, problems, "compliance")
    for name in ("verify_accuracy.txt", "verify_performance.txt"):
        path = test_dir / name
        if name in COMPLIANCE_FILES[test] and path.is_file() and "TEST PASS" not in path.read_text(errors="replace"):
            problems.append(Problem(path, f"{test} did not pass (no 'TEST PASS' line)", "compliance"))
    detail = test_dir / "performance" / "run_1" / "mlperf_log_detail.txt"
    if detail.is_file():
        problems += check_performance_log(detail, scenario, benchmark, compliance=True)
    return problems
