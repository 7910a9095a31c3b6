"""Each level's cost, measured as XSP does: the same work timed with and without the level. Before
the LoadGen test, one staged sample runs through the SUT's hot path (rows -> predict ->
postprocess -> observer) in three blocks: off, on (a fresh tracer whose records are thrown away),
off. The overhead is the on-block median over the off-blocks' median; the two off-blocks'
disagreement is the noise that figure carries."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlharness.profiling.clock import now_ns

BLOCK_SECONDS = 0.1
MIN_CALLS, MAX_CALLS = 3, 200
WARMUP_CALLS, WARMUP_SECONDS = 5, 0.1
METHOD = ("one staged sample through rows -> predict -> postprocess -> observer, batch size 1; "
          "blocks off/on/off; overhead = median(on) / median(off) - 1; noise = |off1 - off2| / off")


def _hot_path(runtime: Any) -> Callable[[Callable[[Any], None] | None], int]:
    from mlharness.sut.system_under_test import BatchTimes

    staged, backend, postprocess, ctx = runtime.staged, runtime.backend, runtime.postprocess, runtime.ctx

    def call(hook: Callable[[Any], None] | None) -> int:
        start = now_ns()
        row = int(staged.rows([0])[0])
        feed = {name: array[row:row + 1] for name, array in staged.arrays.items()}
        gathered = now_ns()
        outputs = backend.predict(feed)
        predicted = now_ns()
        result = postprocess(outputs, ctx) if postprocess is not None else next(iter(outputs.values()))
        np.ascontiguousarray(result)
        done = now_ns()
        if hook is not None:
            hook(BatchTimes(0, [0], start, start, gathered, predicted, done, now_ns()))
        return now_ns() - start

    return call


def calibrate(levels: list[str], runtime: Any, make_tracer: Callable[[str, Path], Any]) -> dict[str, Any]:
    """`make_tracer(level, scratch_dir)` -> a fresh tracer, or None when the level is unavailable."""
    staged = runtime.staged
    staged.load_samples([0])
    try:
        call = _hot_path(runtime)
        # Warm up (first calls allocate, pick kernels, spin up thread pools) before sizing the blocks.
        warm, began = [], now_ns()
        while len(warm) < WARMUP_CALLS or (now_ns() - began < WARMUP_SECONDS * 1e9 and len(warm) < MAX_CALLS):
            warm.append(call(None))
        typical = statistics.median(warm[len(warm) // 2:])
        calls = max(MIN_CALLS, min(MAX_CALLS, int(BLOCK_SECONDS * 1e9 / max(typical, 1))))
        per_level: dict[str, Any] = {}
        for level in levels:
            with tempfile.TemporaryDirectory(prefix=f"mlharness-calibrate-{level}-") as scratch:
                tracer = make_tracer(level, Path(scratch))
                if tracer is None:
                    continue
                per_level[level] = _measure(call, tracer, calls)
    finally:
        staged.unload_samples([0])
    return {"method": METHOD, "calls_per_block": calls, "per_level": per_level}


def _measure(call: Callable[[Any], int], tracer: Any, calls: int) -> dict[str, Any]:
    off1 = [call(None) for _ in range(calls)]
    with tracer:
        hook = getattr(tracer, "batch", None)
        call(hook)  # the first call under a new profiler pays its set-up; not counted
        on = [call(hook) for _ in range(calls)]
    off2 = [call(None) for _ in range(calls)]
    off = statistics.median(off1 + off2)
    on_median = statistics.median(on)
    return {"off_ms": round(off / 1e6, 4), "on_ms": round(on_median / 1e6, 4),
            "overhead_pct": round(100 * (on_median / off - 1), 2),
            "noise_pct": round(100 * abs(statistics.median(off1) - statistics.median(off2)) / off, 2)}
