"""Accuracy mode: decode LoadGen's accuracy log with the model's result description, compute
the manifest's metric, and compare with the reference log."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mlharness.errors import UserError
from mlharness.running.metrics import MetricResult, get_metric
from mlharness.specs.manifests import ReferenceLog, TensorSpec


def decode_accuracy_log(path: Path, result: TensorSpec, dims: dict[str, int] | None = None) -> dict[int, np.ndarray]:
    """Each logged response as an array, by sample index (the last one wins if a sample repeats)."""
    try:
        entries = json.loads(path.read_text() or "[]")
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: expected LoadGen's accuracy log (a JSON list): {exc}") from None
    dtype = np.dtype(result.element_type)
    named = dims or {}  # the model's named dimensions (its `dims` attribute), where it has any
    shape = tuple(int(named.get(d, -1)) if isinstance(d, str) else d for d in result.sample_shape())
    decoded: dict[int, np.ndarray] = {}
    for entry in entries:
        data = bytes.fromhex(entry["data"])
        if len(data) % dtype.itemsize:
            raise UserError(f"{path}: sample {entry['qsl_idx']}: {len(data)} bytes is not a whole number of {dtype}")
        array = np.frombuffer(data, dtype=dtype)
        if shape and -1 not in shape:
            if array.size != int(np.prod(shape)):
                raise UserError(f"{path}: sample {entry['qsl_idx']}: expected {shape} {dtype}, got {array.size} values")
            array = array.reshape(shape)
        decoded[int(entry["qsl_idx"])] = array
    _refuse_non_finite(path, result, decoded)
    return decoded


def _refuse_non_finite(path: Path, result: TensorSpec, decoded: dict[int, np.ndarray]) -> None:
    """A NaN or inf in a response: no metric scores it honestly (argmax reads NaN as the top class), so
    the accuracy is refused, naming the first sample and how many responses hold one."""
    if not np.issubdtype(np.dtype(result.element_type), np.inexact):
        return
    bad = sorted(index for index, array in decoded.items() if not np.isfinite(array).all())
    if not bad:
        return
    array = decoded[bad[0]]
    kinds = " and ".join(name for name, found in (("NaN", np.isnan(array).any()), ("inf", np.isinf(array).any()))
                         if found)
    more = f"; {len(bad)} of the {len(decoded)} responses hold one" if len(bad) > 1 else ""
    # Named from the run's folder: a failed run's staging folder is renamed (the error says to what).
    raise UserError(f"{path.parent.name}/{path.name}: sample {bad[0]}: the model's output {result.name!r} holds "
                    f"{kinds} ({int((~np.isfinite(array)).sum())} of {array.size} values){more}; accuracy is not "
                    f"scored over non-finite outputs")


@dataclass
class AccuracyReport:
    metric: str
    values: dict[str, float]
    headline: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    reference: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str | None:
        if not self.checks:
            return None
        return "PASS" if all(c["pass"] for c in self.checks) else "FAIL"

    def text(self) -> str:
        lines = [self.headline]
        lines += [f"{name}={value:.6f}" for name, value in self.values.items()]
        if self.reference:
            lines.append(f"reference={self.reference}")
        lines += self.notes
        for check in self.checks:
            lines.append(check["line"])
        if self.verdict:
            lines.append(f"result={self.verdict}")
        return "\n".join(lines) + "\n"

    def as_record(self) -> dict[str, Any]:
        return {"metric": self.metric, "values": self.values, "headline": self.headline,
                "verdict": self.verdict, "reference": self.reference, "checks": self.checks,
                "notes": self.notes}


def evaluate(outputs: dict[int, np.ndarray], labels: Sequence[Any], metric_spec: dict[str, Any],
             where: str) -> MetricResult:
    name = metric_spec.get("metric")
    if not name:
        raise UserError(f"{where}: accuracy.metric: expected a metric name for accuracy mode")
    if not outputs:
        raise UserError(f"{where}: the accuracy log holds no responses")
    params = {k: v for k, v in metric_spec.items() if k != "metric"}
    return get_metric(name, where)(outputs, labels, params)


def _value_check(name: str, spec: dict[str, float], got: float | None) -> dict[str, Any]:
    """One accuracy value against the reference's: within `tolerance` either side, or (`min_fraction`,
    MLPerf's LLM rule) at least that fraction of the reference's value, one-sided: higher always passes."""
    expected = spec["expected"]
    got_text = "missing" if got is None else f"{got:.6f}"
    if "min_fraction" in spec:
        fraction = spec["min_fraction"]
        ok = got is not None and got >= fraction * expected
        return {"name": name, "expected": expected, "min_fraction": fraction, "measured": got, "pass": ok,
                "line": f"{name}: expected at least {fraction:g} x {expected:.6f} = {fraction * expected:.6f}, "
                        f"measured {got_text}: {'PASS' if ok else 'FAIL'}"}
    tolerance = spec["tolerance"]
    ok = got is not None and abs(got - expected) <= tolerance
    return {"name": name, "expected": expected, "tolerance": tolerance, "measured": got, "pass": ok,
            "line": f"{name}: expected {expected:.6f} ± {tolerance:g}, measured {got_text}: {'PASS' if ok else 'FAIL'}"}


def compare(result: MetricResult, reference: ReferenceLog | None, outputs: dict[int, np.ndarray],
            metric_name: str) -> AccuracyReport:
    report = AccuracyReport(metric_name, result.values, result.headline)
    if reference is None:
        return report
    report.reference = f"{reference.ref} ({reference.path})"
    for name, spec in reference.accuracy.items():
        report.checks.append(_value_check(name, spec, result.values.get(name)))
    for item in reference.outputs:
        index = int(item["sample"])
        got = outputs.get(index)
        expected = np.asarray(item["values"])
        atol = float(item.get("atol", 0.0))
        if got is None:
            ok, detail = False, "not in the accuracy log"
        else:
            flat = got.reshape(-1)[: expected.size].astype(np.float64)
            ok = flat.size == expected.size and bool(np.allclose(flat, expected, atol=atol, rtol=0))
            diff = float(np.max(np.abs(flat - expected))) if flat.size == expected.size else float("inf")
            detail = f"max |diff| {diff:.3g} (atol {atol:g})"
        report.checks.append({"name": f"output[{index}]", "pass": ok, "expected": expected.tolist(),
                              "line": f"output of sample {index}: {detail}: {'PASS' if ok else 'FAIL'}"})
    return report
