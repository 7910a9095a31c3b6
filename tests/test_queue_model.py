"""The Server queueing model behind bench/server_ceiling.py, on cases with known answers: hand-worked
batches, and queueing theory's mean wait of an M/D/1 queue (Pollaczek-Khinchine). The bench's
ceiling is only as good as this model. No LoadGen: nothing here is a harness run."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("queue_model", Path(__file__).resolve().parent.parent / "bench" / "queue_model.py")
queue_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(queue_model)


def test_queries_far_apart_each_take_one_batch_of_one() -> None:
    latencies = queue_model.serve_greedy(np.array([0.0, 100.0, 250.0]), [10.0, 15.0], max_batch=2)
    assert latencies.tolist() == [10.0, 10.0, 10.0]


@pytest.mark.parametrize("rate_qps", [20.0, 95.0, 140.0])  # idle gaps, a near-full queue, an overloaded one
def test_batches_of_one_end_as_the_definition_says(rate_qps: float) -> None:
    """Batches of one are served in closed form: each query ends one service time after the later of its
    arrival and the previous query's end (the definition, walked query by query here)."""
    arrivals = np.cumsum(queue_model.poisson_gaps(2_000, seed=5)) * (1000.0 / rate_qps)
    expected, free = [], 0.0
    for arrival in arrivals.tolist():
        free = max(free, arrival) + 10.0
        expected.append(free - arrival)
    assert queue_model.serve_greedy(arrivals, [10.0], max_batch=1) == pytest.approx(expected, abs=1e-6)
    assert queue_model.serve_greedy(np.array([5.0, 6.0, 40.0]), [10.0], max_batch=1).tolist() == [10.0, 19.0, 10.0]


def test_queries_that_arrive_together_are_cut_at_the_batch_limit() -> None:
    """Three at once, batches of at most 2: two complete after a batch of 2, the third waits for it
    and then takes a batch of 1."""
    latencies = queue_model.serve_greedy(np.array([0.0, 0.0, 0.0]), [10.0, 15.0], max_batch=2)
    assert latencies.tolist() == [15.0, 15.0, 25.0]


def test_queries_that_arrive_during_a_batch_form_the_next_one() -> None:
    """The first query is served alone (nothing else has arrived); the three that arrive while it is
    served go together when the worker is free, at 10 ms, and end at 10 + 20 ms."""
    latencies = queue_model.serve_greedy(np.array([0.0, 1.0, 2.0, 3.0]), [10.0, 15.0, 20.0], max_batch=3)
    assert latencies.tolist() == [10.0, 29.0, 28.0, 27.0]


def test_a_batch_limit_without_a_time_for_every_size_is_refused() -> None:
    with pytest.raises(ValueError, match="every batch size up to 3"):
        queue_model.serve_greedy(np.array([0.0]), [10.0, 15.0], max_batch=3)


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_one_sample_at_a_time_has_the_m_d_1_mean_wait(load: float) -> None:
    """Poisson arrivals, deterministic service s, one at a time: the mean time in system is
    s + load * s / (2 (1 - load)) (Pollaczek-Khinchine)."""
    service = 10.0
    gaps = queue_model.poisson_gaps(200_000, seed=1)
    arrivals = np.cumsum(gaps) * (service / load)  # rate = load / service
    mean = float(queue_model.serve_greedy(arrivals, [service], max_batch=1).mean())
    expected = service + load * service / (2 * (1 - load))
    assert mean == pytest.approx(expected, rel=0.03)


def test_the_highest_rate_within_a_bound_is_the_rate_whose_percentile_is_that_bound() -> None:
    gaps = queue_model.poisson_gaps(50_000, seed=2)
    bound = queue_model.latency_percentile(60.0, [10.0], 1, 99.0, gaps)  # the p99 at 60 QPS of a 100 QPS server
    highest = queue_model.highest_rate_within(bound, [10.0], 1, 99.0, gaps, ceiling_qps=100.0)
    assert highest == pytest.approx(60.0, rel=0.01)
    assert queue_model.highest_rate_within(5.0, [10.0], 1, 99.0, gaps, ceiling_qps=100.0) == 0.0, \
        "a bound shorter than one service time is never met"
    assert queue_model.bound_needed(0.6, [10.0], 1, 99.0, gaps, offline_qps=100.0) == bound


def test_batching_a_sample_with_others_costs_latency_against_the_ideal_server() -> None:
    """The same throughput per sample (b * 10 ms for a batch of b): at the same rate, greedy batches
    hold each sample until its batch ends, so their p99 is not below one-at-a-time service."""
    gaps = queue_model.poisson_gaps(50_000, seed=3)
    batched = queue_model.latency_percentile(80.0, [10.0 * b for b in range(1, 9)], 8, 99.0, gaps)
    ideal = queue_model.latency_percentile(80.0, [10.0], 1, 99.0, gaps)
    assert batched > ideal
