"""pytest plugin for mutation runs (see sitecustomize.py): functions that ran in child processes
started by a test count as reached by that test in mutmut's stats."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

HITS_ENV = "MUTATION_BRIDGE_HITS"  # not MLHARNESS_*: the suite clears those for each test


def pytest_configure(config: pytest.Config) -> None:
    if HITS_ENV not in os.environ:
        os.environ[HITS_ENV] = tempfile.mkdtemp(prefix="mlharness-mutation-hits-")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    folder = os.environ.get(HITS_ENV)
    if os.environ.get("MUTANT_UNDER_TEST") != "stats" or not folder:
        return
    names: set[str] = set()
    for hits in Path(folder).glob("*.hits"):
        names.update(hits.read_text(encoding="utf-8").split())
        hits.unlink()
    if names:
        from mutmut.state import state

        # mutmut's own teardown hook (after this one) files these under the finishing test.
        state()._stats.update(names)
