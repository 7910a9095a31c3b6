"""The network SUT: LoadGen's query dispatch library (ConstructQDL) forwarding each sample to a
server as one request, and completing it with the server's result. Per MLPerf's network division it
neither batches, caches nor pre- or post-processes; the server does. What one request is belongs to
an exchange: `TensorExchange` here (the Open Inference Protocol: the raw sample in, the declared result
out), `mlharness.sut.network.token_exchange.TokenExchange` (an OpenAI-compatible LLM server: the prompt
in, a streamed answer out, in LoadGen's token mode); slots, issue lag and failures are this SUT's.

LoadGen's issue thread only stamps the issue time and hands the samples to the connection's event
loop; requests go out there, at most `concurrency` in flight. The client measures its own **issue
lag** per sample (issued by LoadGen -> request sent), split into the wait for a free in-flight slot
(the server's backlog) and the client's own delay (the thread hop and its event loop): a client
whose own delay passed `issue_lag_limit_ms` fell behind, and the run says so.

A failed request (an error status, a refused or reset connection, a timeout, a result that is not
what the manifest declares) fails the run with the sample and the endpoint named; from then on every
query completes empty, unsent, so LoadGen ends promptly."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from mlharness.specs.manifests import TensorSpec
from mlharness.sut.network.connection import EndpointConnection
from mlharness.sut.network.oip_client import EndpointError
from mlharness.sut.network.runtime import RawSamples
from mlharness.sut.staging import SampleError, declared_text, got_text
from mlharness.sut.system_under_test import FirstFailure, ResultContract


@dataclass
class Answer:
    """One sample's answer: the response's bytes (kept alive until LoadGen has read them), its token
    count in token mode (None otherwise), the server's own timings where it reports them."""
    data: np.ndarray
    n_tokens: int | None = None
    server: dict[str, float] = field(default_factory=dict)


class TensorExchange:
    """One raw sample in as the request's one input, the manifest's declared result out (checked)."""
    token_mode = False

    def __init__(self, connection: EndpointConnection, samples: RawSamples, input_name: str, result_spec: TensorSpec):
        self.connection, self.samples, self.input_name = connection, samples, input_name
        self.result_spec, self.contract = result_spec, ResultContract(result_spec)

    async def answer(self, query_id: int, index: int, issued: int) -> Answer:
        sample = self.samples.get(index)
        reply = await self.connection.client.infer(self.connection.model_name, {self.input_name: sample}, str(query_id))
        return Answer(self._result(reply.outputs, index), None, reply.server)

    def _result(self, outputs: dict[str, np.ndarray], index: int) -> np.ndarray:
        name, url = self.result_spec.name, self.connection.endpoint.url
        if name not in outputs:
            raise SampleError([index], "endpoint", f"{url} answered outputs {sorted(outputs)}, not the declared "
                                                   f"result {name!r}")
        result = outputs[name]
        try:
            self.contract.check(result, [index])
        except SampleError:  # the server's answer (nothing postprocesses here): say so, naming it
            raise SampleError([index], "endpoint", f"{url} answered result {name!r} as {got_text(result)}; the "
                                                   f"manifest declares {declared_text(self.result_spec, 'row')}") from None
        if result.shape[0] != 1:
            raise SampleError([index], "endpoint", f"{url} answered {result.shape[0]} rows for one sample")
        return np.ascontiguousarray(result[0])


def _percentiles(values_ns: Sequence[int], scale: float = 1e6) -> dict[str, float]:
    if not values_ns:
        return {}
    array = np.asarray(values_ns, dtype=np.float64) / scale
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {"p50": round(float(p50), 4), "p90": round(float(p90), 4), "p99": round(float(p99), 4),
            "max": round(float(array.max()), 4), "mean": round(float(array.mean()), 4)}


class NetworkSUT(FirstFailure):
    def __init__(self, *, connection: EndpointConnection, exchange: Any, issue_lag_limit_ms: float, scenario: str,
                 on_failure: Callable[[str], None] | None = None):
        import mlperf_loadgen as lg

        self._lg = lg
        self.connection, self.exchange = connection, exchange
        self.token_mode = bool(exchange.token_mode)
        self.issue_lag_limit_ms = issue_lag_limit_ms
        # Told once, at the first failure: a latency scenario would otherwise go on issuing (unsent)
        # until its minimum duration; the runner ends the run from there.
        self.on_failure, self._told = on_failure, False
        # Offline issues every sample at once and the client holds them for free slots by design:
        # only the other scenarios' lag says whether the client kept up with LoadGen.
        self.judge_lag = scenario != "Offline"
        self.failure: BaseException | None = None
        self._fail_lock = threading.Lock()
        self._slots: asyncio.Semaphore | None = None
        self._completed = 0
        self.failed_samples = 0
        self.unsent_samples = 0
        self._issue_lag: list[int] = []
        self._slot_wait: list[int] = []
        self._server: dict[str, list[float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests = 0

    @property
    def completed_samples(self) -> int:
        return self._completed

    # ---- LoadGen's callbacks (its issue thread) ----

    def issue_query(self, query_samples: list[Any]) -> None:
        issued = time.perf_counter_ns()
        self.connection.call_soon(self._dispatch, [(q.id, q.index) for q in query_samples], issued)

    def flush_queries(self) -> None:
        """Nothing is held back to flush: each sample leaves as soon as a slot is free."""

    def name(self) -> str:
        """The SUT's name in LoadGen's log: "Network SUT" (the network division's rule) and the server
        it reached, asked again over the network now (a real round trip)."""
        try:
            server = self.connection.run(self.connection.client.server_name(), self.connection.connect_timeout_s)
        except EndpointError:
            server = self.connection.server_name or "unreachable"
        return f"mlharness Network SUT ({server} at {self.connection.endpoint.url})"

    # ---- the connection's event loop ----

    def start(self) -> None:
        async def make_slots() -> asyncio.Semaphore:
            return asyncio.Semaphore(self.connection.concurrency)
        self._slots = self.connection.run(make_slots(), 5.0)

    def _dispatch(self, pairs: list[tuple[int, int]], issued: int) -> None:
        for query_id, index in pairs:
            task = self.connection.loop.create_task(self._one(query_id, index, issued))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, query_id: int, index: int, issued: int) -> None:
        if self.failure is not None:
            self.unsent_samples += 1
            self._complete_empty(query_id)
            return
        assert self._slots is not None
        waited = time.perf_counter_ns()
        async with self._slots:
            sent = time.perf_counter_ns()
            if self.failure is not None:
                self.unsent_samples += 1
                self._complete_empty(query_id)
                return
            self._issue_lag.append(sent - issued)
            self._slot_wait.append(sent - waited)
            self._requests += 1
            try:
                answer = await self.exchange.answer(query_id, index, issued)
            except (EndpointError, SampleError) as exc:
                self.failed_samples += 1
                self._fail([index], "endpoint", exc if isinstance(exc, SampleError) else f"{exc}")
                self._complete_empty(query_id)
                self._tell_failure()
                return
            except Exception as exc:  # noqa: BLE001 - a bug: kept with its traceback as the run's failure
                self.failed_samples += 1
                with self._fail_lock:
                    if self.failure is None:
                        self.failure = exc
                self._complete_empty(query_id)
                return
        for key, value in answer.server.items():
            self._server.setdefault(key, []).append(value)
        lg, data = self._lg, answer.data  # `data` held by this frame until LoadGen has read it
        if answer.n_tokens is None:
            response = lg.QuerySampleResponse(query_id, data.ctypes.data, data.nbytes)
        else:
            response = lg.QuerySampleResponse(query_id, data.ctypes.data, data.nbytes, int(answer.n_tokens))
        lg.QuerySamplesComplete([response])
        self._completed += 1

    def _tell_failure(self) -> None:
        if self.on_failure is not None and not self._told:
            self._told = True
            self.on_failure(self.failure_text() or "a request failed")

    def _complete_empty(self, query_id: int) -> None:
        """An empty response. In token mode LoadGen 6.0.17 crashes (SIGSEGV) on a sample completed without
        a first token, so an empty first token goes first where the exchange has not sent one."""
        lg = self._lg
        if self.token_mode and not self.exchange.first_token_sent(query_id):
            lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0)])

    def stop(self) -> None:
        """Wait for the requests still out (LoadGen has ended, so none should be) to finish."""
        async def drain() -> None:
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=self.connection.timeout_s + 1)
        if self.connection.loop.is_running():
            try:
                self.connection.run(drain(), self.connection.timeout_s + 5)
            except EndpointError:
                pass

    # ---- what the run records ----

    def describe(self) -> dict[str, Any]:
        return {"issue_path": "network", **self.connection.describe(), **getattr(self.exchange, "described", {})}

    def figures(self) -> dict[str, Any]:
        """Issue lag (ms) split into the slot wait and the client's own delay, the server's own timings
        (us, where it reports them), failures, requests sent again, and whether the client fell behind."""
        own = [lag - wait for lag, wait in zip(self._issue_lag, self._slot_wait)]
        client = _percentiles(own)
        fell_behind = self.judge_lag and bool(client) and client["p99"] > self.issue_lag_limit_ms
        server = {key: _percentiles(values, 1.0) for key, values in self._server.items() if values}
        # The tensor client's requests sent again on a fresh connection (token mode counts them per request).
        resent = getattr(self.connection.client, "counters", None)
        return {"requests": self._requests, "failed_samples": self.failed_samples, "unsent_samples": self.unsent_samples,
                **({"retries": resent.get("retries", 0)} if resent is not None else {}),
                "issue_lag_ms": _percentiles(self._issue_lag), "slot_wait_ms": _percentiles(self._slot_wait),
                "client_lag_ms": client, "issue_lag_limit_ms": self.issue_lag_limit_ms,
                "client_fell_behind": fell_behind, "server_timings": server}

    def token_figures(self, ttft_limit_ms: float | None = None, tpot_limit_ms: float | None = None) -> dict[str, Any]:
        """Token mode: the inter-token latency (between content chunks) and goodput on the client's clock
        (mlharness.records.token_metrics), and both token counts; nothing for a tensor model."""
        if not self.token_mode:
            return {}
        from mlharness.records.token_metrics import sut_token_figures

        return {**sut_token_figures(self.exchange.sample_clocks(), ttft_limit_ms, tpot_limit_ms),
                **self.exchange.token_counts()}

    def write_requests(self, folder: Any) -> str | None:
        """Token mode: every request's clock and counts as `requests.jsonl` in `folder`; its name."""
        if not self.token_mode or not self.exchange.records:
            return None
        origin = min(record.issued for record in self.exchange.records)
        self.exchange.write_requests(folder / "requests.jsonl", origin)
        return "requests.jsonl"

    def failure_text(self) -> str | None:
        """The run's one-line failure: how many samples failed at the endpoint, how many were then not
        sent, and the first error."""
        if self.failure is None:
            return None
        if not self.failed_samples:
            return str(self.failure)
        unsent = f", {self.unsent_samples} more not sent after it" if self.unsent_samples else ""
        return (f"{self.failed_samples} sample(s) failed at {self.connection.endpoint.url}{unsent}; "
                f"the first: {self.failure}")
