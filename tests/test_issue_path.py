"""Server's issue path without the GIL (issue 17): LoadGen's own C SUT fills a native queue, Python
workers take batches from it with the GIL released. Tested both ways (native, and the Python
binding as the fallback) with the routed null model, whose accuracy is exactly 1.0 only when every
response reaches its own sample; and the queue itself, driven directly."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.support import newest_run, run_cli

native = pytest.importorskip("sut._native", reason="the C extension is not built")


@pytest.mark.parametrize("path", ["native", "python"])
def test_server_routes_every_response_on_either_issue_path(path: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_ISSUE", path)
    assert run_cli("run", "null-routed", "--scenario", "Server", "--mode", "accuracy", "--quick",
                   "--set", "workers=2", "--set", "max_batch_size=8", "--set", "target_qps=2000",
                   "--set", "batch_wait_ms=2", "--results-dir", tmp_path) == 0
    record = newest_run(tmp_path, "null-routed", "Server")
    assert record["accuracy"]["values"]["top1"] == 1.0, record["accuracy"]["headline"]
    facts = record["loadgen"]["accuracy"]["sut"]
    assert facts["issue_path"] == ("native" if path == "native" else "python (MLHARNESS_ISSUE=python)")
    assert facts["batch_wait_ms"] == 2.0


def test_the_batch_wait_never_exceeds_half_the_latency_target(tmp_path: Path) -> None:
    assert run_cli("run", "null", "--scenario", "Server", "--quick", "--set", "target_qps=2000",
                   "--set", "target_latency=10", "--set", "batch_wait_ms=1000", "--results-dir", tmp_path) == 0
    record = newest_run(tmp_path, "null", "Server")
    assert record["loadgen"]["performance"]["sut"] == {"issue_path": "native", "batch_wait_ms": 5.0}
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "batch_wait_ms=3",
                   "--results-dir", tmp_path) == 0
    offline = newest_run(tmp_path, "null", "Offline")["loadgen"]["performance"]["sut"]
    assert offline == {"issue_path": "python (the native issue path serves Server; this is Offline)",
                       "batch_wait_ms": 0.0}


def test_an_unknown_issue_path_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MLHARNESS_ISSUE", "fast")
    assert run_cli("run", "null", "--scenario", "Server", "--quick", "--results-dir", tmp_path) == 1
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert line.startswith("mlharness: error: run failed: MLHARNESS_ISSUE='fast': expected 'native' or 'python' (logs")


def test_take_returns_what_was_issued_in_order_up_to_the_batch_limit() -> None:
    queue = native.IssueQueue()
    queue.push([10, 11, 12, 13, 14], [0, 1, 2, 3, 4])
    assert (queue.issued, queue.pending) == (5, 5)
    assert queue.take(2, 0.1, 0.0) == ([10, 11], [0, 1])
    assert queue.take(8, 0.1, 0.0) == ([12, 13, 14], [2, 3, 4])  # what is there; no waiting for more
    assert queue.take(8, 0.05, 0.0) == ([], [])  # nothing came within the wait
    queue.push(list(range(10000)), list(range(10000)))  # past the first ring's capacity
    taken = queue.take(10000, 0.1, 0.0)
    assert taken == (list(range(10000)), list(range(10000))) and queue.pending == 0
    with pytest.raises(ValueError):
        queue.take(0, 0.1, 0.0)


def test_a_batch_waits_to_fill_up_to_its_bound() -> None:
    queue = native.IssueQueue()

    def later() -> None:
        time.sleep(0.05)
        queue.push([2, 3], [2, 3])

    queue.push([1], [1])
    threading.Thread(target=later).start()
    started = time.monotonic()
    assert queue.take(3, 0.1, 1.0) == ([1, 2, 3], [1, 2, 3])  # filled by the second push
    assert time.monotonic() - started < 0.9
    queue.push([4], [4])
    started = time.monotonic()
    assert queue.take(3, 0.1, 0.1) == ([4], [4])  # the bound passed: what there is
    assert time.monotonic() - started >= 0.09


def test_take_waits_without_the_gil_and_close_wakes_it() -> None:
    queue = native.IssueQueue()
    results: list = []
    waiter = threading.Thread(target=lambda: results.append(queue.take(4, 30.0, 0.0)))
    waiter.start()
    counted = 0
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # this thread runs Python while the other waits in take
        counted += 1
    assert counted > 1000
    queue.close()
    waiter.join(5)
    assert not waiter.is_alive() and results == [None]
    assert queue.take(4, 1.0, 0.0) is None  # closed and empty


def test_the_record_names_the_path_in_the_database_too(tmp_path: Path) -> None:
    assert run_cli("run", "null", "--scenario", "Server", "--quick", "--set", "target_qps=1000",
                   "--results-dir", tmp_path) == 0
    import sqlite3

    conn = sqlite3.connect(tmp_path / "mlharness.sqlite")
    (text,) = conn.execute("SELECT record_json FROM runs").fetchone()
    conn.close()
    assert json.loads(text)["loadgen"]["performance"]["sut"]["issue_path"] == "native"
