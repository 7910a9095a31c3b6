"""The one clock of a profile: time.perf_counter_ns, which is CLOCK_MONOTONIC on Linux. Frameworks
that stamp with the realtime clock (ONNX Runtime, torch.profiler, LoadGen's trace) are moved onto
it with an offset measured once per profile."""
from __future__ import annotations

import time
from dataclasses import dataclass

now_ns = time.perf_counter_ns
CLOCK_NAME = "CLOCK_MONOTONIC (time.perf_counter_ns)"


@dataclass(frozen=True)
class ClockAnchor:
    """realtime_ns - monotonic_ns, read as a tight pair (the best of a few tries)."""

    realtime_minus_monotonic_ns: int
    uncertainty_ns: int

    @classmethod
    def measure(cls, tries: int = 16) -> "ClockAnchor":
        best: tuple[int, int] | None = None
        for _ in range(tries):
            before = time.perf_counter_ns()
            wall = time.time_ns()
            after = time.perf_counter_ns()
            width = after - before
            if best is None or width < best[1]:
                best = (wall - (before + after) // 2, width)
        assert best is not None
        return cls(best[0], max(1, best[1] // 2))

    def from_realtime(self, realtime_ns: int) -> int:
        return realtime_ns - self.realtime_minus_monotonic_ns

    def convert(self, ns: int, clock: str) -> int:
        if clock == "monotonic":
            return ns
        if clock == "realtime":
            return self.from_realtime(ns)
        raise ValueError(f"unknown clock {clock!r}")
