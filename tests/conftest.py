"""Fixtures shared by the tests; plain helpers live in tests/support.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import REPO


@pytest.fixture
def specs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of specs/ that tests may add manifests to; MLHARNESS_SPECS points at it."""
    root = tmp_path / "specs"
    shutil.copytree(REPO / "specs", root)
    monkeypatch.setenv("MLHARNESS_SPECS", str(root))
    return root
