"""The tracer protocol, one per profiling level, in the manner of pyperf's hooks: a context manager
entered just before the LoadGen test and left just after, recording what it sees; `collect` turns
that into spans on the profile clock and a summary for summary.json."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mlharness.profiling.clock import ClockAnchor


@dataclass(frozen=True)
class Span:
    """A complete span ("X" event) on one thread; spans of one thread nest."""

    name: str
    start_ns: int
    end_ns: int
    tid: int
    args: dict[str, Any] = field(default_factory=dict)
    track: str = "process"  # which timeline process group it is drawn in


@dataclass(frozen=True)
class AsyncSpan:
    """A span that may overlap its siblings (a query waiting in a queue): an async track."""

    name: str
    start_ns: int
    end_ns: int
    id: int
    args: dict[str, Any] = field(default_factory=dict)
    track: str = "process"


@dataclass(frozen=True)
class CounterSample:
    name: str
    ts_ns: int
    values: dict[str, float]
    track: str = "system"


@dataclass
class TraceContext:
    """What a tracer may look at: the loaded runtime, where to keep raw files, the clock anchor."""

    runtime: Any
    out_dir: Path
    anchor: ClockAnchor
    scenario: str = ""
    loadgen_trace: Path | None = None  # LoadGen's mlperf_log_trace.json once the test has ended
    sut: Any = None  # the SUT of the test, read after it (a generative model's token SUT keeps its clocks)


@dataclass
class LevelResult:
    level: str
    status: str  # "ok" | "unavailable" | "failed"
    reason: str = ""
    spans: list[Span] = field(default_factory=list)
    async_spans: list[AsyncSpan] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    thread_names: dict[tuple[str, int], str] = field(default_factory=dict)  # (track, tid) -> its name in the timeline


class Tracer:
    """Subclasses set `level`, implement start/stop/collect, and may define `batch(times)` to be
    called by the SUT after each batch (the BatchObserver protocol)."""

    level: ClassVar[str] = ""

    def __init__(self, ctx: TraceContext):
        self.ctx = ctx

    @classmethod
    def unavailable(cls, ctx: TraceContext) -> str | None:
        """Why this level cannot run here (reported, never faked), or None."""
        return None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def collect(self, window: tuple[int, int]) -> LevelResult:
        raise NotImplementedError

    def __enter__(self) -> "Tracer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> bool:
        self.stop()
        return False
