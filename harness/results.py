"""The results tree, shaped like a submission's results/<system>/<benchmark>/<Scenario>/ folder.
A run is staged in a hidden folder and moved into place file by file when it succeeds; a failed
run's logs are kept beside it in failed-<run id>/, so earlier results are never overwritten by
half a run."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.atomic_io import move_file, write_json, write_text

RESULTS_SCHEMA_VERSION = 1
LOADGEN_LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json", "mlperf_log_trace.json")


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

    def publish(self) -> Path:
        """Move every staged file to its place under root (each a rename), then drop the staging dir.
        Runs publishing into one folder at once take turns (a lock file), so the files of one run are
        never interleaved with another's."""
        import fcntl

        with open(self.root / ".publish.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for src in sorted(p for p in self.staging.rglob("*") if p.is_file()):
                move_file(src, self.root / src.relative_to(self.staging))
        shutil.rmtree(self.staging, ignore_errors=True)
        return self.root

    def keep_failed(self) -> Path:
        target = self.root / f"failed-{self.run_id}"
        if self.staging.exists():
            os.replace(self.staging, target)
        else:
            target.mkdir(parents=True, exist_ok=True)
        return target


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


__all__ = ["RESULTS_SCHEMA_VERSION", "ScenarioDir", "scenario_dir", "prune_loadgen_logs", "measurements", "readme",
           "write_system_json", "write_json", "write_text"]
