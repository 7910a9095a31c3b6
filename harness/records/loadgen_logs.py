"""Read LoadGen's own logs: the summary's key/value lines and the detail log's errors."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# The headline metric of each scenario as LoadGen's summary names it.
SCENARIO_METRIC = {
    "Offline": ("samples_per_second", "Samples per second"),
    "Server": ("completed_samples_per_second", "Completed samples per second"),
    "SingleStream": ("p90_latency_ns", "90.0th percentile latency (ns)"),
    "MultiStream": ("p99_latency_ns", "99.0th percentile latency (ns)"),
}
# The latency percentiles LoadGen's summary reports: (key, percentile).
LATENCY_PERCENTILES = (("p50_latency_ns", 50), ("p90_latency_ns", 90), ("p95_latency_ns", 95),
                       ("p97_latency_ns", 97), ("p99_latency_ns", 99), ("p99_9_latency_ns", 99.9))
# Every figure parse_summary takes from LoadGen's summary by its slugged label, in run.json's order.
SUMMARY_FIGURES = ("samples_per_second", "completed_samples_per_second", "scheduled_samples_per_second",
                   "min_latency_ns", "max_latency_ns", "mean_latency_ns", *(key for key, _ in LATENCY_PERCENTILES),
                   "target_qps", "min_duration_ms", "samples_per_query", "min_query_count",
                   "performance_sample_count", "early_stopping_90th_percentile_estimate",
                   "early_stopping_99th_percentile_estimate")

_LINE = re.compile(r"^\s*([^:]+?)\s*:\s*(.+?)\s*$")


def _number(text: str) -> float | int | str:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _slug(key: str) -> str:
    key = key.replace("%", "pct")
    match = re.match(r"^(\d+(?:\.\d+)?) percentile latency \(ns\)$", key)
    if match:
        pct = float(match.group(1))
        return f"p{pct:g}".replace(".", "_") + "_latency_ns"
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


def parse_summary(path: Path) -> dict[str, Any]:
    """Every `key : value` line of mlperf_log_summary.txt, keys slugged, numbers as numbers."""
    raw: dict[str, Any] = {}
    text = path.read_text(errors="replace") if path.is_file() else ""
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith(("=", " *")):
            raw.setdefault(match.group(1).strip(), _number(match.group(2)))
    parsed = {_slug(k): v for k, v in raw.items()}
    result = {"raw": raw, "valid": raw.get("Result is") == "VALID",
              "result": raw.get("Result is"), "scenario": raw.get("Scenario"), "mode": raw.get("Mode")}
    for key in SUMMARY_FIGURES:
        if key in parsed:
            result[key] = parsed[key]
    # LoadGen's token mode (use_token_latencies): TTFT, TPOT and tokens/s (mlharness.records.token_metrics).
    from mlharness.records.token_metrics import token_figures

    result.update(token_figures(raw))
    scenario = result.get("scenario")
    if scenario in SCENARIO_METRIC:
        metric_key, label = SCENARIO_METRIC[scenario]
        value = raw.get(label)
        if value is None and metric_key.endswith("latency_ns"):
            value = result.get(metric_key.replace("_ns", "") + "_ns")
        result["metric"] = {"name": metric_key, "label": label, "value": value}
    return result


def detail_problems(path: Path) -> dict[str, list[str]]:
    """Errors and warnings LoadGen logged in mlperf_log_detail.txt."""
    found: dict[str, list[str]] = {"errors": [], "warnings": []}
    if not path.is_file():
        return found
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith(":::MLLOG"):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG"):])
        except json.JSONDecodeError:
            continue
        meta = entry.get("metadata", {})
        text = f"{entry.get('key')}: {entry.get('value')}"
        if meta.get("is_error"):
            found["errors"].append(text)
        elif meta.get("is_warning"):
            found["warnings"].append(text)
    return found


def detail_values(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """The logged value of each of `keys` (effective settings, seeds) from the detail log."""
    wanted, found = set(keys), {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(":::MLLOG") and any(f'"{k}"' in line for k in wanted):
                try:
                    entry = json.loads(line[len(":::MLLOG"):])
                except json.JSONDecodeError:
                    continue
                if entry.get("key") in wanted:
                    found[entry["key"]] = entry.get("value")
    return found
