"""The SystemUnderTest's own rules, each one a surviving mutant of sut/system_under_test.py made
visible (issue 20; see docs/mutation-survivors.md).

Most tests drive a real LoadGen test in this process (accuracy mode, so LoadGen logs every
response's bytes): the null-routed model answers sample i one-hot at i, so the accuracy log says
which sample each response came from and which were completed empty. Batching details that LoadGen
does not decide exactly (merging queued queries, buffers across loaded sets) are driven directly,
with the queue filled before the worker starts; there the real handoff gathers and a recorder
stands in for LoadGen's completion call only."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from mlharness.specs.manifests import load_manifest
from mlharness.sut.backends.null_backend import NullBackend
from mlharness.sut.handoff import load_handoff
from mlharness.sut.processing import ProcessingContext
from mlharness.sut.staging import SampleError, StagedSamples
from mlharness.sut.system_under_test import BatchTimes, ResultContract, SystemUnderTest, rows_in_runs
from tests.support import REPO, loadgen_hang_guard, write_manifest

MODEL = REPO / "specs" / "models" / "null-routed.yaml"
HARDWARE = REPO / "specs" / "hardware" / "cpu.yaml"
SCORES = 1024  # null-routed's output row: 1024 float32 scores, one-hot at the sample index
HANG_SECONDS = 10


class Probe(NullBackend):
    """The null backend in routing mode, keeping every input batch it received (the arrays
    themselves, so their memory can be compared) and the thread that sent it; `fail_on` makes the
    batch holding that sample raise; `batching` is what the backend says it supports."""

    fail_on: int | None = None
    batching = True

    def load(self) -> None:
        super().load()
        self.got: list[tuple[str, np.ndarray]] = []  # the arrays themselves (a reused buffer changes)
        self.keys: list[list[int]] = []  # the sample indices each batch held when it came
        self._lock = threading.Lock()
        routed = self.predict

        def predict(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with self._lock:
                self.got.append((threading.current_thread().name, inputs["x"]))
                self.keys.append([int(v) for v in inputs["x"][:, 0]])
            if self.fail_on is not None and self.fail_on in {int(v) for v in inputs["x"][:, 0]}:
                raise RuntimeError(f"boom at {self.fail_on}")
            return routed(inputs)

        self.predict = predict  # type: ignore[method-assign]

    @property
    def supports_batching(self) -> bool:
        return self.batching

    def batches(self) -> list[list[int]]:
        return self.keys


def _parts(model_path: Path = MODEL, count: int = 16, preprocess: Callable[..., Any] | None = None,
           **probe: Any) -> tuple[Any, Probe, StagedSamples, ProcessingContext]:
    model = load_manifest(model_path)
    backend = Probe(model, {}, load_manifest(HARDWARE))
    for key, value in probe.items():
        setattr(backend, key, value)
    backend.load()
    ctx = ProcessingContext(attributes=dict(model.attributes), model=model)
    staged = StagedSamples([(i, i) for i in range(count)], model.inputs,
                           preprocess or (lambda sample, ctx: np.array([sample], dtype=np.float32)), None, ctx)
    return model, backend, staged, ctx


def _loadgen(sut: SystemUnderTest, staged: StagedSamples, scenario: str, logdir: Path,
             load: Callable[[list[int]], None] | None = None) -> dict[int, bytes]:
    """One real LoadGen accuracy test over `sut`, in this process; every sample's logged response
    bytes by sample index (b"" for a query completed empty)."""
    import mlperf_loadgen as lg

    from mlharness.sut.loadgen_handles import loadgen_handles

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.AccuracyOnly
    settings.offline_expected_qps = 1000
    settings.server_target_qps = 1000
    settings.single_stream_expected_latency_ns = 1_000_000
    settings.multi_stream_expected_latency_ns = 8_000_000
    settings.min_query_count = 1
    settings.min_duration_ms = 0
    log = lg.LogSettings()
    log.log_output.outdir = str(logdir)
    log.log_output.copy_summary_to_stdout = False
    logdir.mkdir(parents=True, exist_ok=True)
    total = len(staged)
    # A query the SUT never completes would keep LoadGen waiting in this process for ever: past
    # HANG_SECONDS (a test takes well under one), dump every thread's stack and end the process.
    with loadgen_hang_guard(HANG_SECONDS), \
            loadgen_handles(sut, total, total, load or staged.load_samples, staged.unload_samples) as (lg_sut, qsl):
        def start_test() -> None:
            lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, str(logdir / "no-audit.config"))

        if sut.serve_on_caller:  # this thread serves, the test runs beside it (as the runner does)
            from mlharness.running.loadgen_test import run_test_beside_caller

            run_test_beside_caller(start_test, sut.serve_here, sut.end_serving)
        else:
            start_test()
    logged = json.loads((logdir / "mlperf_log_accuracy.json").read_text())
    responses: dict[int, bytes] = {}
    for entry in logged:
        assert entry["qsl_idx"] not in responses, f"sample {entry['qsl_idx']} answered twice"
        responses[entry["qsl_idx"]] = bytes.fromhex(entry["data"])
    assert sorted(responses) == list(range(total)), "every sample answered once"
    return responses


def _answered(data: bytes) -> int:
    """The sample a routed response is for (its one-hot index)."""
    scores = np.frombuffer(data, dtype=np.float32)
    assert scores.shape == (SCORES,) and scores.sum() == 1.0
    return int(np.argmax(scores))


def _sut(backend: Probe, staged: StagedSamples, ctx: ProcessingContext, scenario: str = "Offline",
         **options: Any) -> SystemUnderTest:
    model = load_manifest(MODEL)
    options.setdefault("result_spec", model.outputs[0])
    return SystemUnderTest(backend=backend, staged=staged, handoff=load_handoff(), scenario=scenario,
                           postprocess=options.pop("postprocess", None), ctx=ctx, **options)


class Observer:
    def __init__(self) -> None:
        self.times: list[BatchTimes] = []
        self._lock = threading.Lock()

    def batch(self, times: BatchTimes) -> None:
        with self._lock:
            self.times.append(times)


def _assert_stamped_in_order(times: BatchTimes) -> None:
    stamps = [times.issued_ns, times.started_ns, times.gathered_ns, times.predicted_ns, times.postprocessed_ns,
              times.completed_ns]
    assert all(isinstance(stamp, int) for stamp in stamps), stamps
    assert stamps == sorted(stamps), f"each stage stamped after the one before: {stamps}"


# ---- real LoadGen ---------------------------------------------------------------------------------

def test_defaults_are_one_worker_and_batches_of_one(tmp_path: Path) -> None:
    """Without max_batch_size and workers: one worker thread (a daemon, so a stuck backend cannot
    keep the process alive), batches of one sample, every response its own sample's."""
    _, backend, staged, ctx = _parts(count=8)
    model = load_manifest(MODEL)
    sut = SystemUnderTest(backend=backend, staged=staged, handoff=load_handoff(), scenario="Offline",
                          postprocess=None, ctx=ctx, result_spec=model.outputs[0])
    workers: list[threading.Thread] = []
    load = staged.load_samples

    def load_and_look(indices: list[int]) -> None:  # called by LoadGen once the SUT has started
        workers.extend(t for t in threading.enumerate() if t.name.startswith("mlharness-worker-"))
        load(indices)

    responses = _loadgen(sut, staged, "Offline", tmp_path, load_and_look)
    assert [t.name for t in workers] == ["mlharness-worker-0"]
    assert sut.completed_samples == 8
    assert all(t.daemon for t in workers)
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(8)}
    assert sorted(backend.batches()) == [[i] for i in range(8)]
    assert {thread for thread, _ in backend.got} == {"mlharness-worker-0"}


@pytest.mark.parametrize("workers", [1, 3])
def test_worker_threads_are_daemons_named_by_index(tmp_path: Path, workers: int) -> None:
    _, backend, staged, ctx = _parts(count=8)
    sut = _sut(backend, staged, ctx, max_batch_size=2, workers=workers)
    seen: list[threading.Thread] = []

    def load(indices: list[int]) -> None:
        seen.extend(t for t in threading.enumerate() if t.name.startswith("mlharness-worker-"))
        staged.load_samples(indices)

    assert sut.completed_samples == 0
    _loadgen(sut, staged, "Offline", tmp_path, load)
    assert sut.completed_samples == 8, "counted over every worker"
    assert sorted(t.name for t in seen) == [f"mlharness-worker-{i}" for i in range(workers)]
    assert all(t.daemon for t in seen)
    assert not any(t.is_alive() for t in seen), "stopped with the test"


def test_a_backend_without_batching_gets_one_sample_at_a_time(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=8, batching=False)
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1)
    assert sut.max_batch_size == 1
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert sorted(backend.batches()) == [[i] for i in range(8)]
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(8)}


def test_max_batch_size_one_is_kept(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=6)
    sut = _sut(backend, staged, ctx, max_batch_size=1, workers=1)
    _loadgen(sut, staged, "Offline", tmp_path)
    assert sorted(backend.batches()) == [[i] for i in range(6)]


def test_the_observer_gets_each_batch_with_its_worker_samples_and_stamps(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=12)
    observer = Observer()
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1, observer=observer)
    _loadgen(sut, staged, "Offline", tmp_path)
    assert [list(t.sample_indices) for t in observer.times] == backend.batches()
    assert sorted(s for t in observer.times for s in t.sample_indices) == list(range(12))
    assert [len(t.sample_indices) for t in observer.times] == [4, 4, 4]
    assert {t.worker for t in observer.times} == {0}
    for times in observer.times:
        _assert_stamped_in_order(times)
    assert len({t.issued_ns for t in observer.times}) == 1, "one Offline query: one issue time for its batches"


@pytest.mark.parametrize("workers", [1, 2])
def test_singlestream_runs_inline_and_reports_the_slot_after_the_workers(tmp_path: Path, workers: int) -> None:
    """SingleStream's queries run in LoadGen's issue thread; a tracer sees them as worker number
    `workers` (the slot after the worker threads'), with stamps in order."""
    _, backend, staged, ctx = _parts(count=6)
    observer = Observer()
    sut = _sut(backend, staged, ctx, scenario="SingleStream", max_batch_size=4, workers=workers, observer=observer)
    responses = _loadgen(sut, staged, "SingleStream", tmp_path)
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(6)}
    assert not any(thread.startswith("mlharness-worker-") for thread, _ in backend.got)
    assert len(observer.times) == 6
    assert {t.worker for t in observer.times} == {workers}
    assert sut.completed_samples == 6
    for times in observer.times:
        assert len(times.sample_indices) == 1
        _assert_stamped_in_order(times)


def test_a_failing_batch_names_its_samples_and_every_later_query_completes_empty(tmp_path: Path) -> None:
    """Batches of 4 through one worker; the batch holding sample 5 raises: the failure names that
    batch's samples, its stage and the exception, and that batch and every later one complete empty
    (no hang), while the batches before it keep their answers."""
    _, backend, staged, ctx = _parts(count=16, fail_on=5)
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    batches = backend.batches()
    failed_at = next(i for i, batch in enumerate(batches) if 5 in batch)
    assert isinstance(sut.failure, SampleError)
    assert sut.failure.indices == batches[failed_at]
    assert sut.failure.stage == "predict"
    assert str(sut.failure) == f"samples {batches[failed_at]}: predict raised RuntimeError: boom at 5"
    assert len(batches) == failed_at + 1, "nothing is predicted after the failure"
    answered = {s for batch in batches[:failed_at] for s in batch}
    assert sut.completed_samples == len(answered), "samples completed empty are not answered"
    for sample, data in responses.items():
        if sample in answered:
            assert _answered(data) == sample
        else:
            assert data == b"", f"sample {sample} should have completed empty"


def test_a_failing_postprocess_is_a_sample_error_of_that_stage(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=4)

    def postprocess(outputs: dict[str, np.ndarray], ctx: ProcessingContext) -> np.ndarray:
        raise KeyError("label")

    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1, postprocess=postprocess)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert isinstance(sut.failure, SampleError)
    assert (sorted(sut.failure.indices), sut.failure.stage) == ([0, 1, 2, 3], "postprocess")
    assert str(sut.failure).endswith(": postprocess raised KeyError: 'label'")
    assert set(responses.values()) == {b""}


def test_a_staging_failure_completes_every_query_empty_and_the_first_failure_stays(tmp_path: Path) -> None:
    """LoadQuerySamples failed (the runner calls fail_staging): no query reaches the backend, all
    complete empty; a later failure does not replace the first."""
    _, backend, staged, ctx = _parts(count=8)
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=2)
    first, second = RuntimeError("staging broke"), RuntimeError("later")

    def load(indices: list[int]) -> None:
        sut.fail_staging(first)
        sut.fail_staging(second)

    responses = _loadgen(sut, staged, "Offline", tmp_path, load)
    assert sut.failure is first
    assert set(responses.values()) == {b""}
    assert sut.completed_samples == 0
    assert backend.got == []


def test_a_staging_failure_after_a_batch_failure_keeps_the_batch_failure(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=4, fail_on=2)
    sut = _sut(backend, staged, ctx, scenario="SingleStream")
    _loadgen(sut, staged, "SingleStream", tmp_path)
    assert isinstance(sut.failure, SampleError) and sut.failure.indices == [2]
    kept = sut.failure
    sut.fail_staging(RuntimeError("after"))
    assert sut.failure is kept


def test_postprocess_gets_the_run_context(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=4)
    contexts: list[ProcessingContext] = []

    def postprocess(outputs: dict[str, np.ndarray], got: ProcessingContext) -> np.ndarray:
        contexts.append(got)
        return outputs["scores"]

    sut = _sut(backend, staged, ctx, max_batch_size=2, workers=1, postprocess=postprocess)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert sut.failure is None
    assert contexts and all(got is ctx for got in contexts)
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(4)}


def test_without_a_result_spec_the_result_is_not_checked(tmp_path: Path) -> None:
    """No declared result: a float64 result of any row shape goes to LoadGen as it is (8 bytes a
    value); with the declared float32 [batch, 1024] it is a SampleError."""
    _, backend, staged, ctx = _parts(count=4)

    def postprocess(outputs: dict[str, np.ndarray], ctx: ProcessingContext) -> np.ndarray:
        return np.argmax(outputs["scores"], axis=1).astype(np.float64).reshape(-1, 1)

    unchecked = _sut(backend, staged, ctx, max_batch_size=4, workers=1, postprocess=postprocess, result_spec=None)
    responses = _loadgen(unchecked, staged, "Offline", tmp_path / "unchecked")
    assert unchecked.failure is None
    assert {s: np.frombuffer(d, dtype=np.float64).tolist() for s, d in responses.items()} == {i: [float(i)] for i in range(4)}

    _, backend, staged, ctx = _parts(count=4)
    checked = _sut(backend, staged, ctx, max_batch_size=4, workers=1, postprocess=postprocess)
    _loadgen(checked, staged, "Offline", tmp_path / "checked")
    assert isinstance(checked.failure, SampleError) and checked.failure.stage == "postprocess"
    assert "float64 with shape (4, 1)" in str(checked.failure)


@pytest.mark.parametrize("scenario", ["Offline", "Server"])
def test_one_worker_can_be_the_callers_own_thread(tmp_path: Path, scenario: str) -> None:
    """serve_on_caller (torch on the CPU): no worker thread is started; every batch is predicted on the
    thread that serves (this one) while LoadGen's test runs on another, through the Python queue
    (Offline) and the native issue queue (Server), and every response is its own sample's."""
    from mlharness.sut.handoff import load_issue_queue

    _, backend, staged, ctx = _parts(count=13)
    issue_queue, _ = load_issue_queue(scenario)
    sut = _sut(backend, staged, ctx, scenario, max_batch_size=4, workers=1, serve_on_caller=True,
               issue_queue=issue_queue)
    assert sut.serve_on_caller
    responses = _loadgen(sut, staged, scenario, tmp_path)
    assert sut.failure is None
    assert {name for name, _ in backend.got} == {threading.current_thread().name}
    assert not sut._threads
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(13)}
    two = _sut(backend, staged, ctx, scenario, max_batch_size=4, workers=2, serve_on_caller=True)
    assert not two.serve_on_caller, "only a single worker is the caller's thread"


def test_a_gathered_batch_reuses_one_buffer_and_a_batch_of_one_is_a_view() -> None:
    """The timed path allocates nothing per batch: every batch of rows that are not consecutive lands
    in the same buffer (allocated once, max_batch_size rows), and a batch of one is a view of the
    staged row."""
    _, backend, staged, ctx = _parts(count=13)
    staged.load_samples(list(range(13)))
    sut, handoff = _direct(staged, backend, ctx, max_batch_size=4)
    for qids, samples in (([0, 1, 2, 3], [0, 2, 4, 6]), ([4, 5, 6, 7], [1, 3, 5, 7]),
                          ([8, 9, 10, 11], [8, 10, 9, 11]), ([12], [12])):  # 8..11: its ends are 3 apart
        sut.issue_query(qids, samples)  # each a batch of its own: none is longer than max_batch_size
    _serve_until_answered(sut, handoff, 13)
    assert backend.batches() == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 9, 11], [12]]
    gathered = [x for _, x in backend.got if len(x) == 4]
    assert len({x.__array_interface__["data"][0] for x in gathered}) == 1, "one buffer for every gathered batch"
    assert not any(np.shares_memory(x, staged.arrays["x"]) for x in gathered)
    (single,) = [x for _, x in backend.got if len(x) == 1]
    assert np.shares_memory(single, staged.arrays["x"][12])
    assert handoff.completed == {q: [s] for q, s in zip(range(13), [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 9, 11, 12])}


def test_an_offline_query_is_served_in_batches_of_consecutive_rows_fed_as_views(tmp_path: Path) -> None:
    """Real LoadGen, Offline: the 13 samples, loaded in a shuffled order, come back as batches of
    consecutive staged rows (4, 4, 4 and 1), each a view of the staged array (no gather), and every
    response is its own sample's."""
    _, backend, staged, ctx = _parts(count=13)
    shuffled = [7, 2, 11, 0, 5, 9, 12, 3, 1, 8, 10, 4, 6]
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1)
    loaded: list[np.ndarray] = []

    def load(indices: list[int]) -> None:
        staged.load_samples(shuffled)
        loaded.append(staged.arrays["x"])  # LoadGen unloads it at the end

    responses = _loadgen(sut, staged, "Offline", tmp_path, load=load)
    assert sut.failure is None
    assert [len(batch) for batch in backend.batches()] == [4, 4, 4, 1]
    assert backend.batches() == [shuffled[0:4], shuffled[4:8], shuffled[8:12], shuffled[12:]]
    assert all(np.shares_memory(x, loaded[0]) for _, x in backend.got)
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(13)}


def test_a_query_with_repeated_samples_walks_the_rows_once_per_round() -> None:
    """Offline's query repeats samples: rows_in_runs orders them as rounds over the rows (every row's
    first occurrence in row order, then the second ones, ...), a permutation of the query; the SUT
    feeds the batches of a full round as views and gathers the others, and each query id still gets
    its own sample's answer."""
    rows = np.array([3, 1, 1, 0, 2, 3, 3, 0])
    order = rows_in_runs(rows)
    assert sorted(order.tolist()) == list(range(len(rows)))
    assert rows[order].tolist() == [0, 1, 2, 3, 0, 1, 3, 3]
    assert order.tolist()[:2] == [3, 1], "a repeated row keeps its occurrences in query order"

    _, backend, staged, ctx = _parts(count=8)
    staged.load_samples(list(range(8)))
    sut, handoff = _direct(staged, backend, ctx, max_batch_size=4)
    samples = [5, 0, 6, 1, 3, 7, 2, 4, 6, 1, 0, 2, 6]  # rounds: 0-7 (all), then 0, 1, 2, 6, then 6
    sut.issue_query(list(range(100, 113)), samples)
    _serve_until_answered(sut, handoff, 13)
    assert backend.batches() == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 6], [6]]
    views = [np.shares_memory(x, staged.arrays["x"]) for _, x in backend.got]
    assert views == [True, True, False, True]
    assert handoff.completed == {100 + i: [s] for i, s in enumerate(samples)}


# ---- the contract --------------------------------------------------------------------------------

def test_a_result_of_an_equal_dtype_object_fits() -> None:
    """The declared dtype is compared by value: a float32 dtype carrying metadata is another
    object than np.dtype('float32') but the same type."""
    contract = ResultContract(load_manifest(MODEL).outputs[0])
    tagged = np.dtype(np.float32, metadata={"unit": "score"})
    assert tagged is not contract.dtype and tagged == contract.dtype
    contract.check(np.zeros((3, SCORES), dtype=tagged), [0, 1, 2])
    with pytest.raises(SampleError):
        contract.check(np.zeros((3, SCORES), dtype=np.float64), [0, 1, 2])


# ---- driven directly: the queue filled before the worker starts ----------------------------------

class RecordingCompletion:
    """The real handoff's gather; completion recorded by query id instead of reaching LoadGen
    (no LoadGen test is running here)."""

    name = "recording"

    def __init__(self) -> None:
        self.real = load_handoff()
        self.completed: dict[int, list[int]] = {}
        self._lock = threading.Lock()

    def gather(self, staged: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        self.real.gather(staged, rows, out)

    def complete(self, query_ids: list[int], results: np.ndarray) -> None:
        with self._lock:
            for qid, row in zip(query_ids, results):
                assert int(qid) not in self.completed, f"query {qid} completed twice"
                self.completed[int(qid)] = [int(np.argmax(row))]

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 20
        while len(self.completed) < count and time.monotonic() < deadline:
            time.sleep(0.005)


def _direct(staged: StagedSamples, backend: Probe, ctx: ProcessingContext, max_batch_size: int,
            model_path: Path = MODEL, scenario: str = "Server", postprocess: Callable[..., Any] | None = None,
            **options: Any) -> tuple[SystemUnderTest, RecordingCompletion]:
    """One worker over a recording completion (no LoadGen test runs); `options` go to the SUT."""
    handoff = RecordingCompletion()
    sut = SystemUnderTest(backend=backend, staged=staged, handoff=handoff, scenario=scenario, postprocess=postprocess,
                          ctx=ctx, max_batch_size=max_batch_size, workers=1,
                          result_spec=load_manifest(model_path).outputs[0], **options)
    return sut, handoff


def _serve_until_answered(sut: SystemUnderTest, handoff: RecordingCompletion, count: int) -> None:
    """Start the workers on what is queued, wait for `count` answers, stop; the run must be clean."""
    sut.start()
    try:
        handoff.wait_for(count)
    finally:
        sut.stop()
    assert sut.failure is None, sut.failure


def test_queries_that_exactly_fill_a_batch_are_merged_with_nothing_left_over() -> None:
    """max_batch_size 4: queries of 2 and 2 waiting make one batch of 4, and no empty remainder is
    put back (the backend never gets an empty batch, even after the last query)."""
    _, backend, staged, ctx = _parts(count=8)
    staged.load_samples(list(range(8)))
    sut, handoff = _direct(staged, backend, ctx, max_batch_size=4)
    sut.issue_query([10, 11], [1, 2])
    sut.issue_query([12, 13], [3, 4])
    sut.start()
    try:
        handoff.wait_for(4)
    finally:
        sut.stop()  # behind anything still queued: a remainder put back would be served first
    assert sut.failure is None
    assert backend.batches() == [[1, 2, 3, 4]]
    assert handoff.completed == {10: [1], 11: [2], 12: [3], 13: [4]}


def test_stop_serves_what_was_queued_before_it() -> None:
    """stop() queues its end marker behind the waiting queries: a worker that meets the marker while
    merging still serves the batch it holds before it ends."""
    _, backend, staged, ctx = _parts(count=8)
    staged.load_samples(list(range(8)))
    entered, release = threading.Event(), threading.Event()
    predict = backend.predict

    def slow_first(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not entered.is_set():
            entered.set()
            assert release.wait(20)
        return predict(inputs)

    backend.predict = slow_first  # type: ignore[method-assign]
    sut, handoff = _direct(staged, backend, ctx, max_batch_size=4)
    sut.issue_query([20, 21, 22, 23], [0, 1, 2, 3])
    sut.issue_query([24], [4])
    sut.start()
    assert entered.wait(20)
    # The worker is inside the first batch; [24] waits, and stop() puts its marker behind it.
    stopper = threading.Thread(target=sut.stop)
    stopper.start()
    deadline = time.monotonic() + 20
    while sut._queue.qsize() < 2 and time.monotonic() < deadline:  # [24] and the end marker
        time.sleep(0.001)
    release.set()
    stopper.join(20)
    assert not stopper.is_alive()
    assert backend.batches() == [[0, 1, 2, 3], [4]]
    assert handoff.completed == {20: [0], 21: [1], 22: [2], 23: [3], 24: [4]}


def test_buffers_follow_a_new_row_shape_when_another_set_is_loaded(tmp_path: Path) -> None:
    """An input with a symbolic dim: samples 0-3 are 1 wide, 4-7 are 2 wide. LoadGen loads one set,
    then another; the worker's gather buffer must take the new set's row shape (the queries name rows out
    of order: consecutive rows are fed as a view, with no buffer)."""
    text = MODEL.read_text().replace("    shape: [batch, 1]\n", "    shape: [batch, width]\n", 1)
    model_path = write_manifest(tmp_path, "null-routed.yaml", text)

    def preprocess(sample: int, ctx: ProcessingContext) -> np.ndarray:
        return np.full(1 + sample // 4, sample, dtype=np.float32)

    _, backend, staged, ctx = _parts(model_path, count=8, preprocess=preprocess)
    sut, handoff = _direct(staged, backend, ctx, max_batch_size=4, model_path=model_path)
    sut.start()
    try:
        staged.load_samples([0, 1, 2, 3])
        sut.issue_query([30, 31, 32, 33], [0, 2, 1, 3])
        handoff.wait_for(4)
        staged.unload_samples([0, 1, 2, 3])
        staged.load_samples([4, 5, 6, 7])
        sut.issue_query([34, 35, 36, 37], [4, 6, 5, 7])
        handoff.wait_for(8)
    finally:
        sut.stop()
    assert sut.failure is None, sut.failure
    assert [x.shape for _, x in backend.got] == [(4, 1), (4, 2)]
    assert handoff.completed == {30: [0], 31: [2], 32: [1], 33: [3], 34: [4], 35: [6], 36: [5], 37: [7]}


def test_a_postprocess_that_takes_inputs_gets_the_batchs_inputs(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=8)
    seen: list[list[int]] = []

    def postprocess(outputs: dict[str, np.ndarray], ctx: ProcessingContext, inputs: dict[str, np.ndarray]) -> np.ndarray:
        seen.append([int(v) for v in inputs["x"][:, 0]])
        return outputs["scores"]

    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1, postprocess=postprocess)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert sut.failure is None
    assert seen == backend.batches()
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(8)}


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_a_result_without_one_row_per_sample_is_a_postprocess_error(tmp_path: Path, declared: bool) -> None:
    """The declared row shape fits (or nothing is declared) and the row count is still wrong."""
    _, backend, staged, ctx = _parts(count=4)
    options = {} if declared else {"result_spec": None}
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1, postprocess=lambda outputs, ctx: outputs["scores"][:1],
               **options)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert isinstance(sut.failure, SampleError) and sut.failure.stage == "postprocess"
    assert str(sut.failure).endswith(": postprocess raised ValueError: expected a result with 4 rows (one per "
                                     "sample), got shape (1, 1024)")
    assert set(responses.values()) == {b""}


def test_a_one_dimensional_result_is_one_value_per_sample(tmp_path: Path) -> None:
    _, backend, staged, ctx = _parts(count=4)
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1, result_spec=None,
               postprocess=lambda outputs, ctx: np.argmax(outputs["scores"], axis=1).astype(np.int64))
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert sut.failure is None
    assert {s: np.frombuffer(d, dtype=np.int64).tolist() for s, d in responses.items()} == {i: [i] for i in range(4)}


class DeviceGatherFails(StagedSamples):
    """Staged samples whose batches are gathered elsewhere (as the GPU path's device_gather), and the
    gather breaks (a device out of memory, say)."""

    def device_gather(self, worker: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        raise RuntimeError("device gather broke")


class CompletionRefused(RecordingCompletion):
    """The real handoff's gather; its completion raises, as LoadGen's C entry could."""

    name = "refusing"

    def complete(self, query_ids: list[int], results: np.ndarray) -> None:
        raise RuntimeError("completion refused")


def test_a_gather_that_fails_is_a_staging_error_of_the_batch_and_every_query_completes_empty(tmp_path: Path) -> None:
    """A batch's gather (here the device's, which replaces the host gather) raising: the run's failure
    names that batch's samples and the staging stage; LoadGen gets every query back, empty."""
    model, backend, _, ctx = _parts(count=8)
    staged = DeviceGatherFails([(i, i) for i in range(8)], model.inputs,
                               lambda sample, ctx: np.array([sample], dtype=np.float32), None, ctx)
    sut = _sut(backend, staged, ctx, max_batch_size=4, workers=1)
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert isinstance(sut.failure, SampleError) and sut.failure.stage == "staging"
    assert len(sut.failure.indices) == 4 and str(sut.failure).endswith(": staging raised RuntimeError: device gather broke")
    assert set(responses.values()) == {b""} and backend.got == []


@pytest.mark.parametrize("group_rows", [0, 8])
def test_a_completion_that_fails_is_a_complete_error_and_the_queries_complete_empty(tmp_path: Path,
                                                                                  group_rows: int) -> None:
    """The handoff's completion raising, for a batch answered alone (no groups) and for Offline's held
    group: the failure names the complete stage and the samples it held; LoadGen still gets every
    query back, empty."""
    _, backend, staged, ctx = _parts(count=8)
    sut = SystemUnderTest(backend=backend, staged=staged, handoff=CompletionRefused(), scenario="Offline",
                          postprocess=None, ctx=ctx, max_batch_size=2, workers=1, postprocess_group_rows=group_rows,
                          result_spec=load_manifest(MODEL).outputs[0])
    assert (sut.postprocess_group_rows, group_rows) in {(0, 0), (8, 8)}
    responses = _loadgen(sut, staged, "Offline", tmp_path)
    assert isinstance(sut.failure, SampleError) and sut.failure.stage == "complete"
    assert len(sut.failure.indices) == (2 if group_rows == 0 else 8)
    assert str(sut.failure).endswith(": complete raised RuntimeError: completion refused")
    assert set(responses.values()) == {b""} and sut.completed_samples == 0


def test_a_server_sut_given_the_native_issue_queue_is_served_from_it_and_an_inline_one_never(tmp_path: Path) -> None:
    """Server with the native issue queue: LoadGen's C SUT fills it (the handles build that SUT when the
    SUT holds a queue) and the workers answer every sample from it. SingleStream runs inline: a queue
    given to it is dropped, so LoadGen calls it through the binding."""
    from mlharness.sut import _native

    _, backend, staged, ctx = _parts(count=8)
    issue_queue = _native.IssueQueue()
    sut = _sut(backend, staged, ctx, "Server", max_batch_size=2, workers=1, issue_queue=issue_queue)
    responses = _loadgen(sut, staged, "Server", tmp_path)
    assert sut.failure is None and issue_queue.issued == 8
    assert {sample: _answered(data) for sample, data in responses.items()} == {i: i for i in range(8)}
    inline = _sut(backend, staged, ctx, "SingleStream", issue_queue=_native.IssueQueue())
    assert inline.inline and inline.issue_queue is None
