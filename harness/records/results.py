"""The results tree. Each run's files are its own: a run is staged in a hidden folder and, when it
succeeds, renamed whole into `<system>/<model>/<Scenario>/runs/<run id>/` (a failed run becomes
`failed-<run id>/`); no later run touches either. The MLPerf-shaped view of the scenario folder
(`performance/`, `accuracy/`, `TEST0x/`, `run.json`, `user.conf`, ... directly under
`<Scenario>/`) is rebuilt from chosen runs — the latest ok performance run and the latest ok
accuracy run — by hard links, under a lock, each entry swapped in by a rename; it is never a mix
of two runs' files within an entry, and a later run without profiling leaves no stale profile.

A submission's accuracy/ and performance/ are two LoadGen tests, and MLPerf asks that both be run
on the same system and software configuration; the view pairs them only then. The accuracy/ of an
accuracy run other than the performance run shown is kept only when the two runs agree on
everything that decides what the model computes (`SAME_CONFIGURATION`); otherwise the view has no
accuracy/ (rerun accuracy with this configuration). `view.json` says which run each part comes
from and why an accuracy run was left out."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord

RESULTS_SCHEMA_VERSION = 1
RUNS_FOLDER = "runs"
PERF_MODES = ("performance", "submission", "find-peak")
ACCURACY_MODES = ("accuracy", "submission")
# What lives in a scenario folder besides the view: the runs, failed runs, the session's steps file.
_NOT_VIEW = (RUNS_FOLDER, "submission_steps.json")
LOADGEN_LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json", "mlperf_log_trace.json")
VIEW_FILE = "view.json"
VIEW_SCHEMA_VERSION = 1
# What two runs must share for one's accuracy/ to stand beside the other's performance/: the system,
# the manifests (by content), the backend, the software and the harness settings (batching, threads,
# dataset_limit, ...). LoadGen's settings may differ: they decide how queries are issued, not answered.
SAME_CONFIGURATION: dict[str, tuple[str, ...]] = {
    "system": ("system_name",), "hardware": ("hardware", "sha256"), "device": ("hardware", "device"),
    "model": ("model", "sha256"), "dataset": ("dataset", "sha256"), "backend": ("backend",),
    "software": ("software", "versions"), "harness settings": ("settings", "harness")}


@dataclass(frozen=True)
class ScenarioDir:
    root: Path  # results/<system>/<model>/<Scenario>
    run_id: str

    @property
    def staging(self) -> Path:
        return self.root / f".staging-{self.run_id}"

    def stage(self, *parts: str) -> Path:
        path = self.staging.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def run_dir(self) -> Path:
        """Where this run's own files live once it succeeded."""
        return self.root / RUNS_FOLDER / self.run_id

    def publish(self) -> Path:
        """Rename the staged run whole into runs/<run id>/, then rebuild the scenario's view."""
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.staging, self.run_dir)
        rebuild_view(self.root)
        return self.run_dir

    def keep_failed(self) -> Path:
        target = self.root / f"failed-{self.run_id}"
        if self.staging.exists():
            os.replace(self.staging, target)
        else:
            target.mkdir(parents=True, exist_ok=True)
        return target


def _ok_runs(scenario_root: Path) -> list[tuple[RunRecord, Path]]:
    """The scenario's ok runs, oldest first, each read and checked as RunRecord.load reads it."""
    found = []
    for run_json in (scenario_root / RUNS_FOLDER).glob("*/run.json"):
        try:
            record = RunRecord.load(run_json)
        except UserError:
            continue  # a damaged or newer-schema record cannot be chosen; its folder stays as it is
        if record.status == "ok":
            found.append((record, run_json.parent))
    return sorted(found, key=lambda item: (item[0].started_at or "", item[0].run_id or ""))


def _link_tree(src: Path, dst: Path) -> None:
    """dst mirrors src by hard links (no copy; files are replaced, never edited, so sharing is safe)."""
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for child in src.iterdir():
            _link_tree(child, dst / child.name)
    else:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _swap_in(src: Path, dst: Path, trash: Path) -> None:
    if dst.is_dir() and not dst.is_symlink():
        os.replace(dst, trash / dst.name)
    os.replace(src, dst)  # a file over a file is one atomic rename


def _is_view_entry(name: str) -> bool:
    return not (name.startswith((".", "failed-")) or name in _NOT_VIEW)


def _configuration(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def configuration_differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """What of SAME_CONFIGURATION two run records disagree on (empty: one configuration)."""
    return [name for name, path in SAME_CONFIGURATION.items()
            if _configuration(first, path) != _configuration(second, path)]


def _view_sources(main: dict[str, Any], accuracy: dict[str, Any] | None) -> tuple[bool, dict[str, Any]]:
    """(whether the accuracy run's accuracy/ goes into the view, the view.json that says so)."""
    view = {"schema_version": VIEW_SCHEMA_VERSION, "run_id": main.get("run_id"), "accuracy_run_id": None,
            "note": None}
    if accuracy is None:
        return False, view
    if accuracy.get("run_id") == main.get("run_id"):
        return True, view | {"accuracy_run_id": main.get("run_id")}
    differences = configuration_differences(main, accuracy)
    if differences:
        return False, view | {"note": f"no accuracy/: the newest accuracy run {accuracy.get('run_id')} differs from "
                                      f"run {main.get('run_id')} in {', '.join(differences)}; run --mode accuracy "
                                      f"with this run's configuration"}
    return True, view | {"accuracy_run_id": accuracy.get("run_id"),
                         "note": f"accuracy/ is run {accuracy.get('run_id')}'s, an accuracy run of the same "
                                 f"configuration ({', '.join(SAME_CONFIGURATION)}); the rest is run "
                                 f"{main.get('run_id')}'s"}


def rebuild_view(scenario_root: Path) -> None:
    """Rebuild the MLPerf-shaped view of a scenario folder from its runs: everything of the latest ok
    performance run (its logs, audits, profile, record) and the accuracy/ of the latest ok accuracy
    run when it is that run or one of the same configuration, and view.json naming them. Builders take
    turns (a lock file); each entry is swapped in by a rename."""
    import fcntl

    scenario_root.mkdir(parents=True, exist_ok=True)
    with open(scenario_root / ".publish.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = _ok_runs(scenario_root)
        perf = next(((r, d) for r, d in reversed(runs) if r.mode in PERF_MODES), None)
        accuracy = next(((r, d) for r, d in reversed(runs) if r.mode in ACCURACY_MODES), None)
        main = perf or accuracy
        if main is None:
            return
        paired, view = _view_sources(main[0].to_dict(), accuracy[0].to_dict() if accuracy else None)
        build = scenario_root / f".view-{os.getpid()}"
        trash = scenario_root / f".view-old-{os.getpid()}"
        for folder in (build, trash):
            shutil.rmtree(folder, ignore_errors=True)
        build.mkdir()
        trash.mkdir()
        for entry in main[1].iterdir():
            if entry.name != "accuracy":
                _link_tree(entry, build / entry.name)
        if paired and (accuracy[1] / "accuracy").is_dir():
            _link_tree(accuracy[1] / "accuracy", build / "accuracy")
        write_json(build / VIEW_FILE, view)
        new = {p.name for p in build.iterdir()}
        for name in sorted(new):
            _swap_in(build / name, scenario_root / name, trash)
        for old in scenario_root.iterdir():
            if not _is_view_entry(old.name) or old.name in new:
                continue
            if old.is_dir():
                os.replace(old, trash / old.name)  # an entry the chosen runs no longer have (a profile)
            else:
                old.unlink()
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(trash, ignore_errors=True)


def scenario_dir(results_dir: Path, system: str, model: str, scenario: str, run_id: str) -> ScenarioDir:
    return ScenarioDir(results_dir / system / model / scenario, run_id)


def prune_loadgen_logs(dest: Path, drop_empty_accuracy: bool) -> list[str]:
    """Drop the empty logs LoadGen wrote into `dest` (the trace, and the accuracy log outside accuracy
    mode); returns the names kept."""
    kept = []
    for name in LOADGEN_LOGS:
        src = dest / name
        if not src.is_file():
            continue
        empty = src.stat().st_size == 0 or (name == "mlperf_log_accuracy.json" and src.read_text().strip() in ("", "[]", "[\n]"))
        if (name == "mlperf_log_trace.json" or (name == "mlperf_log_accuracy.json" and drop_empty_accuracy)) and empty:
            src.unlink()
            continue
        kept.append(name)
    return kept


def measurements(model: Any, backend: str) -> dict[str, Any]:
    """measurements.json: the submission checker's fields, from the model manifest's attributes."""
    attrs = model.attributes.get("measurements", {})
    weights = model.sources.get("weights") or model.sources.get("graph") or model.sources.get("torchscript")
    input_types = sorted({spec.element_type for spec in model.inputs}) or ["none"]
    return {
        "input_data_types": attrs.get("input_data_types", ",".join(input_types)),
        "retraining": attrs.get("retraining", "no"),
        "starting_weights_filename": attrs.get("starting_weights_filename",
                                               Path(weights.uri).name if weights else f"{model.name} (no weights)"),
        "weight_data_types": attrs.get("weight_data_types", "fp32"),
        "weight_transformations": attrs.get("weight_transformations",
                                            ", ".join(model.graph_transforms) or "none"),
        "framework": backend,
        "model": model.ref,
        "model_sha256": model.sha256,
    }


def readme(model: Any, scenario: str, command: str) -> str:
    return (f"# {model.name} — {scenario}\n\n"
            f"{model.description.strip() or model.name}\n\n"
            f"Reproduce with:\n\n```\n{command}\n```\n")


def write_system_json(results_dir: Path, system_name: str, system: dict[str, Any], hardware: Any,
                      software: dict[str, str]) -> Path:
    return write_json(results_dir / f"{system_name}.json", {
        "schema_version": RESULTS_SCHEMA_VERSION, "system_name": system_name, "detected": system,
        "hardware_manifest": hardware.identity(), "device": hardware.device, "software": software})


__all__ = ["RESULTS_SCHEMA_VERSION", "RUNS_FOLDER", "ScenarioDir", "rebuild_view", "scenario_dir", "prune_loadgen_logs", "measurements", "readme",
           "write_system_json", "write_json", "write_text"]
