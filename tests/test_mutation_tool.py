"""The mutation-testing driver (tools/mutation/run.py): its module table names real files, and its
score counts what mutmut reports the way docs/testing.md says (timeouts count as detected)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support import REPO


def _driver():
    spec = importlib.util.spec_from_file_location("mutation_run", REPO / "tools" / "mutation" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_names_existing_sources_and_tests() -> None:
    modules = _driver().load_modules()
    assert {"sut", "staging", "handoff", "settings", "manifests", "gate", "result_store", "launcher"} <= set(modules)
    for entry in modules.values():
        assert entry["files"] and entry["tests"]
        assert all((REPO / p).is_file() and p.endswith(".py") for p in entry["files"] + entry["tests"])


def test_score_counts_killed_and_timeouts_over_all_but_skipped() -> None:
    statuses = {"a": "killed", "b": "killed", "c": "timeout", "d": "survived", "e": "no tests", "f": "skipped"}
    figures = _driver().score(statuses)
    assert figures["total"] == 6
    assert (figures["killed"], figures["timeout"], figures["survived"], figures["no_tests"]) == (2, 1, 1, 1)
    assert figures["other"] == {"skipped": 1}
    assert figures["score"] == 0.6  # 3 detected of the 5 not skipped
    assert _driver().score({})["score"] is None


def test_a_missing_file_in_the_table_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _driver()
    table = tmp_path / "modules.toml"
    table.write_text('[x]\nfiles = ["sut/no_such.py"]\ntests = ["tests/test_gate.py"]\n')
    monkeypatch.setattr(driver, "HERE", tmp_path)
    with pytest.raises(SystemExit, match="x: sut/no_such.py does not exist"):
        driver.load_modules()
