"""pytest plugin for mutation runs (see sitecustomize.py): functions that ran in child processes
started by a test, started afresh or forked, count as reached by that test in mutmut's stats."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

HITS_ENV = "MUTATION_BRIDGE_HITS"  # not MLHARNESS_*: the suite clears those for each test


def pytest_configure(config: pytest.Config) -> None:
    if HITS_ENV not in os.environ:
        os.environ[HITS_ENV] = tempfile.mkdtemp(prefix="mlharness-mutation-hits-")
    if _collecting_stats():
        os.register_at_fork(after_in_child=_record_hits_in_file)


class _HitsAlsoInFile(set):
    """mutmut's in-memory record of the functions reached, which also appends each new one to a file."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def add(self, name: str) -> None:
        if name not in self:
            # Written at once: the child may end with os._exit, which runs no exit handlers.
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(name + "\n")
        super().add(name)


def _record_hits_in_file() -> None:
    """A forked child (a test's run in a process of its own, without exec, so sitecustomize does not
    run) records in a copy of mutmut's state that dies with it: there it also writes a hits file."""
    from mutmut.state import state

    state()._stats = _HitsAlsoInFile(os.path.join(os.environ[HITS_ENV], f"{os.getpid()}.hits"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    folder = os.environ.get(HITS_ENV)
    if not _collecting_stats() or not folder:
        return
    names: set[str] = set()
    for hits in Path(folder).glob("*.hits"):
        names.update(hits.read_text(encoding="utf-8").split())
        hits.unlink()
    if names:
        from mutmut.state import state

        # mutmut's own teardown hook (after this one) files these under the finishing test.
        state()._stats.update(names)


def _collecting_stats() -> bool:  # mutmut's traced first pass
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


def _testing_a_mutant() -> bool:
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """mutmut times a test by its call alone; its time limit for a mutant (tools/mutation/run.py: 4x the
    tests' time plus 10 s) then leaves out the set-up, and a test whose fixture loads a model ran past it
    with no mutant effect: a kill, or a survivor, filed as a timeout. Set-up and teardown count too."""
    yield
    if _collecting_stats() and call.when in ("setup", "teardown"):
        from mutmut.state import state

        state().duration_by_test[item.nodeid] += call.duration


def quickest_modules_first(node_ids: list[str], seconds: dict[str, float]) -> list[str]:
    """The tests' node ids, their modules in order of the module's total time (of these tests, by
    `seconds`; unknown: 0), each module's tests in the order given."""
    per_module: dict[str, float] = {}
    for node_id in node_ids:
        module = node_id.split("::")[0]
        per_module[module] = per_module.get(module, 0.0) + seconds.get(node_id, 0.0)
    return sorted(node_ids, key=lambda node_id: per_module[node_id.split("::")[0]])  # stable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A mutant's test modules quickest first, each in its own order: mutmut hands pytest the tests in
    no order and stops at the first failure, so a kill comes from a quick module's test rather than
    after whole runs that cannot give one. Modules stay whole, so their fixtures are made once."""
    if not _testing_a_mutant():
        return
    from mutmut.state import state

    rank = {node_id: i for i, node_id in enumerate(quickest_modules_first([item.nodeid for item in items],
                                                                           state().duration_by_test))}
    items.sort(key=lambda item: rank[item.nodeid])
