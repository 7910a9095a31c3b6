"""Shared helpers: run the real CLI in-process, and write manifests into a temporary specs tree."""
from __future__ import annotations

import hashlib
import json
import shutil
import textwrap
from pathlib import Path

import pytest

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


@pytest.fixture
def specs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of specs/ that tests may add manifests to; MLHARNESS_SPECS points at it."""
    root = tmp_path / "specs"
    shutil.copytree(REPO / "specs", root)
    monkeypatch.setenv("MLHARNESS_SPECS", str(root))
    return root


def write_manifest(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path
