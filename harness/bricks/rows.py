"""What a bricks run's measurements become, and what it reads of earlier runs: the names of a brick's
variants, a measurement as the database's row (mlharness.store.result_store stores `bricks.measured`),
a brick's entry in bricks.json, the run's bricks.json and README, and the stored measurements and the
measured LoadGen run it reads (never writes) from the results database."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json, write_text
from mlharness.bricks import compose
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord
from mlharness.running.request import RunRequest
from mlharness.store import result_store
from mlharness.sut.brick_timing import Measurement, available_cpus
from mlharness.sut.bricks import AS_EXECUTED, Brick

# The empty session call is stored with the bricks, under this key (one row per thread count), so an
# estimate composed from stored bricks subtracts the same empty call as the run that measured them.
EMPTY_CALL_KEY = "empty-call"
BRICKS_JSON_VERSION = 1
ENTRY_FIGURES = ("median_ms", "ci_low_ms", "ci_high_ms", "repeats", "stable")  # a variant's, in bricks.json

Row = dict[str, Any]  # a measurement as result_store's brick_measurements table holds it


def fingerprint(system: dict[str, Any], hardware: dict[str, Any], versions: dict[str, str],
                providers: list[str]) -> str:
    """What a brick's time depends on besides the brick: the CPU, the CPUs it may use, the device and
    the runtime's version. A later model or invocation reuses a brick only under the same fingerprint."""
    data = {"cpu_model": system.get("cpu_model"), "cpus_available": system.get("cpus_available"),
            "device": hardware.get("device"), "cpu_affinity": hardware.get("cpu_affinity") or [],
            "onnxruntime": versions.get("onnxruntime"), "providers": providers}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def variant_name(threads: int, level: str, provider: str) -> str:
    return f"threads={threads},opt={level},ep={provider}"


def parse_variant(name: str) -> tuple[int, str, str]:
    parts = dict(item.split("=", 1) for item in name.split(","))
    return int(parts["threads"]), parts["opt"], parts["ep"]


def variants(threads: int, wanted: bool) -> list[tuple[int, str]]:
    """Benanza's variants: every intra-op thread count up to the CPUs this process may use (powers of
    two and the count itself), at the as-executed level and with ONNX Runtime optimizing the brick."""
    if not wanted:
        return []
    cpus = available_cpus()
    counts = sorted({1, cpus, *(2 ** k for k in range(1, 8) if 2 ** k < cpus)} | ({threads} if threads else set()))
    return [(t, level) for t in counts for level in (AS_EXECUTED, "enable_all")]


def brick_row(brick: Brick, variant: str, measurement: Measurement) -> Row:
    """A brick measurement as the database stores it (mlharness.store.result_store)."""
    return {"brick_key": brick.key, "variant": variant, "op_type": brick.op_type, "label": brick.label,
            "descriptor": brick.describe() | {"nodes": None, "multiplicity": None}, **measurement.describe()}


def empty_row(variant: str, measurement: Measurement) -> Row:
    return {"brick_key": EMPTY_CALL_KEY, "variant": variant, "op_type": "(empty call)", "label": "empty session call",
            "descriptor": {"empty_call": True}, **measurement.describe()}


def entry(brick: Brick, figure: compose.BrickFigures, main: Row, reused: bool, found: dict[str, Row]) -> dict[str, Any]:
    """A brick's entry in bricks.json: what it is, its figures as executed (`main`) and every variant's."""
    return brick.describe() | {
        "reused": reused, "median_ms": figure.median_ms, "net_ms": figure.net_ms,
        "ci_low_ms": main.get("ci_low_ms"), "ci_high_ms": main.get("ci_high_ms"), "repeats": main.get("repeats"),
        "stable": bool(main.get("stable")), "total_ms": figure.total_ms,
        "variants": {name: {k: r.get(k) for k in ENTRY_FIGURES} for name, r in sorted(found.items())},
        "best_variant": figure.best_variant, "best_net_ms": figure.best_ms}


def known_keys(known: dict[tuple[str, str], Any], variant: str) -> set[str]:
    return {key for key, name in known if name == variant}


def known_measurements(request: RunRequest, fp: str, keys: list[str]) -> dict[tuple[str, str], Row]:
    """Brick measurements already in the results database for this fingerprint (read only)."""
    try:
        store = result_store.ResultStore.reading(result_store.default_db_path(request.results_dir))
        if store is None:
            return {}
        with store:  # a query that meets damaged pages is a UserError too, on leaving
            return store.brick_measurements(fp, keys)
    except UserError:
        return {}  # a damaged database: every brick is measured; storing the record says why


def measured_latency(request: RunRequest) -> dict[str, Any] | None:
    """The median latency (ms) of the LoadGen run that measured the model whole, when one was named."""
    if not request.measured_run:
        return None
    store = result_store.ResultStore.reading(result_store.default_db_path(request.results_dir))
    if store is None:
        raise UserError(f"measured run {request.measured_run}: no results database to read it from")
    with store:
        measured = store.get_record(request.measured_run)
    p50 = measured.perf.p50_latency_ns if measured.perf else None
    if not measured.is_ok or p50 is None:
        raise UserError(f"measured run {request.measured_run}: no latency to compare with (status {measured.status})")
    return {"run_id": measured.run_id, "latency_ms": float(p50) / 1e6, "scenario": measured.scenario}


def write_results(staged_dir: Path, record: RunRecord, model_name: str, summary: dict[str, Any],
                  figures: list[compose.BrickFigures], entries: list[dict[str, Any]], measured: list[Row],
                  **rules: Any) -> dict[str, Any]:
    """bricks.json and the README written into the staged run; returns the record's `bricks`.
    `rules`: rule, variant_rule, main_variant and empty_call_ms, as bricks.json states them."""
    data = {"schema_version": BRICKS_JSON_VERSION, "model": model_name, "summary": summary, **rules,
            "by_op_type": compose.by_op_type(figures), "top_bricks": [f.key for f in compose.top_bricks(figures)],
            "bricks": entries}
    write_json(staged_dir / "bricks.json", data)
    write_text(staged_dir / "README.md", readme(model_name, summary, record.command))
    (staged_dir / "optimized.onnx").unlink(missing_ok=True)  # large, and made again from the graph on demand
    return {"summary": summary, "by_op_type": data["by_op_type"], "bricks_json": "bricks.json", "measured": measured}


def readme(model: str, summary: dict[str, Any], command: str) -> str:
    def ms(value: Any) -> str:
        return f"{value:.3f} ms" if isinstance(value, (int, float)) else "-"

    return (f"# Bricks of {model}\n\nCommand: `{command}`\n\n"
            f"- nodes as executed: {summary['nodes']}, unique bricks: {summary['unique_bricks']} "
            f"({summary['reused_bricks']} reused from the results database)\n"
            f"- composed estimate: {ms(summary['estimate_ms'])}; lower bound: {ms(summary['lower_bound_ms'])}; "
            f"measured (LoadGen p50): {ms(summary['measured_ms'])}\n\n"
            "Every brick, its multiplicity, median, confidence interval and variants: `bricks.json`.\n")
