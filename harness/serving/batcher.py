"""Dynamic batching across concurrent requests: a worker thread takes the first waiting sample, waits
at most `max_queue_delay_ms` for more (up to the model's batch size), runs them as one batch and
answers each request's future on the server's event loop. The wait is bounded and recorded per
request (queue_us), as Triton's dynamic batcher reports it."""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlharness.sut.served_model import ServedModel
from mlharness.sut.staging import SampleError


class BadSample(Exception):
    """A client's sample the model's preprocess (or the result check) refused: the client's error."""


@dataclass
class _Pending:
    sample: np.ndarray
    future: asyncio.Future
    enqueued: float


class DynamicBatcher:
    def __init__(self, served: ServedModel, max_queue_delay_ms: float, loop: asyncio.AbstractEventLoop):
        self.served, self.delay_s, self.loop = served, max_queue_delay_ms / 1e3, loop
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="mlharness-serve-batcher", daemon=True)
        self.batches = 0
        self.samples = 0
        self._thread.start()

    async def infer(self, samples: list[np.ndarray]) -> list[tuple[np.ndarray, dict[str, float]]]:
        """Each sample's result row and timings (us); raises BadSample for a refused sample."""
        futures = []
        for sample in samples:
            future = self.loop.create_future()
            self._queue.put(_Pending(sample, future, time.perf_counter()))
            futures.append(future)
        return list(await asyncio.gather(*futures))

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + self.delay_s
            while len(batch) < self.served.max_batch_size:
                remaining = deadline - time.perf_counter()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(item)
            self._run(batch)

    def _run(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            answer = self.served.infer([p.sample for p in batch])
        except Exception as exc:  # noqa: BLE001 - one bad sample must not fail the others: each alone
            if len(batch) > 1:
                for pending in batch:
                    self._run([pending])
                return
            self._answer_error(batch[0], *_error_kind(exc))
            return
        self.batches += 1
        self.samples += len(batch)
        for position, pending in enumerate(batch):
            timings = {"queue_us": (started - pending.enqueued) * 1e6, "preprocess_us": answer.preprocess_us,
                       "infer_us": answer.infer_us, "postprocess_us": answer.postprocess_us, "batch_size": len(batch)}
            self.loop.call_soon_threadsafe(_resolve, pending.future, (answer.rows[position:position + 1], timings))

    def _answer_error(self, pending: _Pending, kind: type[Exception], message: str) -> None:
        self.loop.call_soon_threadsafe(_fail, pending.future, kind(message))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10.0)


def _error_kind(exc: Exception) -> tuple[type[Exception], str]:
    """A sample's failure, run alone: the client's (the model's processing refused it) or the server's."""
    if isinstance(exc, SampleError):
        return BadSample, str(exc).partition(": ")[2] or str(exc)
    return RuntimeError, f"{type(exc).__name__}: {exc}"


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
