"""A queueing model of a Server SUT, to say how high a Server rate can go at a latency bound before any
harness is involved: Poisson arrivals (LoadGen's Server schedule) served by one worker that takes
whatever is waiting, up to a batch limit, as soon as it is free (the SUT's greedy batching), each
batch taking the time measured for its size. Kept free of LoadGen and ONNX Runtime so it is tested
on its own against queueing theory's known answers (tests/test_queue_model.py).

The same model with a batch limit of 1 and a batch time of 1 / (Offline rate) is an idealised server
that answers every sample on its own, in arrival order, at the full Offline rate: no batch makes a
sample wait for the others in it. With equal service times, arrival order is the best order for the
tail, so a SUT that cannot run faster than its Offline rate does not reach a higher rate at the same
bound than this one does (up to the simulation's sampling)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def poisson_gaps(queries: int, seed: int = 0) -> np.ndarray:
    """Unit-rate exponential gaps between arrivals; divided by a rate they give that rate's schedule
    (one draw serves every rate, so the latency at two rates is compared on the same arrivals)."""
    return np.random.default_rng(seed).exponential(1.0, queries)


def serve_greedy(arrivals_ms: np.ndarray, batch_ms: Sequence[float], max_batch: int) -> np.ndarray:
    """Each query's latency (ms) under greedy batching: when the worker is free it takes every query
    that has arrived (at most `max_batch`), or waits for the next one; a batch of b queries takes
    batch_ms[b - 1] and all of them complete when it ends."""
    if max_batch < 1 or len(batch_ms) < max_batch:
        raise ValueError(f"batch_ms needs a time for every batch size up to {max_batch}")
    arrivals = np.asarray(arrivals_ms, dtype=np.float64)
    if max_batch == 1:
        return _serve_one_at_a_time(arrivals, float(batch_ms[0]))
    latencies = np.empty(len(arrivals))
    free, first = 0.0, 0
    while first < len(arrivals):
        start = max(free, arrivals[first])
        waiting = int(np.searchsorted(arrivals, start, side="right"))
        end = min(first + max_batch, max(waiting, first + 1))
        free = start + batch_ms[end - first - 1]
        latencies[first:end] = free - arrivals[first:end]
        first = end
    return latencies


def _serve_one_at_a_time(arrivals: np.ndarray, service_ms: float) -> np.ndarray:
    """serve_greedy's loop for batches of one, in closed form: query i ends at
    d_i = max(d_(i-1), a_i) + s, which unrolls to (i + 1) s + max(0, max over j <= i of (a_j - j s))."""
    index = np.arange(len(arrivals), dtype=np.float64)
    ends = (index + 1) * service_ms + np.maximum(np.maximum.accumulate(arrivals - index * service_ms), 0.0)
    return ends - arrivals


def latency_percentile(rate_qps: float, batch_ms: Sequence[float], max_batch: int, percentile: float,
                       gaps: np.ndarray) -> float:
    """The latency percentile (ms) at `rate_qps`, on the arrivals `gaps` (unit rate) make at that rate."""
    arrivals = np.cumsum(gaps) * (1000.0 / rate_qps)
    return float(np.percentile(serve_greedy(arrivals, batch_ms, max_batch), percentile))


def highest_rate_within(bound_ms: float, batch_ms: Sequence[float], max_batch: int, percentile: float,
                        gaps: np.ndarray, ceiling_qps: float, steps: int = 30) -> float:
    """The highest rate (QPS, below `ceiling_qps`) whose latency percentile is within `bound_ms`, by
    bisection (latency grows with the rate); 0.0 when even a near-idle server misses the bound."""
    low, high = 0.0, ceiling_qps
    for _ in range(steps):
        middle = (low + high) / 2
        if latency_percentile(middle, batch_ms, max_batch, percentile, gaps) <= bound_ms:
            low = middle
        else:
            high = middle
    return low


def bound_needed(share: float, batch_ms: Sequence[float], max_batch: int, percentile: float, gaps: np.ndarray,
                 offline_qps: float) -> float:
    """The smallest latency bound (ms) at which `share` of the Offline rate stays within it: the
    percentile itself at that rate."""
    return latency_percentile(share * offline_qps, batch_ms, max_batch, percentile, gaps)
