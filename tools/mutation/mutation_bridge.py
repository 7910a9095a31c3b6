"""pytest plugin for mutation runs (see sitecustomize.py): functions that ran in child processes
started by a test count as reached by that test in mutmut's stats."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

HITS_ENV = "MLHARNESS_MUTATION_HITS"


def pytest_configure(config: pytest.Config) -> None:
    if HITS_ENV not in os.environ:
        os.environ[HITS_ENV] = tempfile.mkdtemp(prefix="mlharness-mutation-hits-")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    names: set[str] = set()
    for hits in Path(os.environ[HITS_ENV]).glob("*.hits"):
        names.update(hits.read_text(encoding="utf-8").split())
        hits.unlink()
    if names:
        from mutmut.state import state

        # mutmut's own teardown hook (after this one) files these under the finishing test.
        state()._stats.update(names)
