"""Cross-backend divergence: run one model's manifests for two backends on the same samples (same
dataset, each manifest's own preprocessing) and compare, per model output and for the
postprocessed result, the max absolute difference, the cosine similarity per sample and the
top-1 agreement. Frameworks load through sut/ only when a comparison runs.

A generative model (manifests with `generation:`, issue 19) is compared by its tokens instead: both
engines tokenize every prompt and generate greedily (outside LoadGen, as an accuracy run does); per
sample, whether the prompt ids are the same, whether the generated ids are, the position of the first
differing generated token and the token agreement (the tokens before that position over the longer
answer's length: after the first difference the engines continue from different texts, so later
positions are not compared). `compare_generation_logs` does the same from two accuracy runs'
generations.jsonl files (the token ids LoadGen logged)."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.index import SpecIndex
from mlharness.specs.manifests import DatasetManifest, HardwareManifest, ModelManifest, TensorSpec

SCHEMA_VERSION = 1
RANKED_TYPES = ("scores", "logits", "probabilities")  # outputs whose argmax is a class


@dataclass(frozen=True)
class Tolerance:
    max_abs_diff: float = 1e-3
    min_cosine: float = 0.9999
    min_top1_agreement: float = 1.0


@dataclass(frozen=True)
class OutputDivergence:
    name: str
    role: str  # "output" (a model output) or "result" (after postprocess)
    shape: tuple[int, ...]  # of one sample
    max_abs_diff: float | None  # None for integer tensors (class indices), where only agreement means anything
    mean_cosine: float | None
    min_cosine: float | None
    top1_agreement: float | None  # None when the tensor names no class
    problems: tuple[str, ...] = ()


@dataclass
class DivergenceReport:
    model: str
    dataset: str
    backends: tuple[str, str]
    samples: int
    tolerance: Tolerance
    manifests: dict[str, dict[str, str]] = field(default_factory=dict)
    outputs: list[OutputDivergence] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(o.problems for o in self.outputs)

    def as_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "model": self.model, "dataset": self.dataset,
                "backends": list(self.backends), "samples": self.samples, "tolerance": asdict(self.tolerance),
                "manifests": self.manifests, "outputs": [asdict(o) for o in self.outputs],
                "verdict": "PASS" if self.passed else "FAIL"}

    def text(self) -> str:
        a, b = self.backends
        lines = [f"{self.model} on {self.dataset} ({self.samples} samples): {a} vs {b}",
                 f"{'output':<28}{'max|diff|':>12}{'mean cos':>12}{'min cos':>12}{'top-1 agree':>13}  verdict"]
        for o in self.outputs:
            label = o.name if o.role == "output" else f"{o.name} (result)"
            lines.append(f"{label:<28}{_fmt(o.max_abs_diff, '.3g'):>12}{_fmt(o.mean_cosine, '.6f'):>12}"
                         f"{_fmt(o.min_cosine, '.6f'):>12}{_fmt(o.top1_agreement, '.4f'):>13}  "
                         f"{'FAIL' if o.problems else 'ok'}")
            lines += [f"  {problem}" for problem in o.problems]
        t = self.tolerance
        lines.append(f"result: {'PASS' if self.passed else 'FAIL'} (tolerance: max|diff| <= {t.max_abs_diff:g}, "
                     f"mean cosine >= {t.min_cosine:g}, top-1 agreement >= {t.min_top1_agreement:g})")
        return "\n".join(lines) + "\n"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclass
class BackendOutputs:
    """Every sample's model outputs and postprocessed result, stacked in sample order."""

    backend: str
    manifest: ModelManifest
    outputs: dict[str, np.ndarray]
    result: np.ndarray


def collect(model: ModelManifest, dataset: DatasetManifest, hardware: HardwareManifest, backend: str,
            limit: int = 0, batch_size: int = 0) -> BackendOutputs:
    """Run `model` on every sample of `dataset` (the first `limit`), outside LoadGen, in batches."""
    from mlharness.sut.processing import batch_result_function
    from mlharness.sut.runtime import build_runtime

    runtime = build_runtime(model, dataset, hardware, backend, {"dataset_limit": limit})
    try:
        staged = runtime.staged
        count = len(staged)
        staged.load_samples(list(range(count)))
        step = batch_size or int(model.attributes.get("max_batch_size", 1))
        step = step if runtime.backend.supports_batching else 1
        result_of = batch_result_function(runtime.postprocess)
        chunks: dict[str, list[np.ndarray]] = {}
        results: list[np.ndarray] = []
        for start in range(0, count, max(1, step)):
            feed = {name: array[start:start + step] for name, array in staged.arrays.items()}
            outputs = runtime.backend.predict(feed)
            for name, array in outputs.items():
                chunks.setdefault(name, []).append(np.array(array, copy=True))
            results.append(np.array(result_of(outputs, runtime.ctx, feed), copy=True))
        staged.unload_samples([])
    finally:
        runtime.backend.close()
    return BackendOutputs(backend, model, {k: np.concatenate(v) for k, v in chunks.items()}, np.concatenate(results))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    return np.where(both_zero, 1.0, dots / np.where(norms == 0, 1.0, norms))


def compare_arrays(name: str, role: str, spec: TensorSpec | None, a: np.ndarray, b: np.ndarray,
                   tolerance: Tolerance) -> OutputDivergence:
    if a.shape != b.shape:
        raise UserError(f"output {name!r}: the backends disagree on its shape: {a.shape} vs {b.shape}")
    kind = spec.type if spec is not None else ""
    integer = a.dtype.kind in "iub"
    top1 = None
    if kind in RANKED_TYPES and not integer:
        same = (a.argmax(axis=-1) == b.argmax(axis=-1)).reshape(len(a), -1)
        top1 = float(same.all(axis=1).mean())  # a sample agrees when every position's argmax does
    elif kind == "class_indices" and integer:
        top1 = float(np.mean(a.reshape(len(a), -1)[:, 0] == b.reshape(len(b), -1)[:, 0]))
    max_diff = mean_cos = min_cos = None
    problems = []
    if not integer:
        max_diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        cosines = _cosines(a, b)
        mean_cos, min_cos = float(cosines.mean()), float(cosines.min())
        if not max_diff <= tolerance.max_abs_diff:
            problems.append(f"max |diff| {max_diff:.3g} > {tolerance.max_abs_diff:g}")
        if not mean_cos >= tolerance.min_cosine:
            problems.append(f"mean cosine {mean_cos:.6f} < {tolerance.min_cosine:g}")
    if top1 is not None and top1 < tolerance.min_top1_agreement:
        problems.append(f"top-1 agreement {top1:.4f} < {tolerance.min_top1_agreement:g}")
    return OutputDivergence(name, role, tuple(int(d) for d in a.shape[1:]), max_diff, mean_cos, min_cos, top1,
                            tuple(problems))


# -- generative models: token agreement -----------------------------------------------------------------

@dataclass(frozen=True)
class SampleTokens:
    """One sample's generation by one engine: its prompt ids (None when read from an accuracy log, which
    holds only the generated ids), the generated ids and their text."""

    sample: int
    prompt: tuple[int, ...] | None
    generated: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class SampleAgreement:
    sample: int
    same_prompt: bool | None  # None when a side's prompt ids are unknown
    first_difference: int | None  # the first generated position where the engines differ; None: identical
    agreement: float  # tokens before first_difference / the longer answer's length (1.0 when identical)
    tokens: tuple[tuple[int, ...], tuple[int, ...]]
    texts: tuple[str, str]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a missing token counts), None when equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def agree(a: SampleTokens, b: SampleTokens) -> SampleAgreement:
    position = first_difference(a.generated, b.generated)
    longest = max(len(a.generated), len(b.generated))
    agreement = 1.0 if position is None else (position / longest if longest else 1.0)
    same_prompt = None if a.prompt is None or b.prompt is None else a.prompt == b.prompt
    return SampleAgreement(a.sample, same_prompt, position, agreement, (a.generated, b.generated), (a.text, b.text))


@dataclass
class TokenAgreementReport:
    model: str
    dataset: str
    backends: tuple[str, str]
    min_sequence_agreement: float
    samples: list[SampleAgreement] = field(default_factory=list)
    manifests: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = "generated"  # "generated" (both engines run here) or "accuracy logs"

    @property
    def sequence_agreement(self) -> float:
        """The fraction of samples whose generated ids are identical."""
        return sum(s.first_difference is None for s in self.samples) / len(self.samples) if self.samples else 1.0

    @property
    def token_agreement(self) -> float:
        """The mean over samples of the tokens before the first difference over the longer answer."""
        return float(np.mean([s.agreement for s in self.samples])) if self.samples else 1.0

    @property
    def prompt_agreement(self) -> float | None:
        known = [s.same_prompt for s in self.samples if s.same_prompt is not None]
        return sum(known) / len(known) if known else None

    @property
    def first_differences(self) -> dict[int, int]:
        """First differing position -> how many samples first differ there."""
        counts: dict[int, int] = {}
        for s in self.samples:
            if s.first_difference is not None:
                counts[s.first_difference] = counts.get(s.first_difference, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def problems(self) -> list[str]:
        problems = []
        if self.prompt_agreement is not None and self.prompt_agreement < 1.0:
            differ = [s.sample for s in self.samples if s.same_prompt is False]
            problems.append(f"prompt ids differ for {len(differ)} samples (first: {differ[:5]}): the engines "
                            f"tokenize differently, so their generations are not comparable")
        if self.sequence_agreement < self.min_sequence_agreement:
            problems.append(f"sequence agreement {self.sequence_agreement:.4f} < {self.min_sequence_agreement:g}")
        return problems

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "token_agreement", "model": self.model,
                "dataset": self.dataset, "backends": list(self.backends), "source": self.source,
                "samples": len(self.samples), "manifests": self.manifests,
                "prompt_agreement": self.prompt_agreement, "sequence_agreement": self.sequence_agreement,
                "token_agreement": self.token_agreement,
                "first_differences": {str(k): v for k, v in self.first_differences.items()},
                "min_sequence_agreement": self.min_sequence_agreement,
                "per_sample": [{"sample": s.sample, "same_prompt": s.same_prompt,
                                "first_difference": s.first_difference, "agreement": s.agreement,
                                "tokens": [list(t) for t in s.tokens], "texts": list(s.texts)} for s in self.samples],
                "problems": self.problems, "verdict": "PASS" if self.passed else "FAIL"}

    def text(self, shown: int = 10) -> str:
        a, b = self.backends
        n = len(self.samples)
        differ = [s for s in self.samples if s.first_difference is not None]
        prompts = self.prompt_agreement
        lines = [f"{self.model} on {self.dataset} ({n} samples, {self.source}): {a} vs {b}",
                 f"  prompt ids identical     : {'-' if prompts is None else f'{prompts:.4f}'}",
                 f"  generations identical    : {self.sequence_agreement:.4f} ({n - len(differ)}/{n})",
                 (f"  token agreement          : {self.token_agreement:.4f} (tokens before the first difference / "
                  f"the longer answer, mean over samples)")]
        if differ:
            where = ", ".join(f"position {k}: {v}" for k, v in self.first_differences.items())
            lines.append(f"  first differing token at : {where}")
            for s in differ[:shown]:
                lines.append(f"  sample {s.sample}: differs at {s.first_difference}: {a} {list(s.tokens[0])} "
                             f"{s.texts[0]!r} vs {b} {list(s.tokens[1])} {s.texts[1]!r}")
            if len(differ) > shown:
                lines.append(f"  ... {len(differ) - shown} more in the JSON report")
        lines += [f"  {problem}" for problem in self.problems]
        lines.append(f"result: {'PASS' if self.passed else 'FAIL'} (generations identical >= "
                     f"{self.min_sequence_agreement:g})")
        return "\n".join(lines) + "\n"


def collect_generations(model: ModelManifest, dataset: DatasetManifest, hardware: HardwareManifest, backend: str,
                        limit: int = 0) -> list[SampleTokens]:
    """Tokenize every prompt (the first `limit`) and generate greedily on `backend`, outside LoadGen."""
    from mlharness.sut.llm.runtime import build_llm_runtime

    runtime = build_llm_runtime(model, dataset, hardware, backend, {"dataset_limit": limit, "max_batch_size": 1})
    try:
        engine = runtime.backend
        collected = []
        for index in range(len(runtime.staged)):
            prompt = runtime.staged.prompt(index)
            generated = engine.generate(prompt)
            collected.append(SampleTokens(index, tuple(int(t) for t in prompt), tuple(int(t) for t in generated),
                                          engine.decode(generated)))
    finally:
        runtime.backend.close()
    return collected


def _token_report(model_name: str, dataset: str, backends: tuple[str, str], first: list[SampleTokens],
                  second: list[SampleTokens], min_agreement: float, source: str) -> TokenAgreementReport:
    by_sample = {s.sample: s for s in second}
    missing = [s.sample for s in first if s.sample not in by_sample]
    if missing or len(first) != len(second):
        raise UserError(f"the two sides hold different samples ({len(first)} vs {len(second)}; "
                        f"first missing from {backends[1]}: {missing[:5]})")
    report = TokenAgreementReport(model_name, dataset, backends, min_agreement, source=source)
    report.samples = [agree(s, by_sample[s.sample]) for s in first]
    return report


def read_generations(path: Path) -> list[SampleTokens]:
    """An accuracy run's generations.jsonl (mlharness.running.llm_accuracy): one sample a line."""
    if not path.is_file():
        raise UserError(f"{path}: no such file (an accuracy run of a generative model writes accuracy/generations.jsonl)")
    samples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            samples.append(SampleTokens(int(row["sample"]), None, tuple(int(t) for t in row["tokens"]),
                                        str(row.get("text", ""))))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}:{number}: expected a JSON line with sample and tokens, got {line[:80]!r} "
                            f"({type(exc).__name__}: {exc})") from None
    return sorted(samples, key=lambda s: s.sample)


def compare_generation_logs(paths: tuple[Path, Path], min_agreement: float = 1.0) -> TokenAgreementReport:
    """Token agreement between two accuracy runs' generations.jsonl (the ids LoadGen logged)."""
    first, second = (read_generations(Path(p)) for p in paths)
    names = tuple(str(p) for p in paths)
    return _token_report("-", "-", names, first, second, min_agreement, "accuracy logs")  # type: ignore[arg-type]


def compare_backends(index: SpecIndex, model_name: str, dataset_name: str | None, backends: tuple[str, str],
                     tolerance: Tolerance, hardware: str = "cpu", limit: int = 0,
                     batch_size: int = 0) -> DivergenceReport | TokenAgreementReport:
    from mlharness.running.resolve import select_model

    if len(backends) != 2 or backends[0] == backends[1]:
        raise UserError(f"--backends: expected two different backends such as torch,onnxruntime, got {','.join(backends)}")
    manifests = [select_model(index, model_name, name) for name in backends]
    for manifest, name in zip(manifests, backends):
        if manifest.framework != name:
            raise UserError(f"model {model_name!r} has no manifest for backend {name!r}")
    dataset_name = dataset_name or manifests[0].default_dataset
    if not dataset_name:
        raise UserError(f"{manifests[0].path}: dataset: no default dataset; pass --dataset")
    dataset = index.find("dataset", dataset_name)
    hardware_manifest = index.find("hardware", hardware)
    for name in backends:
        # the same environment a run gets from the software manifest (e.g. HF_HUB_OFFLINE)
        for var, value in index.find("software", name).environment.items():
            os.environ.setdefault(var, value)
    generative = [m.generation is not None for m in manifests]
    if any(generative):
        if not all(generative):
            raise UserError(f"model {model_name!r}: the {backends[generative.index(False)]} manifest is not generative "
                            f"and the {backends[generative.index(True)]} one is; compare two engines of one kind")
        first_tokens, second_tokens = (collect_generations(m, dataset, hardware_manifest, name, limit)
                                       for m, name in zip(manifests, backends))
        report = _token_report(model_name, dataset.name, backends, first_tokens, second_tokens,
                               tolerance.min_top1_agreement, "generated")
        report.manifests = {name: m.identity() for m, name in zip(manifests, backends)}
        return report
    collected = [collect(m, dataset, hardware_manifest, name, limit, batch_size) for m, name in zip(manifests, backends)]
    first, second = collected
    report = DivergenceReport(model_name, dataset.name, backends, len(first.result), tolerance,
                              manifests={name: m.identity() for m, name in zip(manifests, backends)})
    specs = {spec.name: spec for spec in first.manifest.outputs}
    for name, array in first.outputs.items():
        if name not in second.outputs:
            raise UserError(f"output {name!r}: {backends[1]} gave no such output (it gave {sorted(second.outputs)})")
        report.outputs.append(compare_arrays(name, "output", specs.get(name), array, second.outputs[name], tolerance))
    result_spec = first.manifest.result or first.manifest.outputs[0]
    report.outputs.append(compare_arrays(result_spec.name, "result", result_spec, first.result, second.result, tolerance))
    return report
