"""Accuracy metrics, pluggable by name. A metric reads every sample's decoded result by sample
index (so metrics that combine several samples, such as correlations over pairs, fit too) and
returns named figures plus the headline line for accuracy.txt. Third-party metrics register through
the `mlharness.metrics` entry point group (a name and the metric function), loaded when first used."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mlharness.errors import UserError, require
from mlharness.specs import manifests

ENTRY_POINT_GROUP = "mlharness.metrics"


@dataclass(frozen=True)
class MetricResult:
    values: dict[str, float]
    headline: str  # first line of accuracy.txt, in the official scripts' style where one exists
    details: dict[str, Any]


Metric = Callable[[Mapping[int, np.ndarray], Sequence[Any], dict[str, Any]], MetricResult]
_METRICS: dict[str, Metric] = {}


def metric(name: str) -> Callable[[Metric], Metric]:
    def register(func: Metric) -> Metric:
        _METRICS[name] = func
        return func
    return register


_plugins = manifests.PluginEntryPoints(ENTRY_POINT_GROUP, _METRICS)  # read at first use, loaded when used


def get_metric(name: str, where: str) -> Metric:
    if name not in _METRICS and name in _plugins():
        ep = _plugins()[name]
        func = manifests.load_entry_point(ep)
        if not callable(func):
            raise UserError(f"entry point {ep.group}:{name} = {ep.value}: expected a metric function, got {func!r}")
        metric(name)(func)
    if name not in _METRICS:
        raise UserError(f"{where}: metric: expected one of {names()}, got {name!r}")
    return _METRICS[name]


def names() -> list[str]:
    return sorted({*_METRICS, *_plugins()})


@metric("topk")
def topk(outputs: Mapping[int, np.ndarray], labels: Sequence[Any], params: dict[str, Any]) -> MetricResult:
    """Classification: each result is the top-k class indices, best first (or scores, ranked here)."""
    offset = int(params.get("label_offset", 0))
    k_values = [int(k) for k in params.get("k", [1, 5])]
    hits = {k: 0 for k in k_values}
    for index, result in outputs.items():
        flat = np.asarray(result).reshape(-1)
        ranked = flat if flat.dtype.kind in "iu" else np.argsort(-flat, kind="stable")
        label = int(labels[index]) + offset
        for k in k_values:
            hits[k] += int(label in ranked[:k].tolist())
    total = len(outputs)
    values = {f"top{k}": (hits[k] / total if total else 0.0) for k in k_values}
    first = k_values[0]
    headline = f"accuracy={100.0 * values[f'top{first}']:.3f}%, good={hits[first]}, total={total}"
    return MetricResult(values, headline, {"good": hits, "total": total})


def _scored_pairs(outputs: Mapping[int, np.ndarray], labels: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """(cosine similarity, gold score) for every scored pair whose two outputs are present.

    The label of sample i lists the pairs it opens, [[j, score], ...]: each pair is listed once and
    its two outputs are read back by sample index, whatever order LoadGen logged them in."""
    predicted, gold, skipped = [], [], 0
    for index in sorted(outputs):
        pairs = labels[index] or []
        for pair in pairs:
            other, score = int(pair[0]), float(pair[1])
            if other not in outputs:
                skipped += 1  # a run over part of the dataset (dataset_limit) leaves some pairs open
                continue
            a = np.asarray(outputs[index], np.float64).reshape(-1)
            b = np.asarray(outputs[other], np.float64).reshape(-1)
            norms = np.linalg.norm(a) * np.linalg.norm(b)
            predicted.append(float(a @ b / norms) if norms else 0.0)
            gold.append(score)
    return np.asarray(predicted), np.asarray(gold), skipped


def _correlation(kind: str, outputs: Mapping[int, np.ndarray], labels: Sequence[Any]) -> MetricResult:
    predicted, gold, skipped = _scored_pairs(outputs, labels)
    if len(gold) < 2:
        raise UserError(f"{kind}: expected at least 2 scored pairs with both outputs logged, got {len(gold)}")
    stats = require("scipy.stats", "text", f"the {kind}_pairs metric")  # only the pair metrics need scipy

    value = float(stats.spearmanr(predicted, gold)[0] if kind == "spearman" else stats.pearsonr(predicted, gold)[0])
    headline = f"{kind}={value:.4f}, pairs={len(gold)}" + (f", skipped={skipped}" if skipped else "")
    return MetricResult({kind: value}, headline, {"pairs": len(gold), "skipped": skipped})


@metric("spearman_pairs")
def spearman_pairs(outputs: Mapping[int, np.ndarray], labels: Sequence[Any], params: dict[str, Any]) -> MetricResult:
    """Rank correlation between the cosine similarity of two samples' outputs and a gold score."""
    return _correlation("spearman", outputs, labels)


@metric("pearson_pairs")
def pearson_pairs(outputs: Mapping[int, np.ndarray], labels: Sequence[Any], params: dict[str, Any]) -> MetricResult:
    """Linear correlation between the cosine similarity of two samples' outputs and a gold score."""
    return _correlation("pearson", outputs, labels)
