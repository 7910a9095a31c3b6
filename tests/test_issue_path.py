"""Server's issue path without the GIL (issue 17): LoadGen's own C SUT fills a native queue, Python
workers take batches from it with the GIL released. Tested both ways (native, and the Python
binding as the fallback) with the routed null model, whose accuracy is exactly 1.0 only when every
response reaches its own sample; and the queue itself, driven directly.

No verdict depends on the machine's speed (issue 38): a thread waiting in take() is seen waiting (its
state and frame) before anything is done to it, and the only time bounds left are lower bounds
(time only adds) or hang guards far above any honest duration."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support import newest_run, run_cli

native = pytest.importorskip("mlharness.sut._native", reason="the C extension is not built")


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


def test_the_batch_wait_is_bounded_by_the_target_less_two_measured_batch_times(tmp_path: Path) -> None:
    assert run_cli("run", "null", "--scenario", "Server", "--quick", "--set", "target_qps=2000",
                   "--set", "target_latency=10", "--set", "batch_wait_ms=1000", "--results-dir", tmp_path) == 0
    record = newest_run(tmp_path, "null", "Server")
    facts = record["loadgen"]["performance"]["sut"]
    warmup = record["cold_start"]["warmup"]
    service_ms = 1000 * warmup["seconds"] / warmup["queries"]  # the warm-up ran full batches
    assert facts["batch_service_ms"] == pytest.approx(service_ms, abs=1e-6) and service_ms > 0
    # Never below 0: a warm-up slowed by a busy machine may measure a batch at 5 ms or more.
    assert facts["batch_wait_bound_ms"] == pytest.approx(max(0.0, 10 - 2 * service_ms), abs=1e-5)
    assert facts["batch_wait_ms"] == facts["batch_wait_bound_ms"] < 10
    assert facts["batch_wait_rule"] == "target_latency - 2 x service time of a full batch"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "batch_wait_ms=3",
                   "--results-dir", tmp_path) == 0
    offline = newest_run(tmp_path, "null", "Offline")["loadgen"]["performance"]["sut"]
    assert offline == {"issue_path": "python (the native issue path serves Server; this is Offline)",
                       "batch_wait_ms": 0.0, "served_on": "workers",
                       "postprocess_group_rows": 0}  # batches of 1024 rows: no group of 64 rows


@pytest.mark.parametrize("scenario, wanted, target, service, expected", [
    ("Server", 8.0, 10, 3.0, {"batch_wait_ms": 4.0, "batch_wait_bound_ms": 4.0, "batch_service_ms": 3.0}),
    ("Server", 1.0, 10, 3.0, {"batch_wait_ms": 1.0, "batch_wait_bound_ms": 4.0, "batch_service_ms": 3.0}),
    ("Server", 8.0, 10, 6.0, {"batch_wait_ms": 0.0, "batch_wait_bound_ms": 0.0, "batch_service_ms": 6.0}),
    ("Server", 8.0, 10, None, {"batch_wait_ms": 5.0, "batch_wait_bound_ms": 5.0}),  # no warm-up: T/2
    ("Server", 8.0, None, 3.0, {"batch_wait_ms": 8.0}),  # no latency target to keep
    ("Server", 0.0, 10, 3.0, {"batch_wait_ms": 0.0}),
    ("Offline", 8.0, 10, 3.0, {"batch_wait_ms": 0.0}),
])
def test_the_batch_wait_bound_rule(scenario: str, wanted: float, target: Any, service: Any, expected: dict) -> None:
    from mlharness.running.loadgen_test import batch_wait_bound
    from mlharness.running.settings import build_settings

    settings = build_settings(scenario=scenario, mode="performance", conf_model="m", model_name="m",
                              overrides=[] if target is None else [f"target_latency={target}"])
    found = batch_wait_bound(settings, {"batch_wait_ms": wanted}, service)
    assert {k: v for k, v in found.items() if k != "batch_wait_rule"} == expected


def test_the_service_time_is_the_warm_ups_only_when_it_ran_full_batches() -> None:
    from mlharness.running.loadgen_test import full_batch_service_ms

    warm = {"warmup": {"queries": 4, "seconds": 0.02, "batch_size": 8}}
    assert full_batch_service_ms(warm, 8) == pytest.approx(5.0)
    assert full_batch_service_ms(warm, 16) is None  # a warm-up at another batch size says nothing of a full one
    assert full_batch_service_ms({"warmup": {"queries": 0, "seconds": 0, "batch_size": 8}}, 8) is None
    assert full_batch_service_ms({}, 8) is None


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


def take(queue: Any, *args: float) -> Any:
    """queue.take, in a frame of its own that `waiting_in_take` recognises."""
    return queue.take(*args)


def waiting_in_take(ident: int, native_id: int) -> bool:
    """The thread (Python's ident, the kernel's id) sleeps inside take(): its innermost Python frame is
    `take` past its start (in the call), and the kernel has it asleep. Called with the GIL held, so the
    thread is not running Python. The kernel's id is the one the thread reads itself: in a forked
    process (mutmut's workers) the main Thread object's native_id is still the parent's."""
    frame = sys._current_frames().get(ident)
    if frame is None or frame.f_code is not take.__code__ or frame.f_lasti <= 0:
        return False
    try:
        with open(f"/proc/self/task/{native_id}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "S"
    except OSError:  # the thread has ended meanwhile
        return False


def wait_for(happened: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for an event; the deadline only fails a test whose event never comes."""
    deadline = time.monotonic() + timeout
    while not happened():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.001)


def test_a_batch_waits_to_fill_up_to_its_bound() -> None:
    queue = native.IssueQueue()
    taker = (threading.get_ident(), threading.get_native_id())
    pushed: list[BaseException | None] = []

    def once_waiting() -> None:
        try:
            wait_for(lambda: waiting_in_take(*taker), "take() waiting for its batch to fill")
            queue.push([2, 3], [2, 3])
            pushed.append(None)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            pushed.append(error)

    queue.push([1], [1])
    pusher = threading.Thread(target=once_waiting, daemon=True)
    pusher.start()
    started = time.monotonic()
    assert take(queue, 3, 0.1, 60.0) == ([1, 2, 3], [1, 2, 3])  # filled by the second push
    # A hang guard: it returns as the batch fills; waiting out its 60 s bound would fail here.
    assert time.monotonic() - started < 30
    pusher.join(60)
    assert pushed == [None]
    queue.push([4], [4])
    started = time.monotonic()
    assert queue.take(3, 0.1, 0.1) == ([4], [4])  # the bound passed: what there is
    assert time.monotonic() - started >= 0.09  # a lower bound: a busy machine only adds


def test_take_waits_without_the_gil_and_close_wakes_it() -> None:
    queue = native.IssueQueue()
    results: list = []
    waiter = threading.Thread(target=lambda: results.append(take(queue, 4, 60.0, 0.0)), daemon=True)
    waiter.start()
    assert waiter.ident is not None and waiter.native_id is not None  # set once started
    # This thread runs Python (it looks) while the other sleeps in take: a take holding the GIL would
    # let it look only once take returned, after its 60 s.
    wait_for(lambda: waiting_in_take(waiter.ident, waiter.native_id), "the other thread asleep in take()")
    assert waiter.is_alive() and results == []
    queue.close()
    waiter.join(60)
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
