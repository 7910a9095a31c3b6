"""Accuracy of a generative model (issue 19): LoadGen's accuracy log holds each sample's generated token
ids (int64); the engine's tokenizer turns them into text, and the metric scores the text against the
dataset's labels. `exact_match`: the answer's first word, lower-cased and stripped of punctuation,
must equal the label (the prompt asks for one word; a missing or different word is wrong). `rouge`:
ROUGE-1/2/L of each text against the sample's reference summary (the label), with Google's rouge-score.

This module imports no framework (rouge-score is imported when the metric runs): the runner hands it
the engine's `decode`."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mlharness.atomic_io import write_text
from mlharness.errors import UserError
from mlharness.running import accuracy as accuracy_mod
from mlharness.running.metrics import MetricResult, metric

_WORD = re.compile(r"[a-z0-9]+")


def answer_word(text: str) -> str:
    """The first word of a generated answer, lower case, without punctuation ('' when there is none)."""
    match = _WORD.search(text.lower())
    return match.group(0) if match else ""


@metric("exact_match")
def exact_match(outputs: Mapping[int, Any], labels: Sequence[Any], params: dict[str, Any]) -> MetricResult:
    """`outputs`: sample index -> generated text. Fraction of samples whose answer word is the label."""
    hits, total, answers = 0, 0, {}
    for index, text in sorted(outputs.items()):
        if not isinstance(text, str):
            raise TypeError(f"exact_match scores generated text; sample {index} is {type(text).__name__} "
                            f"(a generative model's tokens must be decoded first)")
        word = answer_word(text)
        answers[word] = answers.get(word, 0) + 1
        hits += word == str(labels[index]).lower()
        total += 1
    value = hits / total if total else 0.0
    return MetricResult({"exact_match": value}, f"exact_match={100 * value:.3f}% ({hits}/{total})",
                        {"answers": answers})


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@metric("rouge")
def rouge(outputs: Mapping[int, Any], labels: Sequence[Any], params: dict[str, Any]) -> MetricResult:
    """`outputs`: sample index -> generated text; `labels`: the reference summaries. MLPerf's LLM
    summarization score as its reference computes it (`evaluate`'s rouge, which is rouge-score): the
    F-measure of ROUGE-1, ROUGE-2 and ROUGE-L of each stripped text against its reference, Porter
    stemmer on, averaged over the samples. Values are fractions (MLPerf prints them x100)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise UserError("the rouge metric needs the rouge-score package: pip install 'mlharness[llm]'") from None
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    per_sample: dict[int, dict[str, float]] = {}
    for index, text in sorted(outputs.items()):
        if not isinstance(text, str):
            raise TypeError(f"rouge scores generated text; sample {index} is {type(text).__name__} "
                            f"(a generative model's tokens must be decoded first)")
        scores = scorer.score(str(labels[index]), text.strip())  # (target, prediction)
        per_sample[index] = {name: scores[name].fmeasure for name in ROUGE_TYPES}
    count = len(per_sample)
    values = {name: sum(s[name] for s in per_sample.values()) / count if count else 0.0 for name in ROUGE_TYPES}
    headline = " ".join(f"{name}={100 * value:.4f}" for name, value in values.items()) + f" ({count} samples)"
    return MetricResult(values, headline, {"per_sample": per_sample})


def score(log: Path, decode: Callable[[np.ndarray], str], labels: Sequence[Any], spec: dict[str, Any], where: str,
          reference: Any, result_spec: Any) -> accuracy_mod.AccuracyReport:
    """Decode the accuracy log's token ids, score the texts, compare with the reference log (its accuracy
    values, and its `outputs`: token ids a sample must start with), write generations.jsonl beside it."""
    tokens = accuracy_mod.decode_accuracy_log(log, result_spec)
    texts = {index: decode(ids) for index, ids in tokens.items()}
    _write_generations(log.with_name("generations.jsonl"), texts, tokens, labels, spec.get("metric"), {})
    scored = accuracy_mod.evaluate(texts, labels, spec, where)  # type: ignore[arg-type]
    per_sample = scored.details.get("per_sample", {})
    if per_sample:  # again, with each sample's scores (written first so a failing metric leaves the texts)
        _write_generations(log.with_name("generations.jsonl"), texts, tokens, labels, spec.get("metric"), per_sample)
    return accuracy_mod.compare(scored, reference, tokens, spec["metric"])


def _write_generations(path: Path, texts: dict[int, str], tokens: dict[int, np.ndarray], labels: Sequence[Any],
                       metric_name: str | None, per_sample: Mapping[int, dict[str, float]]) -> None:
    """One JSON line a sample: its label, text and token ids; the answer word for exact_match, and the
    sample's own scores where the metric gives them."""
    lines = []
    for i in sorted(texts):
        line: dict[str, Any] = {"sample": i, "label": labels[i]}
        if metric_name == "exact_match":
            line["answer"] = answer_word(texts[i])
        line.update({"text": texts[i], "tokens": [int(t) for t in tokens[i]]})
        if i in per_sample:
            line["scores"] = per_sample[i]
        lines.append(json.dumps(line))
    write_text(path, "\n".join(lines) + "\n")
