"""Offline's postprocess groups (mlharness.sut.output_groups): a worker holds the outputs of several batches
and postprocesses and completes them in one call. Driven directly where the grouping itself is
asserted (the queue filled before the worker starts, completions recorded instead of reaching
LoadGen), and through a real LoadGen test where a failure must complete every sample."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlharness.sut.output_groups import MAX_GROUP_BYTES, OutputGroup
from mlharness.sut.processing import ProcessingContext
from mlharness.sut.staging import SampleError
from mlharness.sut.system_under_test import SystemUnderTest
from tests.test_sut_mutants import (
    Observer,
    RecordingCompletion,
    _answered,
    _direct,
    _loadgen,
    _parts,
    _serve_until_answered,
    _sut,
)


class Calls:
    """A postprocess that keeps how many rows each call got (and which samples, by their one-hot)."""

    def __init__(self, fail: bool = False) -> None:
        self.rows: list[list[int]] = []
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, outputs: dict[str, np.ndarray], ctx: ProcessingContext) -> np.ndarray:
        scores = outputs["scores"]
        with self._lock:
            self.rows.append([int(i) for i in np.argmax(scores, axis=1)])
        if self.fail:
            raise RuntimeError("boom in postprocess")
        return scores


def _grouped(staged: Any, backend: Any, ctx: ProcessingContext, postprocess: Any, max_batch_size: int,
             rows: int, **options: Any) -> tuple[SystemUnderTest, RecordingCompletion]:
    """An Offline SUT with groups of `rows`, its completions recorded (test_sut_mutants' _direct)."""
    return _direct(staged, backend, ctx, max_batch_size, scenario="Offline", postprocess=postprocess,
                   postprocess_group_rows=rows, **options)


def test_offline_batches_are_postprocessed_in_groups_and_each_sample_gets_its_own_row() -> None:
    """16 samples in batches of 2, groups of 8 rows: the backend sees 8 batches, the postprocess 2
    calls of 8 rows, and every query is completed with its own sample's row."""
    _, backend, staged, ctx = _parts(count=16)
    staged.load_samples(list(range(16)))
    calls = Calls()
    sut, handoff = _grouped(staged, backend, ctx, calls, max_batch_size=2, rows=8)
    assert sut.postprocess_group_rows == 8
    sut.issue_query([100 + i for i in range(16)], list(range(16)))  # all queued before the worker starts
    _serve_until_answered(sut, handoff, 16)
    assert [len(batch) for batch in backend.batches()] == [2] * 8
    assert [len(rows) for rows in calls.rows] == [8, 8]
    assert sorted(i for rows in calls.rows for i in rows) == list(range(16))
    assert handoff.completed == {100 + i: [i] for i in range(16)}
    assert sut.completed_samples == 16  # two groups answered by one worker: counted, not overwritten


def test_a_held_group_is_answered_as_soon_as_nothing_more_is_waiting() -> None:
    """Three batches queued, room for four: the worker answers the three when the queue runs dry,
    not only when the test ends (stop is called after the answers are counted)."""
    _, backend, staged, ctx = _parts(count=8)
    staged.load_samples(list(range(8)))
    calls = Calls()
    sut, handoff = _grouped(staged, backend, ctx, calls, max_batch_size=2, rows=8)
    sut.issue_query([10, 11, 12, 13, 14, 15], [0, 1, 2, 3, 4, 5])
    sut.start()
    try:
        handoff.wait_for(6)
        answered_before_stop = dict(handoff.completed)
    finally:
        sut.stop()
    assert answered_before_stop == {10 + i: [i] for i in range(6)}
    assert [len(rows) for rows in calls.rows] == [6]


def test_what_is_held_when_the_test_ends_is_answered() -> None:
    """The end mark queued behind the batches (end_serving before the caller serves): the worker
    meets it with a group held and answers the group before it returns."""
    _, backend, staged, ctx = _parts(count=8)
    staged.load_samples(list(range(8)))
    calls = Calls()
    sut, handoff = _grouped(staged, backend, ctx, calls, max_batch_size=2, rows=64, serve_on_caller=True)
    sut.issue_query([40 + i for i in range(8)], list(range(8)))
    sut.end_serving()
    sut.serve_here()  # returns at the end mark
    assert handoff.completed == {40 + i: [i] for i in range(8)}
    assert [len(rows) for rows in calls.rows] == [8]


def test_held_outputs_are_copies_so_a_backend_may_reuse_its_output_buffer() -> None:
    """A backend that returns the same array every run (as a bound output buffer is): the rows held
    from earlier batches must still be theirs when the group is answered."""
    _, backend, staged, ctx = _parts(count=8)
    staged.load_samples(list(range(8)))
    routed = backend.predict
    reused: dict[str, np.ndarray] = {}

    def predict_into_one_buffer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = routed(inputs)
        for name, value in outputs.items():
            if name not in reused:
                reused[name] = np.empty_like(value)
            reused[name][...] = value
        return dict(reused)

    backend.predict = predict_into_one_buffer  # type: ignore[method-assign]
    sut, handoff = _grouped(staged, backend, ctx, None, max_batch_size=2, rows=8)
    sut.issue_query([20 + i for i in range(8)], list(range(8)))
    _serve_until_answered(sut, handoff, 8)
    assert handoff.completed == {20 + i: [i] for i in range(8)}


def test_a_failing_group_postprocess_names_the_batch_that_fails_and_every_query_completes_empty(tmp_path: Path) -> None:
    """Through a real LoadGen test: the postprocess raises on the group, then on its first batch
    alone; the failure is of the postprocess stage and names that batch's samples, as without
    groups, and no sample is left unanswered (LoadGen ends)."""
    _, backend, staged, ctx = _parts(count=16)
    calls = Calls(fail=True)
    sut = _sut(backend, staged, ctx, max_batch_size=2, workers=1, postprocess=calls, postprocess_group_rows=8)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert isinstance(sut.failure, SampleError) and sut.failure.stage == "postprocess"
    assert "boom in postprocess" in str(sut.failure)
    first_alone = calls.rows[1] if len(calls.rows[0]) > 2 else calls.rows[0]
    assert len(first_alone) == 2 and sorted(sut.failure.indices) == sorted(first_alone)
    assert set(responses.values()) == {b""}


def test_a_postprocess_that_fails_only_on_a_group_answers_every_batch_alone() -> None:
    """A postprocess that cannot take more rows than a batch (say, a buffer of max_batch_size rows):
    the group's failure is not the run's; its batches are answered one by one, and so is every later
    batch of that worker."""
    _, backend, staged, ctx = _parts(count=16)
    staged.load_samples(list(range(16)))
    calls = Calls()

    def at_most_two_rows(outputs: dict[str, np.ndarray], ctx: ProcessingContext) -> np.ndarray:
        result = calls(outputs, ctx)
        if len(result) > 2:
            raise ValueError("a buffer of two rows")
        return result

    sut, handoff = _grouped(staged, backend, ctx, at_most_two_rows, max_batch_size=2, rows=8)
    sut.issue_query([100 + i for i in range(16)], list(range(16)))
    _serve_until_answered(sut, handoff, 16)
    assert [len(rows) for rows in calls.rows] == [8] + [2] * 8
    assert handoff.completed == {100 + i: [i] for i in range(16)}


def test_grouped_offline_under_loadgen_answers_every_sample_with_its_own_row(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=16)
    calls = Calls()
    sut = _sut(backend, staged, ctx, max_batch_size=2, workers=2, postprocess=calls, postprocess_group_rows=8)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert sut.failure is None, sut.failure
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(16)}
    assert sum(len(rows) for rows in calls.rows) == 16


@pytest.mark.parametrize("case", ["Server", "MultiStream", "SingleStream", "takes inputs", "observed",
                                  "rows not above the batch", "off"])
def test_groups_are_only_for_offline_batches_answered_from_outputs_alone(case: str) -> None:
    """Latency scenarios answer each batch at once; a postprocess that reads the batch's inputs, and
    a run under a profile (its spans are per batch), get no groups; nor do rows that a batch fills."""
    _, backend, staged, ctx = _parts(count=4)

    def with_inputs(outputs: dict[str, np.ndarray], ctx: ProcessingContext, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return outputs["scores"]

    scenario = case if case in ("Server", "MultiStream", "SingleStream") else "Offline"
    options: dict[str, Any] = {"max_batch_size": 4, "postprocess_group_rows": 64}
    if case == "takes inputs":
        options["postprocess"] = with_inputs
    elif case == "observed":
        options["observer"] = Observer()
    elif case == "rows not above the batch":
        options["postprocess_group_rows"] = 4
    elif case == "off":
        options["postprocess_group_rows"] = 0
    assert _sut(backend, staged, ctx, scenario, **options).postprocess_group_rows == 0
    assert _sut(backend, staged, ctx, "Offline", max_batch_size=4, postprocess_group_rows=64).postprocess_group_rows == 64


# ---- the group itself ---------------------------------------------------------------------------

def _batch(first: int, count: int, width: int = 3, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    return {"y": np.arange(first * width, (first + count) * width, dtype=dtype).reshape(count, width)}


def test_a_group_holds_batches_row_after_row_until_the_next_would_not_fit() -> None:
    group = OutputGroup(max_rows=7)
    assert group.take([1, 2], [0, 1], _batch(0, 2))
    assert group.take([3, 4], [2, 3], _batch(2, 2))
    assert group.take([5, 6], [4, 5], _batch(4, 2))
    assert not group.take([7, 8], [6, 7], _batch(6, 2)), "one row of room: a batch of two not taken"
    assert group.ids == [1, 2, 3, 4, 5, 6] and group.indices == [0, 1, 2, 3, 4, 5]
    np.testing.assert_array_equal(group.outputs()["y"], _batch(0, 6)["y"])
    group.clear()
    assert group.rows == 0 and group.take([7, 8], [6, 7], _batch(6, 2))
    np.testing.assert_array_equal(group.outputs()["y"], _batch(6, 2)["y"])


@pytest.mark.parametrize("other", ["wider rows", "another type", "another name", "a list", "rows off by one"])
def test_a_batch_unlike_the_held_ones_is_not_taken(other: str) -> None:
    group = OutputGroup(max_rows=8)
    assert group.take([1, 2], [0, 1], _batch(0, 2))
    batch: dict[str, Any] = {"wider rows": _batch(2, 2, width=4), "another type": _batch(2, 2, dtype=np.float64),
                             "another name": {"z": _batch(2, 2)["y"]}, "a list": {"y": [[0.0] * 3] * 2},
                             "rows off by one": _batch(2, 3)}[other]
    assert not group.take([3, 4], [2, 3], batch)
    assert group.rows == 2 and group.ids == [1, 2]


def test_an_empty_group_takes_a_new_row_shape_and_a_batch_larger_than_its_rows() -> None:
    group = OutputGroup(max_rows=4)
    assert group.take([1], [0], _batch(0, 1))
    group.clear()
    assert group.take([2, 3], [1, 2], _batch(1, 2, width=5)), "new rows once nothing is held"
    group.clear()
    assert group.take(list(range(6)), list(range(6)), _batch(0, 6, width=5)), "a batch above max_rows alone"
    assert group.rows == 6 and not group.take([6], [6], _batch(6, 1, width=5))


def test_a_group_of_large_rows_holds_fewer_of_them() -> None:
    """Rows of 1 MiB: a group asked for 64 rows holds what fits in MAX_GROUP_BYTES."""
    width = (1 << 20) // 4
    group = OutputGroup(max_rows=64)
    taken = 0
    while group.take([taken], [taken], {"y": np.zeros((1, width), np.float32)}):
        taken += 1
    assert taken == MAX_GROUP_BYTES >> 20
