"""Fixtures shared by the tests; plain helpers live in tests/support.py."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import copy_specs

# Set from outside, these would point a test at the developer's database, manifests or presets, or
# append to a CI job's summary.
_OUTSIDE = ("GITHUB_STEP_SUMMARY",)


def _clear_outside_environment(patch: pytest.MonkeyPatch, cache: Path) -> None:
    for var in [v for v in os.environ if v.startswith("MLHARNESS_") or v in _OUTSIDE]:
        patch.delenv(var)
    patch.setenv("MLHARNESS_CACHE", str(cache))


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's one artifact cache ($MLHARNESS_CACHE), shared by every test of the session:
    converted models (torch -> ONNX exports, the symbolic-batch resnet50-light graph) take seconds
    to minutes to rebuild, and every test that needs one would otherwise rebuild it. Sharing it is
    safe: an entry is named by a key over everything that makes it and reused only while its sha256
    matches its provenance, and the cache is never the developer's ~/.cache/mlharness."""
    return tmp_path_factory.getbasetemp() / "mlharness-cache"


@pytest.fixture(scope="session", autouse=True)
def _hermetic_session(model_cache: Path) -> Iterator[None]:
    """No MLHARNESS_* variable from outside for the whole session, so module-scoped fixtures (set up
    before any per-test fixture) do not see the developer's database, specs or presets either."""
    with pytest.MonkeyPatch.context() as patch:
        _clear_outside_environment(patch, model_cache)
        yield


@pytest.fixture(autouse=True)
def _private_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_cache: Path) -> Path:
    """Every test gets its own environment and its own results database under its tmp_path.

    Every MLHARNESS_* variable is cleared again (whatever an earlier test or module fixture left)
    and MLHARNESS_CACHE points at the session's shared cache (see `model_cache`). MLHARNESS_DB
    stays unset, so each run's database is `<results dir>/mlharness.sqlite`, and the working
    directory is tmp_path, so a command given no --results-dir or --db writes `results/` and its
    database there, never into the checkout. Setting MLHARNESS_DB to a per-test file instead
    would send every run of a test into that file, and tests that read
    `<results dir>/mlharness.sqlite` after a run would find nothing."""
    _clear_outside_environment(monkeypatch, model_cache)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def specs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of specs/ that tests may add manifests to; MLHARNESS_SPECS points at it."""
    root = copy_specs(tmp_path / "specs")
    monkeypatch.setenv("MLHARNESS_SPECS", str(root))
    return root
