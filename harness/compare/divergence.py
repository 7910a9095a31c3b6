"""Cross-backend divergence: run one model's manifests for two backends on the same samples (same
dataset, each manifest's own preprocessing) and compare, per model output and for the
postprocessed result, the max absolute difference, the cosine similarity per sample and the
top-1 agreement. Frameworks load through sut/ only when a comparison runs."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from harness.errors import UserError
from specs.index import SpecIndex
from specs.manifests import DatasetManifest, HardwareManifest, ModelManifest, TensorSpec

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
    from sut.processing import batch_result_function
    from sut.runtime import build_runtime

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


def compare_backends(index: SpecIndex, model_name: str, dataset_name: str | None, backends: tuple[str, str],
                     tolerance: Tolerance, hardware: str = "cpu", limit: int = 0,
                     batch_size: int = 0) -> DivergenceReport:
    from harness.running.runner import select_model

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
