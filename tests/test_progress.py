"""Progress (issue 16): what a test will do is said before LoadGen starts (from LoadGen's effective
settings, mlperf.conf's minimums included, with the layer that set each), and while it runs a plain
line every few seconds off a terminal, a live bar on one (a real pseudo-terminal here), nothing with
--quiet.

No verdict depends on the machine's speed (issue 38): a ticker is watched until it has drawn (or, for
a quiet one, until a twin beside it has), and the step ETA reads a clock the test sets."""
from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from mlharness.running import progress as progress_module
from mlharness.running.progress import (
    LoadGenPlan,
    Snapshot,
    Ticker,
    clock,
    plan_loadgen_test,
)
from tests.support import REPO, run_cli


def test_offline_expects_the_minimum_count_or_1_1_x_qps_x_duration() -> None:
    plan = LoadGenPlan("Offline", "performance", min_duration_s=8.0, min_query_count=24576, target_qps=40.0,
                       origins={"min_duration": "cli", "target_qps": "model"})
    assert (plan.expected_samples, plan.expected_queries) == (24576, 1)
    assert plan.expected_seconds == pytest.approx(24576 / 40)
    assert plan.stretched_by == "min_query_count"
    lines = plan.describe()
    assert lines[0] == ("Offline performance: at least 8 s (min_duration, cli) and 24576 samples (min_query_count, "
                        "mlperf.conf); target_qps 40 (model)")
    assert lines[1] == "expected: about 10:14 and 24576 samples"
    assert lines[2].startswith("note: min_query_count 24576 (mlperf.conf) stretches this test to about 10:14, "
                               "though its min_duration is 8 s")
    # By duration: LoadGen's Offline query holds 1.1 x target_qps x min_duration samples.
    short = LoadGenPlan("Offline", "performance", min_duration_s=1.0, min_query_count=1, target_qps=1000.0)
    assert short.expected_samples == 1100 and short.stretched_by is None


def test_streams_and_server_expect_the_longer_of_duration_and_count() -> None:
    single = LoadGenPlan("SingleStream", "performance", min_duration_s=2.0, min_query_count=100, target_latency_ms=10.0)
    assert (single.expected_queries, single.expected_samples, single.expected_seconds) == (200, 200, 2.0)
    slow = LoadGenPlan("SingleStream", "performance", min_duration_s=2.0, min_query_count=1024, target_latency_ms=10.0)
    assert slow.expected_seconds == pytest.approx(10.24) and slow.stretched_by == "min_query_count"
    multi = LoadGenPlan("MultiStream", "performance", min_duration_s=1.0, min_query_count=10, samples_per_query=8,
                        target_latency_ms=50.0)
    assert (multi.expected_queries, multi.expected_samples) == (20, 160)
    server = LoadGenPlan("Server", "performance", min_duration_s=3.0, min_query_count=100, target_qps=5000.0)
    assert (server.expected_queries, server.expected_seconds) == (15000, 3.0)
    accuracy = LoadGenPlan("Offline", "accuracy", min_duration_s=1.0, min_query_count=1, target_qps=10.0,
                           total_samples=500)
    assert accuracy.expected_samples == 500 and accuracy.expected_seconds is None
    assert accuracy.describe() == ["Offline accuracy: every sample once (500 samples)"]


def test_snapshots_count_down_to_both_minimums() -> None:
    plan = LoadGenPlan("SingleStream", "performance", min_duration_s=10.0, min_query_count=1000, target_latency_ms=1.0)
    # 100 queries in 2 s: the duration ends in 8 s, the count (900 more at 50/s) in 18 s.
    snap = plan.snapshot(100, 2.0)
    assert snap.eta == pytest.approx(18.0) and snap.total == pytest.approx(100 + 18 * 50)
    # Both met: nothing left.
    assert plan.snapshot(5000, 12.0).eta == 0.0
    server = LoadGenPlan("Server", "performance", min_duration_s=10.0, min_query_count=10, target_qps=100.0)
    assert server.snapshot(200, 2.0).extra == "100.0 of 100 QPS"
    offline = LoadGenPlan("Offline", "performance", min_duration_s=1.0, min_query_count=1000, target_qps=10.0)
    snap = offline.snapshot(250, 5.0)
    assert (snap.total, snap.eta, snap.extra) == (1000, pytest.approx(15.0), "50 samples/s")
    waiting = offline.snapshot(0, None)
    assert waiting.done == 0 and waiting.extra == "LoadGen is loading samples and scheduling queries"


def test_the_plan_reads_loadgens_effective_settings() -> None:
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.MultiStream
    settings.min_duration_ms = 4000
    settings.min_query_count = 12
    settings.multi_stream_samples_per_query = 4
    settings.multi_stream_expected_latency_ns = 25_000_000
    plan = plan_loadgen_test(settings, "MultiStream", "performance", {"min_duration": "preset quick"}, 64)
    assert (plan.min_duration_s, plan.min_query_count, plan.samples_per_query, plan.target_latency_ms) == (4.0, 12, 4, 25.0)
    assert plan.origins == {"min_duration": "preset quick"} and plan.total_samples == 64


def wait_for(happened: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for an event; the deadline only fails a test whose event never comes."""
    deadline = time.monotonic() + timeout
    while not happened():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.01)


def test_plain_lines_every_interval_and_nothing_when_quiet() -> None:
    stream = io.StringIO()
    done = [0]

    def read() -> Snapshot:
        done[0] += 10
        return Snapshot(done[0], 100, 1.0, "fast")

    with Ticker("step", read, "items", stream=stream, interval=0.05, terminal=False) as ticker:
        wait_for(lambda: ticker.lines >= 2, "two progress lines")
    lines = stream.getvalue().splitlines()
    assert ticker.lines == len(lines) >= 2
    assert all(line.startswith("[progress] step: ") and "/100 items" in line and line.endswith(", fast")
               for line in lines)
    # A quiet ticker draws nothing in the time its twin (same interval, started after it) draws twice.
    quiet, beside = io.StringIO(), io.StringIO()
    with Ticker("step", read, stream=quiet, interval=0.01, quiet=True):
        with Ticker("step", read, stream=beside, interval=0.01, terminal=False) as twin:
            wait_for(lambda: twin.lines >= 2, "two lines from the twin")
    assert quiet.getvalue() == ""
    assert clock(75) == "1:15" and clock(3725) == "1:02:05" and clock(None) == "?"


def test_a_broken_reader_never_breaks_the_step() -> None:
    stream = io.StringIO()
    calls = [0]

    def read() -> Snapshot:
        calls[0] += 1
        raise RuntimeError("counter gone")

    with Ticker("step", read, stream=stream, interval=0.01, terminal=False):
        wait_for(lambda: calls[0] >= 2, "the reader called twice")
    assert stream.getvalue() == ""


def test_a_run_says_what_it_will_do_then_shows_progress(capfd: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MLHARNESS_PROGRESS")  # the suite's default is off (tests/conftest.py)
    # Lines every 0.1 s through a test that lasts at least its 2.5 s min_duration, however slow the machine.
    monkeypatch.setenv("MLHARNESS_PROGRESS_INTERVAL", "0.1")
    assert run_cli("run", "null", "--scenario", "Server", "--set", "target_qps=2000", "--set", "min_duration=2500",
                   "--results-dir", tmp_path) == 0
    err = [line for line in capfd.readouterr().err.splitlines() if not line.startswith("note: ")]  # untuned
    assert err[0] == ("[run] Server performance: at least 2.5 s (min_duration, cli) and 100 queries "
                      "(min_query_count, mlperf.conf); target_qps 2000 (cli)")
    assert err[1] == "[run] expected: about 0:02 and 5000 samples in 5000 queries"
    progress = [line for line in err if line.startswith("[progress] null Server performance: ")]
    assert len(progress) >= 2, err
    assert any(" of 2000 QPS" in line and "samples, elapsed" in line for line in progress)
    # --quiet, or MLHARNESS_PROGRESS=off: neither the plan nor the progress.
    monkeypatch.setenv("MLHARNESS_PROGRESS", "off")
    assert run_cli("run", "null", "--scenario", "Server", "--set", "target_qps=2000", "--set", "min_duration=1000",
                   "--results-dir", tmp_path) == 0
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith(("[run]", "[progress]"))]
    monkeypatch.delenv("MLHARNESS_PROGRESS")
    assert run_cli("run", "null", "--scenario", "Server", "--set", "target_qps=2000", "--set", "min_duration=1000",
                   "--results-dir", tmp_path, "--quiet") == 0
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith(("[run]", "[progress]"))]


def test_on_a_terminal_the_progress_is_a_live_bar(tmp_path: Path) -> None:
    """A real pseudo-terminal: the child's stderr is a tty, so rich draws (ANSI control codes)."""
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLHARNESS_")} | {"COLUMNS": "200"}
    command = [sys.executable, "-m", "mlharness.cli", "run", "null", "--scenario", "Server",
               "--set", "min_duration=2000", "--set", "target_qps=2000", "--results-dir", str(tmp_path)]
    child = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=terminal)
    os.close(terminal)
    output = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        elif child.poll() is not None:
            break
    child.wait(timeout=30)
    os.close(controller)
    text = output.decode("utf-8", "replace")
    assert child.returncode == 0, text
    assert "\x1b[" in text  # drawn in place with control codes, not plain lines
    assert "[progress]" not in text
    assert "null Server performance" in text and "samples, elapsed" in text and " of 2000 QPS" in text


def test_steps_report_each_end_with_an_eta_from_the_durations_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the test's own clock: the ETA and the running time are exact, and the ticker (10 s of that
    clock between lines) never draws, however long the machine takes."""
    from mlharness.running.progress import Steps

    now = [1000.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    stream = io.StringIO()
    with Steps(3, stream, interval=10.0, terminal=False, unit="cells") as steps:
        steps.starting("a", announce=True)
        steps.finished("a", "ok", 2.0)
        steps.starting("b", expected=30.0)
        now[0] += 1.0  # b has run for a second
        snapshot = steps._read()
        assert (snapshot.done, snapshot.total) == (1, 3) and snapshot.extra == "running b for 0:01 of ~0:30"
        assert snapshot.eta == pytest.approx(3.0)  # two more at the mean of 2 s, less b's second
        steps.finished("b", "FAILED: boom", 4.0)
        steps.finished("c", "ok", 3.0)
    assert stream.getvalue().splitlines() == ["a: started", "[1/3] a: ok (2.0 s), ETA 0:04",
                                              "[2/3] b: FAILED: boom (4.0 s), ETA 0:03", "[3/3] c: ok (3.0 s)"]
    plain = io.StringIO()
    with Steps(1, plain, terminal=False, numbered=False, quiet=True) as steps:
        steps.starting("[1/1] x", expected=5.0, announce=True)
        steps.finished("[1/1] x", "done", 1.0)
    assert plain.getvalue().splitlines() == ["[1/1] x: started (about 5 s)", "[1/1] x: done (1.0 s)"]
