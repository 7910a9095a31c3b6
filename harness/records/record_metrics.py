"""Named numeric figures of a run record, shared by the results database, sweeps, gates and reports.

A figure is named `<scenario>.<key>` for LoadGen's performance figures (`offline.samples_per_second`,
`server.p99_latency_ns`), `accuracy.<name>` for accuracy values (`accuracy.top1`) and `coldstart.<key>`
for cold start and memory (`coldstart.load_seconds`, `coldstart.first_inference_seconds`,
`coldstart.peak_rss_bytes`, `coldstart.device_peak_allocated_bytes`), so a gate rule names exactly
what it checks."""
from __future__ import annotations

import math
from typing import Any, Mapping

from mlharness.records.bricks_payload import BricksResult
from mlharness.records.payloads import AccuracyResult, ColdStart, Performance

# Which way is better, by the figure's key (the part after the dot); checked in order.
_HIGHER_IS_BETTER = ("per_second", "accuracy.", "qps")
_LOWER_IS_BETTER = ("latency", "_ns", "seconds", "bytes", "queue_share")  # queue_share: a token run's time waiting

# The headline figure of each scenario and whether a larger value is better.
HEADLINE = {
    "Offline": ("samples_per_second", True),
    "Server": ("completed_samples_per_second", True),
    "SingleStream": ("p90_latency_ns", False),
    "MultiStream": ("p99_latency_ns", False),
    "bricks": ("estimate_ms", False),  # a layer benchmark (mlharness.bricks): its composed estimate
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _part(record: Any, name: str) -> Any:
    """A top-level field of a RunRecord or of its dict (this leaf module imports no RunRecord)."""
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def flatten(record: Any) -> dict[str, float]:
    """Every numeric performance, accuracy and cold-start figure of a record (a RunRecord or its dict),
    read through the payloads' typed views (mlharness.records.payloads)."""
    figures: dict[str, float] = {}
    scenario = str(_part(record, "scenario") or "unknown").lower()
    for key, value in Performance.from_dict(_part(record, "performance")).figures().items():
        figures[f"{scenario}.{key}"] = value
    for key, value in AccuracyResult.from_dict(_part(record, "accuracy")).values.items():
        if (number := _number(value)) is not None:
            figures[f"accuracy.{key}"] = number
    cold_start = ColdStart.from_dict(_part(record, "cold_start"))
    for key, value in cold_start.figures().items():  # the warm-up is a setting, not a figure: left out
        figures[f"coldstart.{key}"] = value
    for key, value in (cold_start.device_memory.figures() if cold_start.device_memory else {}).items():
        figures[f"coldstart.device_{key}"] = value
    summary = BricksResult.from_dict(_part(record, "bricks")).summary
    for key, value in (summary.figures() if summary else {}).items():
        figures[f"bricks.{key}"] = value
    return figures


def higher_is_better(name: str) -> bool:
    """Direction of a figure by its name; throughput and accuracy up, latency, time and memory down."""
    if name.startswith("accuracy.") or any(part in name for part in _HIGHER_IS_BETTER):
        return True
    if any(part in name for part in _LOWER_IS_BETTER):
        return False
    return True


def headline(record: Any) -> tuple[str, float | None]:
    """(figure name, value) of the scenario's headline metric, value None when the run has none."""
    scenario = str(_part(record, "scenario") or "")
    key, _ = HEADLINE.get(scenario, ("samples_per_second", True))
    name = f"{scenario.lower()}.{key}"
    return name, flatten(record).get(name)
