"""The mutation-testing driver (tools/mutation/run.py): its module table names real files, and its
score counts what mutmut reports the way docs/testing.md says (timeouts count as detected)."""
from __future__ import annotations

import importlib.util
import py_compile
from pathlib import Path

import pytest

from tests.support import REPO


def _driver():
    return _tool("run")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"mutation_{name}", REPO / "tools" / "mutation" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_names_existing_sources_and_tests() -> None:
    modules = _driver().load_modules()
    assert {"sut", "staging", "handoff", "settings", "manifests", "gate", "result_store", "launcher"} <= set(modules)
    for entry in modules.values():
        assert entry["files"] and entry["tests"]
        assert all((REPO / p).is_file() and p.endswith(".py") for p in entry["files"])
        for test in entry["tests"]:  # a file, or one test of it as a pytest node id
            path, _, name = test.partition("::")
            assert (REPO / path).is_file() and path.endswith(".py")
            assert not name or f"def {name.split('[')[0]}(" in (REPO / path).read_text(), f"{test}: no such test"


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


CASE_ONLY = '''--- a.py
+++ a.py
@@ -1,2 +1,2 @@
 def f(conn):
-    return conn.execute("SELECT run_id FROM runs")
+    return conn.execute("select run_id from runs")
'''
TEXT_CHANGED = CASE_ONLY.replace('"select run_id from runs"', '"XXSELECT run_id FROM runsXX"')


def _diff(before: str, after: str) -> str:
    return f"--- a.py\n+++ a.py\n@@ -1 +1 @@\n-{before}\n+{after}\n"


@pytest.mark.parametrize("before, after, equivalent", [
    ('rows = conn.execute("SELECT * FROM runs").fetchall()', 'rows = conn.execute("select * from runs").fetchall()', True),
    ('return json.loads(row["record_json"])', 'return json.loads(row["RECORD_JSON"])', True),  # a sqlite3.Row key
    ('keep = [c for c in row if c != "run_id"]', 'keep = [c for c in row if c != "RUN_ID"]', False),  # Python compares it
    ('values = {"model": run.model}', 'values = {"MODEL": run.model}', False),  # a dict key
    ('conn.execute("COMMIT")', 'CONN.execute("COMMIT")', False),  # a change outside the literals
    ('conn.execute("COMMIT")', 'conn.execute("XXCOMMITXX")', False),
])
def test_which_case_changes_are_read_without_case(before: str, after: str, equivalent: bool) -> None:
    assert _driver().changes_letter_case_only(_diff(before, after)) is equivalent


def test_only_letter_case_survivors_of_an_opted_in_module_are_equivalent() -> None:
    driver = _driver()
    statuses = {"case": "survived", "text": "survived", "case_killed": "killed"}
    diffs = {"case": CASE_ONLY, "text": TEXT_CHANGED, "case_killed": CASE_ONLY}
    assert driver.changes_letter_case_only(CASE_ONLY) and not driver.changes_letter_case_only(TEXT_CHANGED)
    assert driver.equivalent_mutants({"case_insensitive_text": True}, statuses, diffs) == {"case"}
    assert driver.equivalent_mutants({}, statuses, diffs) == set()  # only where the table says so
    figures = driver.score(statuses, {"case"})
    assert (figures["equivalent"], figures["survived"], figures["killed"]) == (1, 1, 1)
    assert figures["score"] == 0.5  # 1 killed of the 2 not equivalent
    assert figures["score_without_rule"] == round(1 / 3, 4)


def test_the_result_store_opts_in_and_no_other_module_does() -> None:
    modules = _driver().load_modules()
    assert [name for name, entry in modules.items() if entry.get("case_insensitive_text")] == ["result_store"]


def test_a_selection_of_mutants_is_scored_alone() -> None:
    found = {"statuses": {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "survived", "m.x_g__mutmut_1": "not checked"},
             "diffs": {"m.x_f__mutmut_2": "-a\n+b\n", "m.x_g__mutmut_1": "-a\n+c\n"}}
    chosen = _driver().select_mutants(found, ["*x_f__*"])
    assert chosen == {"statuses": {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "survived"},
                      "diffs": {"m.x_f__mutmut_2": "-a\n+b\n"}}
    assert _driver().score(chosen["statuses"])["score"] == 0.5


def test_a_mutants_test_modules_run_quickest_first_each_in_its_own_order() -> None:
    bridge = _tool("mutation_bridge")
    given = ["tests/test_slow.py::test_a", "tests/test_quick.py::test_c", "tests/test_slow.py::test_b",
             "tests/test_quick.py::test_d[1]", "tests/test_new.py::test_e"]
    seconds = {"tests/test_slow.py::test_a": 1.0, "tests/test_slow.py::test_b": 9.0,
               "tests/test_quick.py::test_c": 4.0, "tests/test_quick.py::test_d[1]": 3.0}
    assert bridge.quickest_modules_first(given, seconds) == [
        "tests/test_new.py::test_e", "tests/test_quick.py::test_c", "tests/test_quick.py::test_d[1]",
        "tests/test_slow.py::test_a", "tests/test_slow.py::test_b"]


def test_a_modules_mutmut_config_names_its_files_in_the_namespace_and_forks_workers_from_a_clean_process() -> None:
    """process_isolation: the default forks each worker from the process that ran every test for the
    stats, and a worker that reaches llama.cpp or torch then hangs in GNU OpenMP (tools/mutation/run.py)."""
    config = _driver().mutmut_config(["sut/llm/runtime.py", "harness/running/runner.py"], ["tests/test_llm_runtime.py"],
                                     ["tests/test_llm.py::test_x"])
    assert config["source_paths"] == ["mlharness/sut/llm/runtime.py", "mlharness/running/runner.py"]
    assert config["pytest_add_cli_args"] == ["-p", "mutation_bridge", "--deselect=tests/test_llm.py::test_x"]
    assert config["pytest_add_cli_args_test_selection"] == ["tests/test_llm_runtime.py"]
    assert config["process_isolation"] == "forkserver"


def test_a_modules_tree_has_the_readme_whose_example_test_api_runs() -> None:
    config = _driver().mutmut_config(["harness/running/runner.py"], ["tests/test_api.py"], [])
    assert "README.md" in config["also_copy"]


def test_a_forked_childs_reached_functions_are_also_written_to_its_hits_file(tmp_path: Path) -> None:
    """In a test's forked child mutmut's record of reached functions dies with the child: the bridge's
    record there appends each function to a file the first time it is reached, for the test's teardown."""
    hits = tmp_path / "123.hits"
    recorded = _tool("mutation_bridge")._HitsAlsoInFile(str(hits))
    for name in ("mlharness.running.runner.x_run_here", "mlharness.running.resolve.x_token_mode",
                 "mlharness.running.runner.x_run_here"):
        recorded.add(name)
    assert hits.read_text().split() == ["mlharness.running.runner.x_run_here", "mlharness.running.resolve.x_token_mode"]
    assert recorded == {"mlharness.running.runner.x_run_here", "mlharness.running.resolve.x_token_mode"}


def test_recheck_applies_a_survivors_change_alone_or_says_it_cannot() -> None:
    recheck = _tool("recheck")
    diff = "--- m.py\n+++ m.py\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x + 1\n+    return x - 1\n"
    source = "import os\n\ndef f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n"
    assert recheck.apply_change(source, diff) == source.replace("def f(x):\n    return x + 1", "def f(x):\n    return x - 1")
    assert recheck.apply_change(source.replace("def f", "def h"), diff) is None  # its lines are gone
    assert recheck.apply_change(source + "\ndef f(x):\n    return x + 1\n", diff) is None  # found twice: which?
    # A method's diff, as mutmut shows it: the body dedented by the class's indentation, a blank line kept blank.
    method = "--- m.py\n+++ m.py\n@@ -1,4 +1,4 @@\n def f(self, x):\n     y = x\n \n-    return y + 1\n+    return y - 1\n"
    source = "class C:\n    def f(self, x):\n        y = x\n\n        return y + 1\n"
    assert recheck.apply_change(source, method) == source.replace("y + 1", "y - 1")


def test_recheck_counts_a_test_process_the_change_crashed_as_a_kill_and_stops_where_tests_cannot_run(
        tmp_path: Path) -> None:
    """A change that makes the test process die of a signal (a segfault in C code) is detected, as mutmut counts
    it; one that leaves pytest unable to run the tests (exit 2 and above) is no verdict: the recheck stops."""
    recheck = _tool("recheck")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "m.py").write_text("import os\n\n\ndef f(x):\n    return x + 1\n")
    (tree / "test_m.py").write_text("from m import f\n\n\ndef test_f():\n    assert f(1) >= 0\n")
    crash = {"m.x_f__mutmut_1": "--- m.py\n+++ m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x + 1\n+    return os.abort()\n"}
    assert recheck.recheck(tree, crash, ["test_m.py"]) == {"m.x_f__mutmut_1": "killed"}
    broken = {"m.x_f__mutmut_2": "--- m.py\n+++ m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x + 1\n+    return x +\n"}
    with pytest.raises(SystemExit, match=r"^m.x_f__mutmut_2: pytest exited 2"):
        recheck.recheck(tree, broken, ["test_m.py"])
    assert (tree / "m.py").read_text().endswith("return x + 1\n")  # put back


@pytest.mark.parametrize("jobs", [1, 2])
def test_recheck_gives_each_survivor_its_verdict_from_the_tests_whether_side_by_side_or_not(tmp_path: Path,
                                                                                           jobs: int) -> None:
    """A tree whose test checks f only: f's change is killed, g's and n.py's k's survive, a change of lines no
    longer there is not applied; each file is put back, and the copies made for the jobs are gone after. Each
    change is the same size as the code, and each run far shorter than a second: a cached .pyc, which Python
    trusts while the source's size and whole-second mtime match, would run the code before the change (a CI run
    without PYTHONDONTWRITEBYTECODE failed so)."""
    recheck = _tool("recheck")
    tree = tmp_path / "tree"
    tree.mkdir()
    source = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n"
    (tree / "m.py").write_text(source)
    py_compile.compile(str(tree / "m.py"))  # the original's bytecode, cached beside it
    (tree / "n.py").write_text("def k(x):\n    return x * 2\n")
    (tree / "test_m.py").write_text("import n\nfrom m import f\n\n\ndef test_f():\n    assert f(1) == 2\n")
    diffs = {"m.x_f__mutmut_1": "--- m.py\n+++ m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x + 1\n+    return x - 1\n",
             "n.x_k__mutmut_1": "--- n.py\n+++ n.py\n@@ -1,2 +1,2 @@\n def k(x):\n-    return x * 2\n+    return x * 3\n",
             "m.x_g__mutmut_1": "--- m.py\n+++ m.py\n@@ -5,2 +5,2 @@\n def g(x):\n-    return x * 2\n+    return x * 3\n",
             "m.x_h__mutmut_1": "--- m.py\n+++ m.py\n@@ -1,2 +1,2 @@\n def h(x):\n-    return x\n+    return None\n"}
    verdicts = recheck.recheck(tree, diffs, ["test_m.py"], jobs)
    assert verdicts == {"m.x_f__mutmut_1": "killed", "n.x_k__mutmut_1": "survived", "m.x_g__mutmut_1": "survived",
                        "m.x_h__mutmut_1": "not applied"}
    assert list(verdicts) == list(diffs)  # in the run's order, whoever judged each
    assert (tree / "m.py").read_text() == source and (tree / "n.py").read_text() == "def k(x):\n    return x * 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]
