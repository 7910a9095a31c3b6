"""`mlharness submission package`: assemble an MLCommons Inference v6.x tree from recorded runs.

The tree is built in a staging folder beside the output and moved into place when complete, so
an interrupted or refused packaging leaves nothing half written. Runs that LoadGen marked INVALID
or that overrode protected settings (durations, seeds, sample counts) are refused unless
allow_invalid, which marks the tree NOT_FOR_SUBMISSION. Records of another kind than a LoadGen
test are left out by the collection (mlharness.submission.runs), their reasons kept in provenance.json."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import UserError
from mlharness.records.loadgen_logs import parse_summary
from mlharness.records.results import VIEW_FILE
from mlharness.records.run_record import RunRecord
from mlharness.running.settings import PROTECTED_KEYS, Settings
from mlharness.submission import accuracy_txt, system_json
from mlharness.submission.layout import SubmitterTree
from mlharness.submission.rules import (
    ALIASES,
    BENCHMARKS,
    COMPLIANCE_FILES,
    DIVISIONS,
    PERFORMANCE_FILES,
)
from mlharness.submission.runs import ScenarioRuns, collect

PROVENANCE_SCHEMA_VERSION = 1
# Where the code that runs lives: a checkout, or the site-packages folder mlharness is installed in.
# The mlharness package that runs: harness/ in a checkout (its folders mapped into the namespace), or
# the installed mlharness/ folder of a wheel.
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_GLOBS = ("harness/**/*.py", "sut/**/*.py", "specs/*.py", "profiling/*.py", "native/**/*.c", "native/**/*.h",
                  "sut/network/*.proto", "scenarios/*.yaml", "pyproject.toml")
# An installed wheel holds no C sources and no pyproject.toml: its Python code and presets go in,
# with a note naming the installed version (INSTALLED_NOTE).
INSTALLED_GLOBS = ("**/*.py", "sut/network/*.proto", "scenarios/*.yaml")
INSTALLED_NOTE = "INSTALLED.txt"


@dataclass
class PackageOptions:
    division: str
    submitter: str
    out: Path
    results_dir: Path = Path("results")
    system: str | None = None            # the system's name in the submission
    results_system: str | None = None    # the system folder in the results tree
    models: list[str] = field(default_factory=list)
    scenarios: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    allow_invalid: bool = False
    system_fields: dict[str, str] = field(default_factory=dict)
    force: bool = False


@dataclass
class PackageResult:
    tree: SubmitterTree
    not_for_submission: list[str]
    undetected_fields: list[str]
    skipped: list[str] = field(default_factory=list)  # records left out (not LoadGen tests), with why


def overridden(record: RunRecord | None) -> list[str]:
    """Protected LoadGen keys a run set itself (any layer above LoadGen's mlperf.conf)."""
    loadgen = record.loadgen_settings if record else {}
    return sorted(k for k in loadgen if k in PROTECTED_KEYS)


def _benchmark_of(record: RunRecord | None) -> str | None:
    """The model manifest's mlperf_benchmark, mapped to the official name."""
    path = record.model_ref.path if record else None
    if not path or not Path(path).is_file():
        return None
    from mlharness.specs.manifests import load_manifest

    name = load_manifest(Path(path), "model").mlperf_benchmark
    name = ALIASES.get(name, name) if name else None
    return name if name in BENCHMARKS else None


def run_problems(runs: ScenarioRuns) -> list[str]:
    """Why these runs are not submission-grade (INVALID, protected overrides); empty when they are."""
    where = runs.path
    problems = []
    summary = where / "performance" / "run_1" / "mlperf_log_summary.txt"
    result = parse_summary(summary).get("result") if summary.is_file() else None
    if result != "VALID":
        problems.append(f"{summary}: LoadGen result is {result or 'missing'}, expected VALID")
    for kind, record in (("performance", runs.performance), ("accuracy", runs.accuracy)):
        keys = overridden(record)
        if keys:
            problems.append(f"{where}: {kind} run {record.run_id} overrode protected settings "
                            f"{', '.join(keys)} (layers: {', '.join(_origins(record, keys))})")
    return problems


def _origins(record: RunRecord, keys: list[str]) -> list[str]:
    return sorted({f"{k}<-{record.setting_origin(k) or '?'}" for k in keys})


def _missing_runs(runs: ScenarioRuns) -> list[str]:
    problems = []
    for name in PERFORMANCE_FILES:
        if not (runs.path / "performance" / "run_1" / name).is_file():
            problems.append(f"{runs.path / 'performance' / 'run_1' / name}: missing: no performance run to package")
    if not (runs.path / "accuracy" / "mlperf_log_accuracy.json").is_file():
        why = _view_note(runs.path)
        problems.append(f"{runs.path / 'accuracy'}: missing: " + (why or "no accuracy run to package "
                                                                          "(mlharness run ... --mode accuracy)"))
    return problems


def _view_note(scenario_dir: Path) -> str | None:
    """Why the view left an accuracy run out (view.json's note), when it did."""
    try:
        view = json.loads((scenario_dir / VIEW_FILE).read_text())
    except (OSError, ValueError):
        return None
    note = view.get("note") if isinstance(view, dict) else None
    return note if isinstance(note, str) and note.startswith("no accuracy/") else None


def package(options: PackageOptions) -> PackageResult:
    if options.division not in DIVISIONS:
        raise UserError(f"--division: expected one of {', '.join(DIVISIONS)}, got {options.division!r}")
    if not options.submitter or "/" in options.submitter:
        raise UserError(f"--submitter: expected a folder name, got {options.submitter!r}")
    chosen = collect(Path(options.results_dir), system=options.results_system, models=options.models or None,
                     scenarios=options.scenarios or None, pinned=options.runs)
    hard = [p for runs in chosen for p in _missing_runs(runs)]
    if hard:
        raise UserError(f"{len(hard)} problem(s); first: {hard[0]}" if len(hard) > 1 else hard[0])
    soft = [p for runs in chosen for p in run_problems(runs)]
    if soft and not options.allow_invalid:
        raise UserError(f"refusing to package runs that are not submission-grade ({len(soft)} problem(s)); "
                        f"first: {soft[0]}; pass --allow-invalid to package them marked NOT_FOR_SUBMISSION")
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    final = SubmitterTree(out, options.division, options.submitter)
    if final.base.exists() and not options.force:
        raise UserError(f"{final.base}: already exists; pass --force to replace it")
    staging_root = out / f".staging-{secrets.token_hex(4)}"
    try:
        staged = SubmitterTree(staging_root, options.division, options.submitter)
        undetected = _build(staged, chosen, options, soft)
        _move_into_place(staged, final)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    return PackageResult(final, soft, undetected, [reason for runs in chosen for reason in runs.skipped])


def _build(tree: SubmitterTree, chosen: list[ScenarioRuns], options: PackageOptions, soft: list[str]) -> list[str]:
    system = options.system or chosen[0].system
    mapping: dict[str, str] = {}
    entries = []
    for runs in chosen:
        benchmark = _benchmark_of(runs.performance or runs.accuracy)
        if options.division == "closed":
            if not benchmark:
                raise UserError(f"{runs.path}: model {runs.model!r} names no known mlperf_benchmark; the closed "
                                f"division needs one of {', '.join(BENCHMARKS)}")
            folder = benchmark
        else:
            folder = runs.model
            if benchmark:
                mapping[runs.model] = benchmark
        dest = tree.scenario(system, folder, runs.scenario)
        _copy_scenario(runs, dest, tree.full_accuracy_log(system, folder, runs.scenario))
        entries.append(_provenance_entry(runs, benchmark, dest.relative_to(tree.base)))
    records = [r for runs in chosen for r in (runs.performance, runs.accuracy) if r]
    desc = system_json.describe(
        division=options.division, submitter=options.submitter, system_name=system,
        detected=records[0].system_description if records else {},
        software=records[0].software_versions if records else {},
        backends=[r.backend for r in records],
        hardware_refs=[r.hardware_ref.label for r in records],
        fields=options.system_fields)
    write_json(tree.system_json(system), desc)
    if options.division == "open" and mapping:
        write_json(tree.model_mapping, mapping)
    _copy_sources(tree, records)
    write_json(tree.provenance, {
        "schema_version": PROVENANCE_SCHEMA_VERSION, "tool": "mlharness", "division": options.division,
        "submitter": options.submitter, "system": system, "not_for_submission": bool(soft),
        "reasons": soft, "entries": entries, "skipped": [r for runs in chosen for r in runs.skipped]})
    if soft:
        write_text(tree.marker, "NOT FOR SUBMISSION: packaged with --allow-invalid from runs that are not "
                                "submission-grade:\n" + "\n".join(f"- {p}" for p in soft) + "\n")
    return system_json.undetected(desc)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _copy_scenario(runs: ScenarioRuns, dest: Path, full_log: Path) -> None:
    src = runs.path
    for name in PERFORMANCE_FILES:
        _copy(src / "performance" / "run_1" / name, dest / "performance" / "run_1" / name)
    # The accuracy run's own logs (runs/<id>/accuracy): the scenario's view holds the latest accuracy
    # run's, which is another run's when an older one was pinned with --run.
    own = src / "runs" / runs.accuracy.run_id / "accuracy" if runs.accuracy is not None else None
    accuracy = own if own is not None and own.is_dir() else src / "accuracy"
    for name in ("mlperf_log_summary.txt", "mlperf_log_detail.txt"):
        _copy(accuracy / name, dest / "accuracy" / name)
    accuracy_txt.write_packaged_accuracy(accuracy, dest / "accuracy", full_log)
    _copy(src / "measurements.json", dest / "measurements.json")
    write_text(dest / "user.conf", _user_conf(runs))
    write_text(dest / "README.md", _readme(runs))
    for test, files in COMPLIANCE_FILES.items():
        if (src / test).is_dir():
            for name in files:
                if (src / test / name).is_file():
                    _copy(src / test / name, dest / test / name)


def _user_conf(runs: ScenarioRuns) -> str:
    """The user.conf the performance run applied (rebuilt from its record), else the tree's copy."""
    settings = runs.performance.settings if runs.performance else None
    if settings and "conf_model" in settings:
        return Settings(scenario=settings["scenario"], mode=settings.get("mode", "performance"),
                        conf_model=settings["conf_model"], loadgen=dict(settings.get("loadgen") or {}),
                        layers=list(settings.get("layers") or [])[1:]).user_conf_text()
    return (runs.path / "user.conf").read_text()


def _readme(runs: ScenarioRuns) -> str:
    perf, acc = runs.performance, runs.accuracy
    model = (perf and perf.model) or (acc and acc.model) or {"name": runs.model}
    lines = [f"# {model.get('name')} {model.get('version', '')} — {runs.scenario}", ""]
    lines += [f"Measured with mlharness on {(perf and perf.system_name) or runs.system}; backend "
              f"{(perf and perf.backend) or (acc.backend if acc else '?')}; model manifest sha256 "
              f"{model.get('sha256', '?')}.", ""]
    for title, record in (("Performance", perf), ("Accuracy", acc)):
        if record:
            lines += [f"## {title} (run {record.run_id}, {record.started_at or ''})", "",
                      "Reproduce with:", "", "```", record.command or "(command not recorded)", "```", ""]
    if runs.compliance:
        lines += ["## Compliance", ""]
        command = (perf and perf.command) or "mlharness run ..."
        tests = ",".join(runs.compliance)
        lines += [f"- {test}: {o.get('verdict')} (audit run {o.get('run_id')})" for test, o in runs.compliance.items()]
        lines += ["", "Reproduce with:", "", "```",
                  command if "--compliance" in command else f"{command} --compliance {tests}", "```", ""]
    versions = (perf or acc).software_versions if (perf or acc) else {}
    if versions:
        lines += ["## Software", ""] + [f"- {k} {v}" for k, v in sorted(versions.items())] + [""]
    return "\n".join(lines)


def _provenance_entry(runs: ScenarioRuns, benchmark: str | None, where: Path) -> dict[str, Any]:
    def run_info(record: RunRecord | None) -> dict[str, Any] | None:
        if not record:
            return None
        return {"run_id": record.run_id, "mode": record.mode, "status": record.status,
                "command": record.command, "result": record.loadgen_result,
                "overridden_protected": overridden(record), "settings_origin": record.setting_origins}
    return {"folder": str(where), "model": runs.model, "benchmark": benchmark, "scenario": runs.scenario,
            "source": str(runs.path), "performance": run_info(runs.performance),
            "accuracy": run_info(runs.accuracy), "compliance": runs.compliance}


def _copy_code(dest: Path) -> None:
    """The harness code that ran into `dest`: a checkout's sources (its layout), or the installed package's."""
    checkout = PACKAGE_ROOT.name != "mlharness" and (PACKAGE_ROOT.parent / "pyproject.toml").is_file()
    root = PACKAGE_ROOT.parent if checkout else PACKAGE_ROOT
    for pattern in CHECKOUT_GLOBS if checkout else INSTALLED_GLOBS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                _copy(path, dest / path.relative_to(root))
    if not checkout:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = f"mlharness {version('mlharness')}"
        except PackageNotFoundError:
            installed = "mlharness (version unknown: no distribution metadata)"
        write_text(dest / INSTALLED_NOTE, f"{installed}, installed in {root}: its Python code and scenario presets "
                                          f"as installed. The C extension mlharness.sut._native ran as built; its C sources "
                                          f"are in the mlharness source tree, not in the installed package.\n")


def _copy_sources(tree: SubmitterTree, records: list[RunRecord]) -> None:
    """src/: the harness code that ran and every manifest the runs named (with their hashes)."""
    _copy_code(tree.src / "mlharness")
    manifests: dict[str, dict[str, Any]] = {}
    for record in records:
        for kind, ref in record.manifest_refs():
            if not ref.path or not Path(ref.path).is_file():
                continue
            path = Path(ref.path)
            target = tree.src / "specs" / kind / path.name
            _copy(path, target)
            now = hashlib.sha256(path.read_bytes()).hexdigest()
            manifests[str(target.relative_to(tree.src))] = {
                "name": ref.name, "version": ref.version, "sha256_at_run": ref.sha256,
                "sha256_now": now, "changed_since_run": bool(ref.sha256) and now != ref.sha256}
    write_json(tree.src / "manifests.json", manifests)


def _move_into_place(staged: SubmitterTree, final: SubmitterTree) -> None:
    final.base.parent.mkdir(parents=True, exist_ok=True)
    old = final.base.with_name(f".{final.base.name}.old-{secrets.token_hex(3)}")
    if final.base.exists():
        os.replace(final.base, old)
    os.replace(staged.base, final.base)
    shutil.rmtree(old, ignore_errors=True)
    logs = staged.root / "full_accuracy_logs"
    if logs.is_dir():
        for src in sorted(p for p in logs.rglob("*") if p.is_file()):
            target = final.root / "full_accuracy_logs" / src.relative_to(logs)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, target)
