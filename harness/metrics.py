"""Accuracy metrics, pluggable by name. A metric reads every sample's decoded result by sample
index (so metrics that combine several samples, such as correlations over pairs, fit too) and
returns named figures plus the headline line for accuracy.txt."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from harness.errors import UserError


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


def get_metric(name: str, where: str) -> Metric:
    if name not in _METRICS:
        raise UserError(f"{where}: metric: expected one of {sorted(_METRICS)}, got {name!r}")
    return _METRICS[name]


def names() -> list[str]:
    return sorted(_METRICS)


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
