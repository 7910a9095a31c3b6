"""Helpers the tests share (an importable module, so `pytest` and `python -m pytest` collect alike):
run the real CLI in-process, read results, write manifests."""
from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

from harness.cli import main

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> int:
    return main([str(a) for a in args])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scenario_root(results: Path, model: str, scenario: str) -> Path:
    """results/<system>/<model>/<Scenario> (there is one system per machine)."""
    matches = list(results.glob(f"*/{model}/{scenario}"))
    assert len(matches) == 1, f"expected one scenario dir, found {matches}"
    return matches[0]


def read_run(results: Path, model: str, scenario: str) -> dict:
    return json.loads((scenario_root(results, model, scenario) / "run.json").read_text())


def write_manifest(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def newest_run(results: Path, model: str, scenario: str) -> dict:
    """The record of the newest ok run of a model and scenario, from its own folder (runs/<run id>/)."""
    files = sorted(scenario_root(results, model, scenario).glob("runs/*/run.json"))
    assert files, f"no runs of {model} {scenario} under {results}"
    return json.loads(files[-1].read_text())
