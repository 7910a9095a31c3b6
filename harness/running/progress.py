"""Progress: what a run will do before it starts, and what it is doing while it runs.

One module for every long step (a LoadGen test, a sweep's cells, a submission's steps, a model's
bricks). A `Ticker` polls a `read()` function from a thread of its own, a few times a second at
most, and draws:

- on a terminal, a live `rich` bar (done of expected, elapsed, ETA, rate and any extra text);
- elsewhere (a log file, CI), one plain line every `interval` seconds (MLHARNESS_PROGRESS_INTERVAL,
  default 10);
- nothing when quiet (--quiet, or MLHARNESS_PROGRESS=off).

Nothing is ever drawn from LoadGen's callbacks: the SUT only counts what it completed (one integer
per worker), and the ticker reads the counts. bench/progress_overhead.py shows the cost.

`plan_loadgen_test` turns LoadGen's effective settings (after FromConfig, so mlperf.conf's
per-benchmark minimums are included) into the expected length of a test, and says which layer set
each figure and when a minimum stretches the test far beyond its minimum duration."""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TextIO

INTERVAL_ENV = "MLHARNESS_PROGRESS_INTERVAL"
PROGRESS_ENV = "MLHARNESS_PROGRESS"
DEFAULT_INTERVAL = 10.0
TERMINAL_REFRESH = 0.5  # seconds between redraws of a live bar
WATCH_PERIOD = 0.2
OFFLINE_MARGIN = 1.1  # LoadGen's Offline query holds 1.1 x target_qps x min_duration samples


def clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


@dataclass(frozen=True)
class Snapshot:
    """What a step has done so far: `done` of `total` (None: unknown) units, `eta` in seconds when the
    step knows better than done/total at the current rate, and extra text (e.g. achieved QPS)."""
    done: float
    total: float | None = None
    eta: float | None = None
    extra: str = ""
    elapsed: float | None = None  # seconds the step itself has run, when it knows (else since the ticker began)


@dataclass
class LoadGenPlan:
    """How long a LoadGen test is expected to take, from its effective settings."""
    scenario: str
    mode: str
    min_duration_s: float
    min_query_count: int
    samples_per_query: int = 1
    target_qps: float | None = None  # Offline, Server
    target_latency_ms: float | None = None  # SingleStream, MultiStream (the expected latency)
    total_samples: int | None = None  # accuracy mode: every sample of the dataset once
    origins: dict[str, str] = field(default_factory=dict)

    @property
    def expected_samples(self) -> int:
        if self.mode == "accuracy" and self.total_samples:
            return self.total_samples
        if self.scenario == "Offline":
            return max(self.min_query_count, math.ceil(OFFLINE_MARGIN * (self.target_qps or 0) * self.min_duration_s))
        return self.expected_queries * self.samples_per_query

    @property
    def expected_queries(self) -> int:
        if self.scenario == "Offline":
            return 1
        if self.scenario == "Server":
            return max(self.min_query_count, math.ceil((self.target_qps or 0) * self.min_duration_s))
        latency_s = (self.target_latency_ms or 0) / 1e3
        by_duration = math.ceil(self.min_duration_s / latency_s) if latency_s > 0 else 0
        return max(self.min_query_count, by_duration)

    @property
    def expected_seconds(self) -> float | None:
        if self.mode == "accuracy":
            return None
        if self.scenario in ("Offline", "Server"):
            return self.expected_samples / self.target_qps if self.target_qps else None
        if not self.target_latency_ms:
            return None
        return max(self.min_duration_s, self.min_query_count * self.target_latency_ms / 1e3)

    @property
    def stretched_by(self) -> str | None:
        """The minimum count that makes the test much longer than its minimum duration, if any."""
        expected = self.expected_seconds
        if self.mode == "accuracy" or expected is None or expected <= 1.5 * self.min_duration_s:
            return None
        return "min_query_count"

    def describe(self) -> list[str]:
        """The lines printed before the test starts."""
        def origin(key: str) -> str:
            return self.origins.get(key, "mlperf.conf")

        if self.mode == "accuracy":
            return [f"{self.scenario} accuracy: every sample once ({self.total_samples} samples)"]
        target = (f"target_qps {self.target_qps:g} ({origin('target_qps')})" if self.scenario in ("Offline", "Server")
                  else f"expected latency {self.target_latency_ms:.4g} ms ({origin('target_latency')})")
        count = ("samples" if self.scenario == "Offline" else "queries")
        lines = [f"{self.scenario} {self.mode}: at least {self.min_duration_s:g} s (min_duration, {origin('min_duration')}) "
                 f"and {self.min_query_count} {count} (min_query_count, {origin('min_query_count')}); {target}",
                 f"expected: about {clock(self.expected_seconds)} and {self.expected_samples} samples"
                 + (f" in {self.expected_queries} queries" if self.scenario != "Offline" else "")]
        if self.stretched_by:
            lines.append(f"note: min_query_count {self.min_query_count} ({origin('min_query_count')}) stretches this "
                         f"test to about {clock(self.expected_seconds)}, though its min_duration is "
                         f"{self.min_duration_s:g} s; lower it with --set min_query_count=N (results below the "
                         f"benchmark's minimums are not valid for submission)")
        return lines

    def snapshot(self, done_samples: int, elapsed: float | None) -> Snapshot:
        """Progress of the test: samples completed, expected, ETA; for Server the achieved QPS. `elapsed`
        counts from the first completed sample (None: none yet, LoadGen is still loading samples and
        scheduling its queries)."""
        if elapsed is None:
            return Snapshot(0, None, None, "LoadGen is loading samples and scheduling queries", 0.0)
        rate = done_samples / elapsed if elapsed > 0 else 0.0
        if self.mode == "accuracy" or self.scenario == "Offline":
            total = self.expected_samples
            eta = (total - done_samples) / rate if rate > 0 else None
            return Snapshot(done_samples, total, eta, f"{rate:,.0f} samples/s" if rate else "", elapsed)
        # The test ends once both minimums are met: the duration, and the query count at this rate.
        queries = done_samples / self.samples_per_query
        query_rate = queries / elapsed if elapsed > 0 else 0.0
        by_count = (self.min_query_count - queries) / query_rate if query_rate > 0 else None
        eta = max(self.min_duration_s - elapsed, by_count, 0.0) if by_count is not None else None
        total = done_samples + (eta or 0.0) * rate if eta is not None else None
        extra = f"{rate:,.1f} samples/s"
        if self.scenario == "Server" and self.target_qps:
            extra = f"{query_rate:,.1f} of {self.target_qps:g} QPS"
        return Snapshot(done_samples, total, eta, extra, elapsed)


def plan_loadgen_test(test_settings: Any, scenario: str, mode: str, origins: Mapping[str, str],
                      total_samples: int) -> LoadGenPlan:
    """The plan of a LoadGen test from its TestSettings after FromConfig (what LoadGen will use)."""
    latency_ns = {"SingleStream": getattr(test_settings, "single_stream_expected_latency_ns", 0),
                  "MultiStream": getattr(test_settings, "multi_stream_expected_latency_ns", 0)}.get(scenario)
    qps = {"Offline": getattr(test_settings, "offline_expected_qps", 0),
           "Server": getattr(test_settings, "server_target_qps", 0)}.get(scenario)
    return LoadGenPlan(
        scenario=scenario, mode=mode, min_duration_s=float(test_settings.min_duration_ms) / 1e3,
        min_query_count=int(test_settings.min_query_count),
        samples_per_query=int(test_settings.multi_stream_samples_per_query) if scenario == "MultiStream" else 1,
        target_qps=float(qps) if qps else None, target_latency_ms=float(latency_ns) / 1e6 if latency_ns else None,
        total_samples=total_samples, origins=dict(origins))


def quiet_from_env() -> bool:
    """MLHARNESS_PROGRESS=off: no plan and no progress display, as --quiet (CI logs, scripts)."""
    return os.environ.get(PROGRESS_ENV, "").strip().lower() in ("off", "0", "no", "false")


def interval_from_env(default: float = DEFAULT_INTERVAL) -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, default))
    except ValueError:
        return default
    return value if value > 0 else default


class Ticker:
    """Draws a step's progress from a thread of its own (see the module docstring). Use as a context
    manager; `read()` is called from that thread only."""

    def __init__(self, label: str, read: Callable[[], Snapshot], unit: str = "", stream: TextIO | None = None,
                 quiet: bool = False, interval: float | None = None, terminal: bool | None = None,
                 watch: Callable[[], None] | None = None):
        # `watch` is called every WATCH_PERIOD seconds between draws (e.g. to notice when a test's first
        # sample completed, so elapsed and ETA count from there).
        self.label, self.read, self.unit, self.watch = label, read, unit, watch
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.interval = interval if interval is not None else interval_from_env()
        self.terminal = terminal if terminal is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._bar: Any = None
        self.lines = 0  # plain lines written (tests read it)

    def __enter__(self) -> "Ticker":
        if self.quiet:
            return self
        self._started = time.monotonic()
        if self.terminal:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
            )

            console = Console(file=self.stream, force_terminal=True)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TextColumn("{task.fields[status]}"), console=console, auto_refresh=False,
                                 transient=False)
            self._task = self._bar.add_task(self.label, total=None, status="")
            self._bar.start()
        self._thread = threading.Thread(target=self._run, name="mlharness-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.quiet or self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._draw(final=True)
        if self._bar is not None:
            self._bar.stop()

    def say(self, text: str) -> None:
        """A line of the command's own report: above the live bar when one is drawn, else on the stream."""
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _run(self) -> None:
        period = TERMINAL_REFRESH if self.terminal else self.interval
        next_draw = time.monotonic() + period
        while not self._stop.wait(min(WATCH_PERIOD, period) if self.watch is not None else period):
            if self.watch is not None:
                self.watch()
            if time.monotonic() >= next_draw:
                self._draw()
                next_draw += period

    def text(self, snapshot: Snapshot, elapsed: float) -> str:
        done = f"{snapshot.done:,.0f}" + (f"/{snapshot.total:,.0f}" if snapshot.total else "")
        parts = [f"{done} {self.unit}".strip(), f"elapsed {clock(elapsed)}"]
        if not self._stop.is_set():
            parts.append(f"ETA {clock(snapshot.eta)}")
        if snapshot.extra:
            parts.append(snapshot.extra)
        return ", ".join(parts)

    def _draw(self, final: bool = False) -> None:
        try:
            snapshot = self.read()
        except Exception:  # noqa: BLE001 - a progress display must never break the step it shows
            return
        elapsed = snapshot.elapsed if snapshot.elapsed is not None else time.monotonic() - self._started
        if self._bar is not None:
            total = snapshot.total if snapshot.total else None
            self._bar.update(self._task, completed=snapshot.done, total=total,
                             status=self.text(snapshot, elapsed))
            self._bar.refresh()
            return
        if final:
            return  # a plain log gets the step's own closing line instead
        self.stream.write(f"[progress] {self.label + ': ' if self.label else ''}{self.text(snapshot, elapsed)}\n")
        self.stream.flush()
        self.lines += 1


class Steps:
    """Progress of a sequence of steps (a sweep's cells, a submission's steps, a suite's models): a
    line as each starts and ends, and between them a Ticker with steps done of total, the step
    running and for how long (of its expected seconds when known), and an ETA from the steps'
    durations so far. `quiet` drops the ticker, not the lines (they are the command's report)."""

    def __init__(self, total: int, stream: TextIO | None = None, quiet: bool = False,
                 interval: float | None = None, terminal: bool | None = None, unit: str = "steps",
                 numbered: bool = True):
        self.total, self.unit, self.numbered = total, unit, numbered  # numbered: "[n/total]" before each end
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.durations: list[float] = []
        self.current: tuple[str, float, float | None] | None = None  # label, started, expected seconds
        self._lock = threading.Lock()
        self.ticker = Ticker("", self._read, unit, stream=self.stream, quiet=quiet or quiet_from_env(),
                             interval=interval, terminal=terminal)

    def __enter__(self) -> "Steps":
        self.ticker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ticker.__exit__(*exc)

    def eta(self) -> float | None:
        if not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        running = time.monotonic() - self.current[1] if self.current else 0.0
        return max(mean * (self.total - self.done) - running, 0.0)

    def _read(self) -> Snapshot:
        with self._lock:
            extra = ""
            if self.current is not None:
                label, started, expected = self.current
                extra = f"running {label} for {clock(time.monotonic() - started)}" + \
                    (f" of ~{clock(expected)}" if expected else "")
            return Snapshot(self.done, self.total, self.eta(), extra)

    def say(self, text: str) -> None:
        """A line of the command's report, above a live bar when one is drawn."""
        self.ticker.say(text)

    def starting(self, label: str, expected: float | None = None, announce: bool = False) -> None:
        with self._lock:
            self.current = (label, time.monotonic(), expected)
        if announce:
            self.say(f"{label}: started" + (f" (about {expected:.0f} s)" if expected else ""))

    def finished(self, label: str, status: str, seconds: float) -> None:
        with self._lock:
            self.done += 1
            self.durations.append(seconds)
            self.current = None
            eta = self.eta()
        number = f"[{self.done}/{self.total}] " if self.numbered else ""
        self.say(f"{number}{label}: {status} ({seconds:.1f} s)"
                 + (f", ETA {clock(eta)}" if self.done < self.total and eta is not None else ""))
