"""Faults with real processes and files: signals mid-run, killed runs, user code that exits, hangs or
crashes, and what each leaves behind. `mlharness run` is started as a real command in its own
process group; each test checks the exit status, the one-line message, that earlier results are
byte-identical afterwards, and that no staging folder outlives its run.

No verdict here reads the clock or depends on the machine's speed (issue 38): a test waits for the
event itself (LoadGen's log under way, a process ended), with a deadline that only a missing event
reaches; a run that must still be going when something happens to it lasts an hour; a whole-run
timeout is far longer than any start-up."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from tests.support import HOUR_LONG_SETTINGS, HOUR_LONG_TIMEOUT_S, REPO, ended, hour_long_null, null_model_with, wait_for
from tests.unwritable import read_only_folder, without_overrides

_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test() -> Iterator[None]:
    """A test that failed while its (hour-long) run went on kills the command; its run's process,
    which dies with its parent, follows."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def start(results: Path, *args: str, **popen: Any) -> subprocess.Popen:
    # This tree first; what the caller had on PYTHONPATH (a mutation run's hooks, say) stays behind it.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    env.pop("MLHARNESS_DB", None)
    proc = subprocess.Popen([sys.executable, "-m", "mlharness.cli", "run", *args, "--results-dir", str(results)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)
    _STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    return lines[0]


def snapshot(results: Path) -> dict[str, str]:
    """sha256 of every published file of earlier runs (the database grows by design: left out)."""
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.is_file() and p.suffix != ".sqlite"}


def db_runs(results: Path) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(results / "mlharness.sqlite") as conn:
        return {row[0]: (row[1], row[2] or "") for row in conn.execute("SELECT run_id, status, error FROM runs")}


def failed_record(results: Path) -> dict:
    found = sorted(results.glob("*/null/*/failed-*/run.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.fixture
def earlier(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A results tree holding one good run, and the snapshot of its files."""
    results = tmp_path / "results"
    code, out, err = finish(start(results, "null", "--scenario", "SingleStream", "--quick"))
    assert code == 0, err
    return results, snapshot(results)


def assert_intact(results: Path, before: dict[str, str]) -> None:
    after = snapshot(results)
    assert {k: after.get(k) for k in before} == before, "an earlier result changed"
    assert not list(results.rglob(".staging-*")), "a staging folder outlived its run"


LONG = ("--scenario", "SingleStream", *(arg for setting in HOUR_LONG_SETTINGS for arg in ("--set", setting)))
TIMEOUT = HOUR_LONG_TIMEOUT_S




def start_long_run(results: Path) -> subprocess.Popen:
    """An hour-long null run, returned once LoadGen's test is under way (its detail log begun)."""
    proc = start(results, str(hour_long_null(results.parent / "long-model")), *LONG)

    def under_way() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        return any(p.stat().st_size > 0 for p in results.rglob(".staging-*/performance/run_1/mlperf_log_detail.txt"))

    wait_for(under_way, "LoadGen's test under way")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_run_stops_the_run_and_keeps_its_logs(earlier: tuple[Path, dict[str, str]], sig: int) -> None:
    """The stop does not wait for LoadGen's test: that lasts an hour, and `finish` gives up after 120 s
    (about a second is usual here)."""
    results, before = earlier
    proc = start_long_run(results)
    os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C does: to the whole process group
    code, out, err = finish(proc)
    assert code == 128 + sig
    line = error_line(err)
    assert f"interrupted by {signal.Signals(sig).name}" in line and "failed-" in line
    record = failed_record(results)
    assert record["status"] == "failed" and signal.Signals(sig).name in record["error"]
    # LoadGen's logs so far are kept with the failed run, and the database has the failed run.
    folder = Path(record["results_path"])
    assert (folder / "performance" / "run_1" / "mlperf_log_detail.txt").stat().st_size > 0
    assert db_runs(results)[record["run_id"]][0] == "failed"
    assert_intact(results, before)


def test_killed_run_is_closed_by_the_next_run(earlier: tuple[Path, dict[str, str]]) -> None:
    results, before = earlier
    proc = start_long_run(results)
    # SIGKILL to the launcher and its run alike: nothing gets to clean up. The launcher is stopped
    # first: left running, it could see its run end before its own kill came, and close the run.
    children = psutil.Process(proc.pid).children()
    assert children, "the run's process"
    os.killpg(proc.pid, signal.SIGSTOP)
    for child in children:
        os.killpg(child.pid, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_for(lambda: all(ended(child) for child in children), "the killed run's process ended")
    assert list(results.rglob(".staging-*")), "the kill should have left the run's staging folder"
    # The next run finds the folder, sees its owner is gone, and turns it into a failed run.
    code, out, err = finish(start(results, "null", "--scenario", "Offline", "--quick"))
    assert code == 0, err
    record = failed_record(results)
    assert record["status"] == "failed" and "abandoned" in record["error"]
    assert db_runs(results)[record["run_id"]][0] == "failed"
    assert_intact(results, before)


def test_killed_launcher_fails_its_run(earlier: tuple[Path, dict[str, str]]) -> None:
    """SIGKILL to the launching process only: its run notices, keeps its logs as a failed run and
    records it in the database itself, since nobody else will."""
    results, before = earlier
    proc = start_long_run(results)
    children = psutil.Process(proc.pid).children()
    assert children, "the run's process"
    proc.kill()
    proc.communicate(timeout=30)
    # The orphan ends itself (its test would last an hour), after writing its folder and its row.
    wait_for(lambda: all(ended(child) for child in children), "the orphaned run stopped", timeout=120)
    assert not list(results.rglob(".staging-*"))
    record = failed_record(results)
    assert "launching process ended" in record["error"]
    assert db_runs(results)[record["run_id"]][0] == "failed"
    assert_intact(results, before)


@pytest.mark.parametrize("where, code_text, expected", [
    ("preprocess", "import os\n\ndef preprocess(sample, ctx):\n    os._exit(0)\n",
     "exited with status 0 before finishing the run"),
    ("preprocess", "import ctypes\n\ndef preprocess(sample, ctx):\n    ctypes.string_at(0)\n",
     "was killed by SIGSEGV"),
    ("postprocess", "import os, signal\n\ndef postprocess(outputs, ctx):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
     "was killed by SIGKILL"),
])
def test_user_code_that_ends_the_process_is_a_failed_run(earlier: tuple[Path, dict[str, str]], tmp_path: Path,
                                                         where: str, code_text: str, expected: str) -> None:
    results, before = earlier
    manifest = null_model_with(tmp_path / "models", **{where: code_text})
    code, out, err = finish(start(results, str(manifest), "--scenario", "SingleStream", "--quick"))
    assert code == 1
    line = error_line(err)
    assert expected in line, line
    record = failed_record(results)
    assert record["status"] == "failed" and expected in record["error"]
    assert db_runs(results)[record["run_id"]] == ("failed", record["error"])
    assert_intact(results, before)


@pytest.mark.parametrize("hang_on, extra, stage", [
    ("True", (), "the first inference and warm-up"),  # user code runs before LoadGen too
    ("sample != 0", ("--set", "warmup_queries=0"), "LoadQuerySamples"),  # sample 0 alone warms up
])
def test_user_code_that_hangs_times_out(earlier: tuple[Path, dict[str, str]], tmp_path: Path,
                                        hang_on: str, extra: tuple[str, ...], stage: str) -> None:
    results, before = earlier
    manifest = null_model_with(tmp_path / "models", preprocess="import time\nimport numpy as np\n\n"
                             "def preprocess(sample, ctx):\n"
                             f"    while {hang_on}:\n        time.sleep(1)\n"
                             "    return np.array([sample], dtype=np.float32)\n")
    # The user code never returns: only load_timeout ends the run before `finish` gives up (120 s).
    code, out, err = finish(start(results, str(manifest), "--scenario", "Offline", "--quick",
                                  "--set", "load_timeout=2", *extra))
    assert code == 1
    line = error_line(err)
    assert f"{stage}" in line and "did not finish within 2 s" in line and "load_timeout" in line, line
    assert failed_record(results)["status"] == "failed"
    assert_intact(results, before)


def test_a_run_past_its_timeout_is_stopped(earlier: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    results, before = earlier
    manifest = null_model_with(tmp_path / "models", postprocess="import time\n\ndef postprocess(outputs, ctx):\n"
                                                               "    time.sleep(3600)\n")
    # The postprocess sleeps an hour: only the timeout ends the run before `finish` gives up (120 s).
    code, out, err = finish(start(results, str(manifest), "--scenario", "SingleStream", "--quick",
                                  "--timeout", str(TIMEOUT)))
    assert code == 1
    line = error_line(err)
    assert f"timed out after {TIMEOUT} s" in line and "failed-" in line, line
    assert "timed out" in failed_record(results)["error"]
    assert_intact(results, before)


def test_a_bug_in_user_code_keeps_its_traceback(earlier: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    results, before = earlier
    manifest = null_model_with(tmp_path / "models", postprocess="def helper(x):\n    return x['nope']\n\n"
                                                               "def postprocess(outputs, ctx):\n    return helper(outputs)\n")
    code, out, err = finish(start(results, str(manifest), "--scenario", "Offline", "--quick"))
    assert code == 1
    line = error_line(err)
    assert "postprocess raised KeyError" in line and "traceback in" in line
    record = failed_record(results)
    saved = Path(record["error_traceback"])
    assert saved.parent == Path(record["results_path"]) and saved.name == "traceback.txt"
    text = saved.read_text()
    assert "Traceback" in text and "in helper" in text and "KeyError: 'nope'" in text
    assert_intact(results, before)


def test_results_dir_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "results"
    file.write_text("not a folder")
    code, out, err = finish(start(file, "null", "--scenario", "Offline", "--quick"))
    assert code == 1
    assert error_line(err) == f"mlharness: error: --results-dir {file}: exists and is not a directory"
    assert file.read_text() == "not a folder"


def test_results_dir_not_writable(tmp_path: Path) -> None:
    """A results folder the run may not write (mode 0555; as root, the run started without the
    capabilities that override the mode: tests/unwritable.py), or one it would have to create there:
    one line naming the folder, exit 1, nothing written."""
    folder = read_only_folder(tmp_path / "results")
    try:
        code, out, err = finish(start(folder, "null", "--scenario", "Offline", "--quick", **without_overrides()))
        assert (code, out) == (1, "")
        assert error_line(err) == f"mlharness: error: --results-dir {folder}: not writable"
        inside = folder / "runs"
        code, out, err = finish(start(inside, "null", "--scenario", "Offline", "--quick", **without_overrides()))
        assert (code, out) == (1, "")
        assert error_line(err) == f"mlharness: error: --results-dir {inside}: cannot be created ({folder} is not writable)"
        assert list(folder.iterdir()) == [], "nothing half-written"
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_database_is_one_line_and_keeps_the_run(earlier: tuple[Path, dict[str, str]], damage: str) -> None:
    results, before = earlier
    db = results / "mlharness.sqlite"
    if damage == "garbage":
        db.write_bytes(b"this is not a database\n" * 100)
    else:
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3])
    damaged = db.read_bytes()
    code, out, err = finish(start(results, "null", "--scenario", "Offline", "--quick"))
    assert code == 1
    line = error_line(err)
    assert str(db) in line and "the run's results are in" in line
    # The run itself finished and its files are in place; the damaged file is left as it was.
    published = json.loads(next(results.glob("*/null/Offline/run.json")).read_text())
    assert published["status"] == "ok" and published["results_path"] in line
    assert db.read_bytes() == damaged
    assert_intact(results, before)


def test_two_runs_at_once_into_one_results_dir(earlier: tuple[Path, dict[str, str]]) -> None:
    results, before = earlier
    procs = [start(results, "null", "--scenario", "Offline", "--quick") for _ in range(2)]
    outcomes = [finish(proc) for proc in procs]
    assert [code for code, _, _ in outcomes] == [0, 0], [err for _, _, err in outcomes]
    runs = db_runs(results)
    assert len(runs) == 3 and all(status == "ok" for status, _ in runs.values())
    # The published folder holds one run's files, not a mix: the summary beside run.json is the one
    # that run parsed (LoadGen's figures and its timestamped log differ between the two runs).
    from mlharness.records.loadgen_logs import parse_summary

    folder = next(results.glob("*/null/Offline"))
    record = json.loads((folder / "run.json").read_text())
    assert record["run_id"] in runs
    summary = parse_summary(folder / "performance" / "run_1" / "mlperf_log_summary.txt")
    assert summary == {k: v for k, v in record["performance"].items() if k != "wall_seconds"}
    assert_intact(results, before)
