"""Cold start outside LoadGen: the first inference, timed on its own, then a warm-up, both before the
timed test. Frameworks do lazy work on their first calls (ONNX Runtime grows its arena, torch picks
kernels, CUDA builds its context); the warm-up keeps that out of LoadGen's figures, and the first
inference says what it cost.

Samples are prepared here directly (load + preprocess), never staged: LoadGen stages its own in
LoadQuerySamples. A failure in user code or the backend raises the SampleError a LoadGen-time failure
would, naming the sample and the stage."""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from mlharness.sut.processing import batch_result_function
from mlharness.sut.runtime import Runtime
from mlharness.sut.staging import SampleError, StagedSamples


def first_inference_and_warm_up(runtime: Runtime, max_batch_size: int, queries: int, seconds: float) -> dict[str, Any]:
    """Time one sample through predict and postprocess, then run batches of up to `max_batch_size` of the
    dataset's first samples (cycled when it has fewer) until at least `queries` batches ran and `seconds`
    passed; queries == 0 and seconds == 0 skip the warm-up. Preparing samples is not timed."""
    result_of = batch_result_function(runtime.postprocess)
    batch_size = max(1, max_batch_size if runtime.backend.supports_batching else 1)
    warm = queries > 0 or seconds > 0
    distinct = list(range(min(batch_size if warm else 1, len(runtime.staged))))
    prepared = prepare_batch(runtime.staged, distinct)

    started = time.perf_counter()
    _infer(runtime, result_of, {name: array[:1] for name, array in prepared.items()}, 1, distinct[:1])
    first_inference = time.perf_counter() - started

    batch: dict[str, np.ndarray] = {}
    if warm:
        rows = np.arange(batch_size) % len(distinct)
        batch = {name: np.ascontiguousarray(array[rows]) for name, array in prepared.items()}
    return {"first_inference_seconds": first_inference,
            "warmup": timed_warm_up(lambda _: _infer(runtime, result_of, batch, batch_size, distinct),
                                    batch_size, queries, seconds)}


def timed_warm_up(step: Callable[[int], Any], batch_size: int, queries: int, seconds: float) -> dict[str, Any]:
    """Call step(0), step(1), ... until at least `queries` calls ran and `seconds` passed (both 0: none),
    and record them as cold_start's warm-up: batches, samples, total time and the fastest call (the
    mean counts every stall of a busy machine, the fastest call none)."""
    ran, elapsed, fastest = 0, 0.0, float("inf")
    if queries > 0 or seconds > 0:
        started = previous = time.perf_counter()
        while ran < queries or elapsed < seconds:
            step(ran)
            ran += 1
            now = time.perf_counter()
            fastest, previous = min(fastest, now - previous), now
            elapsed = now - started
    return {"queries": ran, "samples": ran * batch_size, "seconds": elapsed, "batch_size": batch_size,
            **({"fastest_query_seconds": fastest} if ran else {}),
            "requested": {"queries": queries, "seconds": seconds}}


def prepare_batch(staged: StagedSamples, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """Load and preprocess `indices` into one array per input, rows in order (as LoadQuerySamples would)."""
    per_sample = [staged._prepare(index) for index in indices]
    for index, arrays in zip(indices[1:], per_sample[1:]):
        for name, array in arrays.items():
            if array.shape != per_sample[0][name].shape:
                raise SampleError([index], "preprocess", ValueError(
                    f"input {name!r} has shape {array.shape}, the first sample had {per_sample[0][name].shape}"))
    return {name: np.stack([arrays[name] for arrays in per_sample]) for name in per_sample[0]}


def _infer(runtime: Runtime, result_of: Callable[[dict, Any, dict], Any], feed: dict[str, np.ndarray], rows: int,
           indices: Sequence[int]) -> None:
    """One batch of `rows` samples through predict and postprocess, checked as the SUT checks it."""
    stage = "predict"
    try:
        outputs = runtime.backend.predict(feed)
        stage = "postprocess"
        result = np.ascontiguousarray(result_of(outputs, runtime.ctx, feed))
        if result.ndim == 0 or result.shape[0] != rows:
            raise ValueError(f"expected a result with {rows} rows (one per sample), got shape {result.shape}")
    except Exception as exc:
        raise SampleError(indices, stage, exc) from exc
