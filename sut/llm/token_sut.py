"""The SUT of a generative model: LoadGen's token mode. For each sample the engine generates token by
token; at the first token the SUT calls `FirstTokenComplete` (LoadGen stamps the time to first token),
at the end `QuerySamplesComplete` with `QuerySampleResponse(id, ptr, size, n_tokens)`: the response's
bytes are the generated token ids (int64) and n_tokens their count (the stop token included), from
which LoadGen works out the time per output token. Both arrays stay referenced here until the LoadGen
call that reads them has returned (LoadGen copies the bytes into its accuracy log inside the call).

Scheduling (`batching`):
- `sequential`: one worker thread, one sequence at a time through the engine's `generate` (its plain
  loop); queries wait in arrival order. SingleStream and MultiStream always run so, and so does an engine
  without `open_batch`. With `serve_on_caller` the worker is the caller's own thread (`serve_here`, while
  LoadGen's test runs on another; mlharness.running.runner does so): torch's OpenMP runtime (libgomp) makes
  every parallel region several times slower on a thread other than the one that loaded the model once
  the two threads' pools hold more threads than there are CPUs (measured on 2 CPUs: a decode-step gemv
  32 -> 120 us, SingleStream TPOT 31 -> 51 ms).
- `continuous` (Offline and Server): up to `max_batch_size` sequences in the engine's running batch
  (`engine.open_batch`); whenever one finishes, the next waiting query joins at the next decode step. An
  engine whose session admits at every step by itself (`engine.batch_admits_at_every_step`, transformers'
  continuous batching) gets every query as it arrives; otherwise the scheduler thread here keeps the
  batch full, submitting the next waiting query as soon as one finishes.
- `static` (Offline and Server): the scheduler starts a batch of up to `max_batch_size` waiting queries
  when the engine is idle, and starts the next only when every sequence of that batch has finished.

Every token's time is kept per sample (from issue_query to each token, `time.perf_counter_ns`), for the
figures LoadGen does not report (inter-token latency, goodput: `token_figures`) and the profile, which
reads these stamps, the scheduler's waits and the batch engine's steps after the test
(mlharness.profiling.token_timeline): nothing is added to the token path when profiling.

A failure is handled as the tensor SUT does: recorded once, and that sample and every later one
completed empty so LoadGen ends promptly."""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from mlharness.sut.system_under_test import FirstFailure

BATCHING = ("continuous", "static", "sequential")
BATCHED_SCENARIOS = ("Offline", "Server")


@dataclass
class SequenceTimes:
    """One sample's clock (perf_counter_ns): issued by LoadGen, admitted into the engine, each token made."""
    index: int
    issued: int
    admitted: int = 0
    tokens: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # running sequences when each token was made (batched)
    completed: int = 0  # QuerySamplesComplete returned (the response handed to LoadGen)


def choose_batching(requested: str | None, scenario: str, max_batch_size: int, engine: Any) -> str:
    """The scheduling a run gets: batched only for Offline and Server, and only on an engine that can batch."""
    if scenario not in BATCHED_SCENARIOS or not hasattr(engine, "open_batch"):
        return "sequential"
    if requested == "static" and max_batch_size <= 1:
        return "sequential"  # a static batch of one is one sequence at a time
    return requested if requested in BATCHING else "continuous"


class TokenStreamingSUT(FirstFailure):
    def __init__(self, *, backend: Any, prompts: Any, scenario: str, batching: str | None = None,
                 max_batch_size: int = 1, max_sequence_tokens: int = 0, warm_sequences: int = 0,
                 observer: Any = None, serve_on_caller: bool = False):
        """`batching` None keeps the first slice's behaviour (one sequence at a time); `max_sequence_tokens`
        sizes a batched engine's cache (default: the longest prompt and max_new_tokens); `warm_sequences`
        generated through a batched engine in start(), before LoadGen's test (its first steps are slow);
        `observer`: an object whose `sequence(times)` is called with each completed sample's SequenceTimes
        (a per-sample hook; the runner passes none: the profile reads `times` after the test), or None;
        `serve_on_caller`: one sequence at a time is generated on the thread that calls `serve_here` (the
        caller runs LoadGen's test on another thread), not on a worker of this SUT's own."""
        import mlperf_loadgen as lg

        self._lg = lg
        self.backend = backend
        self.prompts = prompts
        self.scenario = scenario
        self.max_batch_size = max(1, int(max_batch_size))
        self.batching = choose_batching(batching, scenario, self.max_batch_size, backend) if batching else "sequential"
        self.max_sequence_tokens = max_sequence_tokens or _longest(prompts) + int(getattr(backend, "max_new_tokens", 0))
        self.warm_sequences = warm_sequences
        self.observer = observer
        self.serve_on_caller = bool(serve_on_caller) and self.batching == "sequential"
        self.failure: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._fail_lock = threading.Lock()
        self._completed = 0
        self.generated_tokens = 0
        self.times: list[SequenceTimes] = []  # every completed sample's clock, in completion order
        self.waits_ns: list[tuple[int, int]] = []  # (start, end) of each time the scheduler waited for room
        self.admissions: list[tuple[int, int, int]] = []  # (when, sequences running before, sequences admitted)
        # the batch engine's own record of its forward steps (start, end, sequences, query tokens), where it keeps
        # one (`session.steps`); warm-up steps first. None: the engine records none, or no batch session ran.
        self.engine_steps: list[tuple[int, int, int, int]] | None = None
        # batched scheduling
        self._session: Any = None
        self._cond = threading.Condition()
        self._waiting: deque[tuple[int, int, int]] = deque()  # (query id, sample index, issued ns)
        self._running = 0
        # the engine's batch session admits at every step by itself (see the module's doc)
        self._engine_admits = bool(getattr(backend, "batch_admits_at_every_step", False))
        self._stopping = False

    @property
    def completed_samples(self) -> int:
        return self._completed

    def describe(self) -> dict[str, Any]:
        return {"batching": self.batching, "max_batch_size": self.max_batch_size if self.batching != "sequential" else 1,
                "admission": "engine, at every step" if self._engine_admits and self.batching == "continuous"
                else "SUT scheduler"}

    # LoadGen callbacks -------------------------------------------------------------------------
    def issue_query(self, query_ids: list[int], sample_indices: list[int]) -> None:
        if self.failure is not None:
            self._complete_empty(query_ids)
            return
        issued = time.perf_counter_ns()
        if self.batching == "sequential":
            for pair in zip(query_ids, sample_indices):
                self._queue.put((*pair, issued))
            return
        with self._cond:
            self._waiting.extend((qid, index, issued) for qid, index in zip(query_ids, sample_indices))
            self._cond.notify()

    def flush_queries(self) -> None:
        """Nothing is held back."""

    # lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.serve_on_caller:
            return  # the caller's thread serves (serve_here)
        if self.batching == "sequential":
            self._thread = threading.Thread(target=self._serve, name="mlharness-llm-worker", daemon=True)
        else:
            self._session = self.backend.open_batch(self.max_batch_size, self.max_sequence_tokens)
            self.engine_steps = getattr(self._session, "steps", None)
            if self.warm_sequences:
                warm_batch(self._session, [self.prompts.prompt(i % len(self.prompts))
                                           for i in range(self.warm_sequences)])
            self._stopping = False
            self._thread = threading.Thread(target=self._schedule, name="mlharness-llm-scheduler", daemon=True)
        self._thread.start()

    def serve_here(self) -> None:
        """Generate on the calling thread until `end_serving` (serve_on_caller)."""
        self._serve()

    def end_serving(self) -> None:
        """The test is over: `serve_here` returns once the queries before this are answered."""
        self._queue.put(None)

    def stop(self) -> None:
        if self._thread is None:
            return
        if self.batching == "sequential":
            self._queue.put(None)
        else:
            with self._cond:
                self._stopping = True
                self._cond.notify()
        self._thread.join()
        self._thread = None
        if self._session is not None:
            self._session.close()
            self._session = None

    # one sequence at a time ---------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            query_id, index, issued = item
            if self.failure is not None:
                self._complete_empty([query_id])
            else:
                self._generate(query_id, index, issued)

    def _generate(self, query_id: int, index: int, issued: int) -> None:
        clock = SequenceTimes(index, issued, time.perf_counter_ns())
        on_token = self._token_reporter(query_id, clock)
        stage = "generate"
        try:
            tokens = np.ascontiguousarray(self.backend.generate(self.prompts.prompt(index), on_token), dtype=np.int64)
            stage = "complete"
            self._complete(query_id, tokens, clock)
        except BaseException as exc:  # engine or user code: the run must end, not hang
            self._fail([index], stage, exc)
            if stage != "complete":
                self._complete_empty([query_id], first_token_sent=bool(clock.tokens))

    # batched: the scheduler ---------------------------------------------------------------------
    def _has_room(self) -> bool:
        if self.batching == "static":
            return self._running == 0
        if self._engine_admits:
            return True  # the engine's own scheduler admits at every step, up to max_batch_size
        return self._running < self.max_batch_size

    def _schedule(self) -> None:
        """Admit waiting queries into the engine's batch whenever there is room (see the module's doc);
        after a failure, complete waiting queries empty; at stop, complete what still waits empty."""
        while True:
            with self._cond:
                waited = 0
                while not self._stopping and not (self._waiting and (self.failure is not None or self._has_room())):
                    if self._waiting and not waited:
                        waited = time.perf_counter_ns()  # a query waits for room in the batch
                    self._cond.wait()
                if waited:
                    self.waits_ns.append((waited, time.perf_counter_ns()))
                admitted, dropped = [], []
                if self.failure is not None or self._stopping:
                    dropped = [qid for qid, _, _ in self._waiting]
                    self._waiting.clear()
                else:
                    room = len(self._waiting) if self.batching == "continuous" and self._engine_admits else \
                        self.max_batch_size - self._running
                    admitted = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                    self.admissions.append((time.perf_counter_ns(), self._running, len(admitted)))
                    self._running += len(admitted)
                stopping = self._stopping
            if dropped:
                self._complete_empty(dropped)
            for query_id, index, issued in admitted:
                self._submit(query_id, index, issued)
            if stopping:
                return

    def _submit(self, query_id: int, index: int, issued: int) -> None:
        clock = SequenceTimes(index, issued, time.perf_counter_ns())
        reporter = self._token_reporter(query_id, clock)

        def on_token(token: int, position: int) -> None:
            clock.batch_sizes.append(min(self._running, self.max_batch_size))
            reporter(token, position)

        def on_done(tokens: np.ndarray | None, error: BaseException | None) -> None:
            try:
                if error is not None:
                    self._fail([index], "generate", error)
                    self._complete_empty([query_id], first_token_sent=bool(clock.tokens))
                else:
                    try:
                        self._complete(query_id, np.ascontiguousarray(tokens, dtype=np.int64), clock)
                    except BaseException as exc:
                        self._fail([index], "complete", exc)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify()

        try:
            self._session.submit(self.prompts.prompt(index), on_token, on_done)
        except BaseException as exc:  # the engine refused it: this sample fails, the run ends
            on_done(None, exc)

    # LoadGen calls --------------------------------------------------------------------------------
    def _token_reporter(self, query_id: int, clock: SequenceTimes) -> Callable[[int, int], None]:
        lg = self._lg
        first = np.empty(1, dtype=np.int64)  # the first token's bytes, alive until FirstTokenComplete returns

        def on_token(token: int, position: int) -> None:
            clock.tokens.append(time.perf_counter_ns())
            if position == 0:
                first[0] = token
                lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, first.ctypes.data, first.nbytes)])

        return on_token

    def _complete(self, query_id: int, tokens: np.ndarray, clock: SequenceTimes) -> None:
        lg = self._lg
        # `tokens` is held by this frame until QuerySamplesComplete has returned: LoadGen reads it there.
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, tokens.ctypes.data, tokens.nbytes,
                                                        int(tokens.size))])
        clock.completed = time.perf_counter_ns()
        self._completed += 1
        self.generated_tokens += int(tokens.size)
        self.times.append(clock)
        if self.observer is not None:
            self.observer.sequence(clock)

    def _complete_empty(self, query_ids: Sequence[int], first_token_sent: bool = False) -> None:
        """Complete with empty responses. In token mode LoadGen 6.0.17 crashes (SIGSEGV, seen in
        SingleStream) on a sample completed without a first token, so an empty first token goes first."""
        lg = self._lg
        if not first_token_sent:
            lg.FirstTokenComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in query_ids])
        lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in query_ids])

    # figures ----------------------------------------------------------------------------------------
    def token_figures(self, ttft_limit_ms: float | None = None, tpot_limit_ms: float | None = None) -> dict[str, Any]:
        """What LoadGen's token mode does not report, from this SUT's clocks (mlharness.records.token_metrics)."""
        from mlharness.records.token_metrics import measured_steps, sut_stage_figures, sut_token_figures

        steps = measured_steps(self.engine_steps, min((c.issued for c in self.times), default=0))
        figures = {**sut_token_figures([(c.issued, c.tokens) for c in self.times], ttft_limit_ms, tpot_limit_ms),
                   **sut_stage_figures([(c.issued, c.admitted, c.tokens) for c in self.times], steps)}
        running = [size for c in self.times for size in c.batch_sizes]
        if running:  # batched: how full the batch was, seen from each token (sequences given to the engine)
            figures["batch_occupancy_mean"] = round(sum(running) / len(running), 3)
        return figures


def _longest(prompts: Any) -> int:
    token_ids = getattr(prompts, "token_ids", None) or []
    return max((len(ids) for ids in token_ids), default=0)


def warm_batch(session: Any, prompt_ids: Sequence[np.ndarray], timeout: float = 600.0) -> list[np.ndarray]:
    """Generate `prompt_ids` through a batch session, all submitted at once; their tokens in order."""
    done = threading.Event()
    results: dict[int, Any] = {}
    lock = threading.Lock()

    def finisher(i: int) -> Callable[[np.ndarray | None, BaseException | None], None]:
        def on_done(tokens: np.ndarray | None, error: BaseException | None) -> None:
            with lock:
                results[i] = error if error is not None else tokens
                if len(results) == len(prompt_ids):
                    done.set()
        return on_done

    for i, ids in enumerate(prompt_ids):
        session.submit(ids, None, finisher(i))
    if prompt_ids and not done.wait(timeout):
        raise RuntimeError(f"the batch engine did not finish {len(prompt_ids)} sequences in {timeout:.0f} s")
    for i in range(len(prompt_ids)):
        if isinstance(results[i], BaseException):
            raise results[i]
    return [results[i] for i in range(len(prompt_ids))]
