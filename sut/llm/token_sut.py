"""The SUT of a generative model: LoadGen's token mode. For each sample the engine generates token by
token; at the first token the SUT calls `FirstTokenComplete` (LoadGen stamps the time to first token),
at the end `QuerySamplesComplete` with `QuerySampleResponse(id, ptr, size, n_tokens)`: the response's
bytes are the generated token ids (int64) and n_tokens their count (the stop token included), from
which LoadGen works out the time per output token. Both arrays stay referenced here until the LoadGen
call that reads them has returned (LoadGen copies the bytes into its accuracy log inside the call).

Scheduling: one worker thread, one sequence at a time (static batch 1) in every scenario; queries wait
in arrival order. Continuous batching is not built yet. A failure is handled as the tensor SUT does:
recorded once, and that sample and every later one completed empty so LoadGen ends promptly."""
from __future__ import annotations

import queue
import threading
from typing import Any, Sequence

import numpy as np

from sut.system_under_test import FirstFailure


class TokenStreamingSUT(FirstFailure):
    def __init__(self, *, backend: Any, prompts: Any, scenario: str):
        import mlperf_loadgen as lg

        self._lg = lg
        self.backend = backend
        self.prompts = prompts
        self.scenario = scenario
        self.failure: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._fail_lock = threading.Lock()
        self._completed = 0
        self.generated_tokens = 0

    @property
    def completed_samples(self) -> int:
        return self._completed

    # LoadGen callbacks -------------------------------------------------------------------------
    def issue_query(self, query_ids: list[int], sample_indices: list[int]) -> None:
        if self.failure is not None:
            self._complete_empty(query_ids)
            return
        for pair in zip(query_ids, sample_indices):
            self._queue.put(pair)

    def flush_queries(self) -> None:
        """Nothing is held back."""

    # lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="mlharness-llm-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    # work -----------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            query_id, index = item
            if self.failure is not None:
                self._complete_empty([query_id])
            else:
                self._generate(query_id, index)

    def _generate(self, query_id: int, index: int) -> None:
        lg = self._lg
        first = np.empty(1, dtype=np.int64)  # the first token's bytes, alive until FirstTokenComplete returns
        reported = []

        def on_token(token: int, position: int) -> None:
            if position == 0:
                first[0] = token
                lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, first.ctypes.data, first.nbytes)])
                reported.append(query_id)

        stage = "generate"
        try:
            tokens = np.ascontiguousarray(self.backend.generate(self.prompts.prompt(index), on_token), dtype=np.int64)
            stage = "complete"
            # `tokens` is held by this frame until QuerySamplesComplete has returned: LoadGen reads it there.
            lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, tokens.ctypes.data, tokens.nbytes,
                                                            int(tokens.size))])
            self._completed += 1
            self.generated_tokens += int(tokens.size)
        except BaseException as exc:  # engine or user code: the run must end, not hang
            self._fail([index], stage, exc)
            if stage != "complete":
                self._complete_empty([query_id], first_token_sent=bool(reported))

    def _complete_empty(self, query_ids: Sequence[int], first_token_sent: bool = False) -> None:
        """Complete with empty responses. In token mode LoadGen 6.0.17 crashes (SIGSEGV, seen in
        SingleStream) on a sample completed without a first token, so an empty first token goes first."""
        lg = self._lg
        if not first_token_sent:
            lg.FirstTokenComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in query_ids])
        lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in query_ids])
