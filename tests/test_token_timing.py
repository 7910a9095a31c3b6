"""LoadGen's token figures pinned to when tokens were made (issue 38, item 1). An engine whose steps are
scripted (a 50 ms prefill before the first token, a 300 ms step before the second, 50 ms steps after)
records the exact monotonic time it produced each token, before handing it to the SUT. The real LLM SUT
(`TokenStreamingSUT`) runs it under real LoadGen in token mode, one sequence at a time (SingleStream, on
the caller's thread as the runner does) and batched (Offline, continuous batching), and LoadGen's own
records are read back:

- the trace (`mlperf_log_trace.json`): per sample, the first-token latency and the latency LoadGen
  measured from the sample's issue;
- the accuracy log (every sample logged in performance mode, `accuracy_log_probability = 1`): per
  sample, the response's bytes, the token count and (SingleStream only) the first token's bytes;
- the detail log: the figures LoadGen reports (SingleStream: TTFT and TPOT; Offline: tokens per second
  only).

TTFT must lie between the first token's time and the midpoint of the first and second tokens' times
(the two are 300 ms apart, so the check holds on a loaded machine), the token counts must be exactly
the tokens produced, and TPOT must match the scripted steps within a generous margin."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import loadgen_hang_guard, token_mode_settings

# Seconds slept before each token: the prefill, then a long first decode step (first and second token
# far apart), then short steps.
DELAYS = (0.05, 0.3, 0.05, 0.05, 0.05, 0.05)
TOKENS = len(DELAYS)
QUERIES = 8
TPOT_MARGIN_NS = 20_000_000  # per token: 100 ms of slack over a sequence's 5 steps


class _ScriptedEngine:
    """Sleeps DELAYS[i] before making token i and stamps `time.perf_counter_ns()` as it makes it (before
    the SUT hears of it). The k-th sequence started makes the tokens 1000 * (k + 1) + position, so a
    response's bytes say which sequence made them. `made[k]` is that sequence's stamps, `tokens[k]` its
    tokens. `open_batch` runs each submitted sequence on a thread of its own, all at once."""

    max_new_tokens = TOKENS

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.made: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}

    def _sequence(self, on_token) -> np.ndarray:
        with self.lock:
            k = len(self.made)
            self.made[k], self.tokens[k] = [], []
        for position, delay in enumerate(DELAYS):
            time.sleep(delay)
            token = 1000 * (k + 1) + position
            self.made[k].append(time.perf_counter_ns())
            self.tokens[k].append(token)
            if on_token is not None:
                on_token(token, position)
        return np.array(self.tokens[k], dtype=np.int64)

    def generate(self, prompt, on_token=None) -> np.ndarray:
        return self._sequence(on_token)

    def open_batch(self, max_sequences, max_sequence_tokens):
        return _ScriptedSession(self)


class _ScriptedSession:
    def __init__(self, engine: _ScriptedEngine) -> None:
        self.engine = engine
        self.threads: list[threading.Thread] = []

    def submit(self, prompt_ids, on_token, on_done) -> None:
        def run() -> None:
            try:
                tokens = self.engine._sequence(on_token)
            except BaseException as exc:  # pragma: no cover - the engine does not fail
                on_done(None, exc)
            else:
                on_done(tokens, None)

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()

    def close(self) -> None:
        for thread in self.threads:
            thread.join()


def _run(tmp_path: Path, scenario: str):
    """One LoadGen performance test in token mode over QUERIES samples; (SUT, engine)."""
    import mlperf_loadgen as lg

    from mlharness.running.loadgen_test import run_test_beside_caller
    from mlharness.sut.llm.runtime import PromptSet
    from mlharness.sut.llm.token_sut import TokenStreamingSUT
    from mlharness.sut.loadgen_handles import loadgen_handles

    engine = _ScriptedEngine()
    prompts = PromptSet([(f"p{i}", "x") for i in range(QUERIES)], [np.array([i, 1], np.int64) for i in range(QUERIES)])
    # every response in the accuracy log, with its token count
    settings, log = token_mode_settings(scenario, QUERIES, tmp_path, single_stream_latency_ns=600_000_000,
                                        log_every_response=True, trace=True)
    settings.max_query_count = QUERIES
    if scenario == "SingleStream":
        sut = TokenStreamingSUT(backend=engine, prompts=prompts, scenario=scenario, serve_on_caller=True)
    else:
        sut = TokenStreamingSUT(backend=engine, prompts=prompts, scenario=scenario, batching="continuous",
                                max_batch_size=QUERIES)
    with loadgen_hang_guard(), loadgen_handles(sut, QUERIES, QUERIES, prompts.load_samples, prompts.unload_samples) \
            as (lg_sut, qsl):
        def start_test() -> None:
            lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, str(tmp_path / "no-audit.config"))

        if scenario == "SingleStream":
            run_test_beside_caller(start_test, sut.serve_here, sut.end_serving)
        else:
            start_test()
    assert sut.failure is None
    return sut, engine


def _trace(tmp_path: Path) -> dict[str, dict[int, int]]:
    """Per sample (LoadGen's sample_seq): the first-token latency ("Token") and the latency ("Sample"),
    in ns from the sample's issue, as LoadGen traced them. The trace file as a whole is not valid JSON
    (LoadGen 6.0.17 doubles quotes in its LogDetail events), so only the samples' begin events are read."""
    found: dict[str, dict[int, int]] = {"Token": {}, "Sample": {}}
    for line in (tmp_path / "mlperf_log_trace.json").read_text().splitlines():
        if line.startswith(('{"name":"Token"', '{"name":"Sample"')) and '"ph":"b"' in line:
            event = json.loads(line.rstrip(","))
            per_sample = found[event["name"]]
            assert event["args"]["sample_seq"] not in per_sample
            per_sample[event["args"]["sample_seq"]] = int(event["args"]["complete_ns"])
    return found


def _detail(tmp_path: Path) -> dict[str, object]:
    values = {}
    for line in (tmp_path / "mlperf_log_detail.txt").read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[len(":::MLLOG "):])
            values[entry["key"]] = entry["value"]
    return values


def _check(tmp_path: Path, scenario: str, sut, engine: _ScriptedEngine, issued: dict[int, int]) -> None:
    """LoadGen's records against the engine's stamps; `issued[k]`: when the SUT received sequence k's query."""
    assert sorted(engine.made) == list(range(QUERIES))
    trace = _trace(tmp_path)
    accuracy = json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())
    assert sorted(entry["seq_id"] for entry in accuracy) == sorted(trace["Token"]) == sorted(trace["Sample"]) \
        == list(range(QUERIES))
    firsts, midpoints, steps = [], [], []
    for entry in accuracy:
        tokens = np.frombuffer(bytes.fromhex(entry["data"]), dtype=np.int64).tolist()
        k = tokens[0] // 1000 - 1
        # the response is what sequence k produced, and the counts are exactly its tokens
        assert tokens == engine.tokens[k]
        assert entry["token_count"] == TOKENS
        # the first token's bytes LoadGen got at FirstTokenComplete are the first token, not the second
        # (LoadGen 6.0.17 logs them in SingleStream only)
        if scenario == "SingleStream":
            assert np.frombuffer(bytes.fromhex(entry["token_data"]), dtype=np.int64).tolist() == [tokens[0]]
        first, second = (stamp - issued[k] for stamp in engine.made[k][:2])
        ttft = trace["Token"][entry["seq_id"]]
        # LoadGen stamps the issue before the SUT does, and the first token after the engine made it
        assert first <= ttft < (first + second) / 2, (
            f"sequence {k}: LoadGen's TTFT {ttft / 1e6:.1f} ms, tokens made at {first / 1e6:.1f} ms and "
            f"{second / 1e6:.1f} ms after the issue: the first token was reported with the second")
        latency = trace["Sample"][entry["seq_id"]]
        assert latency >= engine.made[k][-1] - issued[k]
        # TPOT as LoadGen works it out per sample, (latency - TTFT) / (tokens - 1): the engine's steps
        step = (engine.made[k][-1] - engine.made[k][0]) / (TOKENS - 1)
        assert abs((latency - ttft) / (entry["token_count"] - 1) - step) <= TPOT_MARGIN_NS
        steps.append(step)
        firsts.append(first)
        midpoints.append((first + second) / 2)
    assert min(steps) >= sum(DELAYS[1:]) / (TOKENS - 1) * 1e9  # the scripted steps (sleeps last at least that)
    assert sut.generated_tokens == TOKENS * QUERIES

    # The SUT's own clock of each sample (token_figures and the profile read it): the samples LoadGen
    # asked for, each issued, then admitted, then its tokens, then completed, in that order.
    assert sorted(clock.index for clock in sut.times) == sorted(entry["qsl_idx"] for entry in accuracy)
    for clock in sut.times:
        assert clock.issued <= clock.admitted <= clock.tokens[0] and len(clock.tokens) == TOKENS
        assert clock.tokens == sorted(clock.tokens) and clock.tokens[-1] <= clock.completed
        # batched: how many sequences ran when each token was made; one at a time: none kept
        assert all(1 <= size <= QUERIES for size in clock.batch_sizes)
        assert len(clock.batch_sizes) == (TOKENS if scenario == "Offline" else 0)
    if scenario == "SingleStream":  # one at a time: clock k is sequence k, each token stamped as it came
        for k, clock in enumerate(sut.times):
            assert all(made <= stamp for made, stamp in zip(engine.made[k], clock.tokens))
            assert all(stamp < made for stamp, made in zip(clock.tokens, engine.made[k][1:]))

    # The figures LoadGen does not report, from that clock (token_figures): every gap between tokens is at
    # least its scripted sleep, the long first step among them; decode lasts at least the steps after the
    # first token; all samples meet generous limits, none a TTFT limit under the 50 ms prefill.
    figures = sut.token_figures(10_000, 10_000)
    assert figures["itl_min_ns"] >= min(DELAYS[2:]) * 1e9 and figures["itl_max_ns"] >= DELAYS[1] * 1e9
    assert figures["itl_min_ns"] <= figures["itl_p50_ns"] <= figures["itl_p90_ns"] <= figures["itl_max_ns"]
    assert figures["decode_p50_ns"] >= sum(DELAYS[1:]) * 1e9 and figures["prefill_p50_ns"] >= DELAYS[0] * 1e9
    assert (figures["goodput_fraction"], figures["goodput_samples"]) == (1.0, QUERIES)
    assert sut.token_figures(DELAYS[0] * 1000 / 2, 10_000)["goodput_samples"] == 0
    assert "goodput_fraction" not in sut.token_figures()  # no limits, no goodput
    if scenario == "Offline":  # every sequence in the batch at once (those still running when each token came)
        assert 1 <= figures["batch_occupancy_mean"] <= QUERIES
    else:
        assert "batch_occupancy_mean" not in figures

    detail = _detail(tmp_path)
    if scenario == "Offline":  # LoadGen reports tokens per second only: every token over the query's latency
        assert detail["result_tokens_per_second"] == pytest.approx(
            TOKENS * QUERIES / detail["result_max_latency_ns"] * 1e9, rel=1e-4)
        return
    # the figures LoadGen reports
    assert min(firsts) <= detail["result_first_token_min_latency_ns"]
    assert detail["result_first_token_max_latency_ns"] < min(midpoints)
    assert min(steps) - TPOT_MARGIN_NS <= detail["result_time_to_output_token_min"]
    assert detail["result_time_to_output_token_max"] <= max(steps) + TPOT_MARGIN_NS


def test_singlestream_ttft_is_the_first_tokens_time_and_counts_are_the_tokens_made(tmp_path: Path) -> None:
    """One sequence at a time: sequence k answers the k-th query (the SUT's clocks are in that order)."""
    sut, engine = _run(tmp_path, "SingleStream")
    assert len(sut.times) == QUERIES
    _check(tmp_path, "SingleStream", sut, engine, {k: clock.issued for k, clock in enumerate(sut.times)})


def test_batched_offline_ttft_is_the_first_tokens_time_and_counts_are_the_tokens_made(tmp_path: Path) -> None:
    """Continuous batching, every sequence in the batch at once: Offline's one query is issued once."""
    sut, engine = _run(tmp_path, "Offline")
    assert sut.batching == "continuous"
    (issued,) = {clock.issued for clock in sut.times}
    _check(tmp_path, "Offline", sut, engine, dict.fromkeys(range(QUERIES), issued))
