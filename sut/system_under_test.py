"""The SUT LoadGen drives. SingleStream runs each query inline in LoadGen's issue thread; Offline,
Server and MultiStream go through a batching queue served by worker threads; a query of several
batches (Offline) is cut into runs of consecutive staged rows where it can be, which are fed as
views of the staged arrays, and other batches are gathered into a per-worker buffer. Queries complete
with responses that point into the batch's result buffer (see mlharness.sut.handoff). Each batch's result is
checked against the manifest's declared result (ResultContract) before LoadGen sees it.

A failure in user code or the backend stops the work: it is recorded with the sample indices,
every outstanding and later query is completed empty so LoadGen ends promptly (no hang), and
the run is marked failed by the caller."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from mlharness.specs.manifests import TensorSpec
from mlharness.sut.backends.base import Backend
from mlharness.sut.handoff import Handoff
from mlharness.sut.output_groups import OutputGroup
from mlharness.sut.processing import ProcessingContext, batch_result_function, takes_inputs
from mlharness.sut.staging import SampleError, StagedSamples, declared_text, got_text

INLINE_SCENARIOS = ("SingleStream",)


@dataclass(frozen=True)
class BatchTimes:
    """perf_counter_ns stamps of one batch, for tracers (issued = when LoadGen handed it over)."""

    worker: int
    sample_indices: Sequence[int]
    issued_ns: int
    started_ns: int
    gathered_ns: int
    predicted_ns: int
    postprocessed_ns: int
    completed_ns: int


class BatchObserver(Protocol):
    def batch(self, times: BatchTimes) -> None: ...


class ResultContract:
    """What a batch's result must be, from the manifest (its `result`, else its first output): a numpy
    array of the declared element type, one row per sample, each row of the declared rank and fixed
    dims (symbolic dims other than batch may be any size). Checked per batch in the timed path, so
    the usual check is one dtype and one tuple comparison against what was worked out here."""

    def __init__(self, spec: TensorSpec):
        self.spec = spec
        row = spec.sample_shape()
        self.dtype = np.dtype(spec.element_type)
        self.ndim = len(row) + 1
        self.fixed = tuple((axis, dim) for axis, dim in enumerate(row) if isinstance(dim, int))
        # The row shape last seen to fit: the declared one when it has no symbolic dims.
        self.fitting_row_shape = row if len(self.fixed) == len(row) else None

    def check(self, result: Any, sample_indices: Sequence[int]) -> None:
        """Return when `result` fits, else raise SampleError naming the samples, declared and got."""
        if isinstance(result, np.ndarray) and result.ndim == self.ndim and (
                result.dtype is self.dtype or result.dtype == self.dtype):
            row_shape = result.shape[1:]
            if row_shape == self.fitting_row_shape:
                return
            if all(row_shape[axis] == dim for axis, dim in self.fixed):
                self.fitting_row_shape = row_shape
                return
        raise SampleError(sample_indices, "postprocess", f"returned result {self.spec.name!r} as {got_text(result)}; "
                                                         f"the manifest declares {declared_text(self.spec, 'row')}")


def rows_in_runs(rows: np.ndarray) -> np.ndarray:
    """An order of `rows` (staged row numbers, repeats allowed) that walks the rows upwards once per
    round: every row's first occurrence in row order, then every second occurrence, and so on. Cut
    into batches, a round with no missing rows gives runs of consecutive rows, which the worker feeds
    as views of the staged arrays (no gather). The plain loop a user compares against feeds such
    slices; LoadGen's Offline order is random, and any order is allowed there."""
    rows = np.asarray(rows, dtype=np.int64)
    by_row = np.argsort(rows, kind="stable")
    sorted_rows = rows[by_row]
    starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    occurrence = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    return by_row[np.lexsort((sorted_rows, occurrence))]


class FirstFailure:
    """A SUT's first failure, kept once under a lock (the tensor SUT here, the token SUT in mlharness.sut.llm):
    once set, every query completes empty so LoadGen ends, and the runner raises it. The SUT sets
    `failure = None` and `_fail_lock` in its __init__."""
    failure: BaseException | None
    _fail_lock: threading.Lock

    def _fail(self, sample_indices: Sequence[int], stage: str, exc: BaseException) -> None:
        with self._fail_lock:
            if self.failure is None:
                self.failure = exc if isinstance(exc, SampleError) else SampleError(sample_indices, stage, exc)

    def fail_staging(self, exc: BaseException) -> None:
        """LoadQuerySamples failed: remember it; every query from now on completes empty."""
        with self._fail_lock:
            if self.failure is None:
                self.failure = exc


class SystemUnderTest(FirstFailure):
    def __init__(self, *, backend: Backend, staged: StagedSamples, handoff: Handoff, scenario: str,
                 postprocess: Callable[[dict[str, np.ndarray], ProcessingContext], Any] | None,
                 ctx: ProcessingContext, max_batch_size: int = 1, workers: int = 1,
                 observer: BatchObserver | None = None, result_spec: TensorSpec | None = None,
                 issue_queue: Any = None, batch_wait_s: float = 0.0, serve_on_caller: bool = False,
                 postprocess_group_rows: int = 0):
        self.backend = backend
        self.staged = staged
        self.handoff = handoff
        self.scenario = scenario
        self.result_of = batch_result_function(postprocess)
        self.ctx = ctx
        self.max_batch_size = max(1, max_batch_size if backend.supports_batching else 1)
        self.workers = max(1, workers)
        self.observer = observer
        # What each batch's result must be (the model's `result`, else its first output); None: unchecked.
        self.result_contract = ResultContract(result_spec) if result_spec is not None else None
        self.failure: SampleError | BaseException | None = None
        self.inline = scenario in INLINE_SCENARIOS
        # The native issue path (Server): LoadGen's C SUT fills `issue_queue` (mlharness.sut._native.IssueQueue)
        # without the GIL, and the workers take batches from it, waiting up to batch_wait_s for a batch
        # to fill. None: LoadGen calls issue_query through the Python binding.
        self.issue_queue = None if self.inline else issue_queue
        self.batch_wait_s = max(0.0, float(batch_wait_s))
        # One worker that is the caller's own thread (serve_here, while LoadGen's test runs on another:
        # mlharness.running.loadgen_test.run_test_beside_caller). For torch on the CPU: its OpenMP runtime makes
        # parallel regions slow on a second live thread once the first has run some (docs/tuning.md).
        self.serve_on_caller = bool(serve_on_caller) and self.workers == 1 and not self.inline
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._fail_lock = threading.Lock()
        self._batch_buffers = [dict() for _ in range(self.workers + 1)]  # per worker; the last is inline
        # Offline: each worker holds batches' outputs and postprocesses and completes them together,
        # up to this many rows (mlharness.sut.output_groups). Not for a postprocess that reads the batch's
        # inputs (they are not held), nor under an observer (its spans are per batch).
        groups = scenario == "Offline" and not self.inline and observer is None and not takes_inputs(postprocess) \
            and int(postprocess_group_rows) > self.max_batch_size
        self.postprocess_group_rows = int(postprocess_group_rows) if groups else 0
        self._groups = [OutputGroup(self.postprocess_group_rows) for _ in range(self.workers)] if groups else None
        # Samples staged on a GPU gather their batches there (mlharness.sut.device_staging); the CPU path is untouched.
        device_gather = getattr(staged, "device_gather", None)
        if device_gather is not None:
            self._inputs_for = device_gather  # type: ignore[method-assign]
        # Samples answered, one count per worker (the last inline), each written by its worker only:
        # a progress display reads their sum from its own thread (mlharness.running.progress).
        self._completed = [0] * (self.workers + 1)
        import mlperf_loadgen as lg

        self._lg = lg

    @property
    def completed_samples(self) -> int:
        """Samples answered with a result so far (not those completed empty after a failure)."""
        return sum(self._completed)

    # LoadGen callbacks ---------------------------------------------------------------------
    def issue_query(self, query_ids: list[int], sample_indices: list[int]) -> None:
        """ConstructFastSUT's issue callback: ids and sample indices as two lists."""
        # Timing stamps only when a tracer listens (profiling): the unobserved path skips the clock.
        issued = time.perf_counter_ns() if self.observer is not None else 0
        if self.failure is not None:
            self._complete_empty(query_ids)
        elif self.inline:
            self._run_batch(len(self._batch_buffers) - 1, query_ids, sample_indices, issued)
        else:
            step = self.max_batch_size
            if len(query_ids) > step:  # a query of several batches (Offline): batches of consecutive rows
                query_ids, sample_indices = self._in_row_runs(query_ids, sample_indices)
            for start in range(0, len(query_ids), step):
                self._queue.put((query_ids[start:start + step], sample_indices[start:start + step], issued))

    def _in_row_runs(self, query_ids: list[int], sample_indices: list[int]) -> tuple[list[int], list[int]]:
        """The query's samples reordered so that its batches are runs of consecutive staged rows where
        the counts allow (see rows_in_runs); as given when a sample is not staged (the worker reports it)."""
        try:
            rows = self.staged.rows(sample_indices)
        except Exception:
            return query_ids, sample_indices
        order = rows_in_runs(rows).tolist()
        return [query_ids[i] for i in order], [sample_indices[i] for i in order]

    def flush_queries(self) -> None:
        """Nothing is held back: workers take whatever is queued, so there is nothing to flush."""

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self.inline or self.serve_on_caller:
            return  # LoadGen's issue thread serves (inline), or the caller does (serve_here)
        for worker in range(self.workers):
            thread = threading.Thread(target=self._serve_loop, args=(worker,), name=f"mlharness-worker-{worker}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def serve_here(self) -> None:
        """Serve as the one worker on the calling thread until `end_serving` (serve_on_caller)."""
        self._serve_loop(0)

    def _serve_loop(self, worker: int) -> None:
        """One worker's loop: over the Python queue, or over the native issue queue (Server)."""
        (self._serve if self.issue_queue is None else self._serve_native)(worker)

    def end_serving(self) -> None:
        """The test is over: `serve_here` returns once what was queued before this is served."""
        self._close_intake(1)

    def stop(self) -> None:
        self._close_intake(len(self._threads))
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _close_intake(self, workers: int) -> None:
        """No queries after this: the native issue queue closes (every worker taking from it returns),
        or the Python queue gets an end mark for each of `workers`, behind what is already queued."""
        if self.issue_queue is not None:
            self.issue_queue.close()
        else:
            for _ in range(workers):
                self._queue.put(None)

    # work ---------------------------------------------------------------------------------------
    def _serve(self, worker: int) -> None:
        get = self._queue.get
        group = self._groups[worker] if self._groups is not None else None
        while True:
            if group is not None and group.rows:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:  # nothing waiting: answer what is held before blocking
                    self._finish_group(worker, group)
                    item = get()
            else:
                item = get()
            if item is None:
                if group is not None:
                    self._finish_group(worker, group)
                return
            ids, indices, issued = item
            # Coalesce what is already waiting (Server) up to the batch limit; never wait for more.
            while len(ids) < self.max_batch_size:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                ids = ids + more[0]
                indices = indices + more[1]
                if len(ids) > self.max_batch_size:
                    # Put the overflow back at the end; order within Server is by arrival anyway.
                    self._queue.put((ids[self.max_batch_size:], indices[self.max_batch_size:], more[2]))
                    ids, indices = ids[: self.max_batch_size], indices[: self.max_batch_size]
            if self.failure is not None:
                if group is not None:
                    self._finish_group(worker, group)
                self._complete_empty(ids)
            else:
                self._run_batch(worker, ids, indices, issued, group)

    def _serve_native(self, worker: int) -> None:
        """A worker of the native issue path: batches from the IssueQueue, taken with the GIL released."""
        take, limit, wait = self.issue_queue.take, self.max_batch_size, self.batch_wait_s
        while True:
            taken = take(limit, 0.1, wait)
            if taken is None:
                return  # closed: the test is over
            ids, indices = taken
            if not ids:
                continue
            if self.failure is not None:
                self._complete_empty(ids)
            else:
                self._run_batch(worker, ids, indices, time.perf_counter_ns() if self.observer is not None else 0)

    def _inputs_for(self, worker: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        arrays = self.staged.arrays
        first, count = int(rows[0]), len(rows)
        if count == 1 or (int(rows[-1]) - first == count - 1 and bool((np.diff(rows) == 1).all())):
            return {name: staged[first:first + count] for name, staged in arrays.items()}  # a view, no copy
        buffers = self._batch_buffers[worker]
        feed = {}
        for name, staged in arrays.items():
            buffer = buffers.get(name)
            if buffer is None or buffer.shape[0] < len(rows) or buffer.shape[1:] != staged.shape[1:] or buffer.dtype != staged.dtype:
                buffer = np.empty((self.max_batch_size, *staged.shape[1:]), staged.dtype)
                buffers[name] = buffer
            out = buffer[: len(rows)]
            self.handoff.gather(staged, rows, out)
            feed[name] = out
        return feed

    def _run_batch(self, worker: int, query_ids: list[int], sample_indices: list[int], issued: int,
                   group: OutputGroup | None = None) -> None:
        observed = self.observer is not None
        clock = time.perf_counter_ns
        started = clock() if observed else 0
        stage = "staging"
        try:
            if len(sample_indices) == 1:
                feed = self.staged.feed_of(sample_indices[0])  # views of the staged row, no copy
            else:
                feed = self._inputs_for(worker, self.staged.rows(sample_indices))
            gathered = clock() if observed else 0
            stage = "predict"
            outputs = self.backend.predict(feed)
            predicted = clock() if observed else 0
            stage = "postprocess"
            if group is not None and self._hold(worker, group, query_ids, sample_indices, outputs):
                return
            result = self._result_rows(outputs, feed, sample_indices)
            postprocessed = clock() if observed else 0
            stage = "complete"
            self.handoff.complete(query_ids, result)
            self._completed[worker] += len(query_ids)
        except BaseException as exc:  # user code may raise anything; the run must end, not hang
            self._fail(sample_indices, stage, exc)
            self._complete_empty(query_ids)
            return
        if observed:
            self.observer.batch(BatchTimes(worker, sample_indices, issued, started, gathered, predicted,
                                           postprocessed, clock()))

    def _result_rows(self, outputs: dict[str, Any], feed: dict[str, Any] | None, sample_indices: list[int]) -> np.ndarray:
        """The postprocess's result for these outputs, checked against the manifest: one row per sample."""
        result = self.result_of(outputs, self.ctx, feed)
        if self.result_contract is not None:
            self.result_contract.check(result, sample_indices)
        result = np.ascontiguousarray(result)
        if result.ndim == 0 or result.shape[0] != len(sample_indices):
            raise ValueError(f"expected a result with {len(sample_indices)} rows (one per sample), got shape {result.shape}")
        return result

    def _hold(self, worker: int, group: OutputGroup, query_ids: list[int], sample_indices: list[int],
              outputs: dict[str, Any]) -> bool:
        """Offline: the batch's outputs join the worker's group, which is answered when it has no room
        for them, when nothing more is waiting, and at the end; False when they cannot be held, and the
        batch is answered alone."""
        if group.take(query_ids, sample_indices, outputs):
            return True
        if not group.rows:
            return False
        self._finish_group(worker, group)  # no room, or other shapes than those held: answer the held ones
        return group.take(query_ids, sample_indices, outputs)

    def _finish_group(self, worker: int, group: OutputGroup) -> None:
        """Postprocess and complete the held batches in one call; after a failure, complete them empty.
        When the postprocess (or the result check) fails on the group, the batches are answered one by
        one: a failure then names the batch's samples, as without groups, and a postprocess that only
        fails on more rows than a batch's answers them all (and this worker groups no more)."""
        if not group.rows:
            return
        try:
            self._answer(worker, group.ids, group.indices, group.outputs())
        except BaseException:  # noqa: BLE001 - user code may raise anything; told per batch below
            group.disabled = True
            for ids, indices, outputs in group.batches():
                self._answer(worker, ids, indices, outputs, alone=True)
        finally:
            group.clear()

    def _answer(self, worker: int, ids: list[int], indices: list[int], outputs: dict[str, Any],
                alone: bool = False) -> None:
        """Postprocess held outputs and complete their queries (empty after a failure). A failing
        postprocess raises, unless `alone` (one batch): then it is the run's failure."""
        if self.failure is not None:
            self._complete_empty(ids)
            return
        stage = "postprocess"
        try:
            result = self._result_rows(outputs, None, indices)
            stage = "complete"
            self.handoff.complete(ids, result)  # LoadGen has read the rows when this returns
            self._completed[worker] += len(ids)
        except BaseException as exc:  # the run must end, not hang
            if stage == "postprocess" and not alone:
                raise
            self._fail(indices, stage, exc)
            self._complete_empty(ids)

    def _complete_empty(self, query_ids: Sequence[int]) -> None:
        lg = self._lg
        lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in query_ids])
