"""Scenario presets (the YAML files under scenarios/, `--preset NAME`, `--quick`): where they are found
($MLHARNESS_SCENARIOS, carried in a run request once resolved, or the shipped ones) and one loaded and
checked against its schema."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mlharness.errors import UserError
from mlharness.specs.index import shipped_folder
from mlharness.specs.validation import load_yaml

SCENARIOS_ENV = "MLHARNESS_SCENARIOS"


def scenarios_root() -> Path:
    """The shipped scenarios/ package's folder (the presets), unless MLHARNESS_SCENARIOS points elsewhere."""
    return shipped_folder("scenarios", SCENARIOS_ENV)


def scenarios_from_environment() -> Path | None:
    """$MLHARNESS_SCENARIOS, read where a run is submitted: the request carries it (scenarios_root), as
    it carries $MLHARNESS_SPECS, so a run's process here or on a cluster node does not read its own."""
    value = os.environ.get(SCENARIOS_ENV)
    return Path(value) if value else None


def shipped_scenarios() -> Path:
    """The presets shipped with mlharness, whatever $MLHARNESS_SCENARIOS says."""
    return shipped_folder("scenarios", SCENARIOS_ENV, read_env=False)


def load_preset(name_or_path: str, root: Path | None = None) -> dict[str, Any]:
    """A preset by path, or by name under `root` (None: scenarios_root(), the environment's or the shipped)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = (root or scenarios_root()) / f"{name_or_path}.yaml"
    if not path.is_file():
        raise UserError(f"{path}: no such scenario preset")
    doc = load_yaml(path)
    from pydantic import ValidationError

    from mlharness.running.settings_schema import PresetDoc
    from mlharness.specs.validation import ManifestError, problems_from

    try:
        PresetDoc.model_validate(doc)
    except ValidationError as exc:
        raise ManifestError(problems_from(exc, str(path), PresetDoc, doc)) from None
    return {"path": path, "settings": doc.get("settings") or {}}
