"""Tuned configurations as runs read them: the key a configuration is stored under and its lookup
in the results database (the search itself is mlharness.running.tuning, which imports the runner; the
runner imports only this)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlharness.errors import UserError

TUNABLE_SCENARIOS = ("Offline", "SingleStream", "MultiStream", "Server")
FRAMEWORK_PACKAGE = {"onnxruntime": "onnxruntime", "torch": "torch"}


def software_key(backend: str, versions: dict[str, str]) -> str:
    """What a tuned configuration depends on besides the model and the system: the framework's and
    LoadGen's versions."""
    package = FRAMEWORK_PACKAGE.get(backend)
    parts = {"backend": backend, "loadgen": versions.get("mlcommons-loadgen")}
    if package:
        parts[package] = versions.get(package)
    return json.dumps(parts, sort_keys=True)


def tuning_key(model: Any, system_name: str, backend: str, versions: dict[str, str], scenario: str) -> dict[str, str]:
    return {"model": model.name, "model_sha256": model.sha256, "system_name": system_name, "backend": backend,
            "software": software_key(backend, versions), "scenario": scenario}


def lookup(results_dir: Path, key: dict[str, str]) -> dict[str, Any] | None:
    """The tuned configuration for `key` in the results directory's database (read only), or None."""
    from mlharness.store import result_store

    try:
        store = result_store.ResultStore.reading(result_store.default_db_path(results_dir))
        if store is None:
            return None
        with store:  # a query that meets damaged pages is a UserError too, on leaving
            return store.get_tuned(key)
    except UserError:
        return None  # a damaged database holds no tuning; the run goes on and storing its record says why


def untuned_note(model: str, scenario: str, system_name: str) -> str:
    return (f"note: {model} is untuned for {scenario} on this system ({system_name}); `mlharness tune {model} "
            f"--scenario {scenario}` searches its batch size, threads and session options and later runs here "
            f"start from what it finds")


def trial_status(trial: dict[str, Any]) -> str:
    """A stored trial's status as the tune table and the report show it: confirmation runs marked."""
    return trial["status"] + (" (confirm)" if trial.get("phase") == "confirm" else "")


def settings_text(settings: dict[str, Any]) -> str:
    """Tuned settings as the tune table, its summary and the report show them: `key=value, ...`, sorted."""
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
