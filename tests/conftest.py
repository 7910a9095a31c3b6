"""Fixtures shared by the tests; plain helpers live in tests/support.py."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import REPO


@pytest.fixture
def specs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of specs/ that tests may add manifests to; MLHARNESS_SPECS points at it."""
    root = tmp_path / "specs"
    shutil.copytree(REPO / "specs", root)
    monkeypatch.setenv("MLHARNESS_SPECS", str(root))
    return root


@pytest.fixture(scope="session", autouse=True)
def _private_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite never reads or writes the developer's $MLHARNESS_DB, specs, presets, CI summary or
    ~/.cache/mlharness: one private cache for the session, and no overrides from outside."""
    with pytest.MonkeyPatch.context() as patch:
        for var in ("MLHARNESS_DB", "MLHARNESS_SPECS", "MLHARNESS_SCENARIOS", "GITHUB_STEP_SUMMARY"):
            patch.delenv(var, raising=False)
        patch.setenv("MLHARNESS_CACHE", str(tmp_path_factory.getbasetemp() / "mlharness-cache"))
        yield
