"""`mlharness bricks`: for each model, a LoadGen run that measures it whole, then a bricks run
(mlharness.bricks.runner) that decomposes, benchmarks and composes it and compares the two. Each is a
run of its own (its own process, folder and record, stored by the launcher); models of one
invocation share bricks through the results database, in order."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from mlharness.records.bricks_payload import BricksSummary
from mlharness.records.run_record import RunRecord
from mlharness.running.request import RunRequest
from mlharness.tables import format_table

# The measuring run: long enough for a stable median, short enough for a suite (ms; --set overrides).
MEASURE_SETTINGS = ("min_duration=5000", "min_query_count=64")


@dataclass
class SuiteOutcome:
    bricks: list[RunRecord] = field(default_factory=list)
    measured: list[RunRecord] = field(default_factory=list)


def measuring_request(base: RunRequest, batch: int) -> RunRequest:
    """The LoadGen run of the model whole at the bricks' batch: SingleStream at batch 1, else
    MultiStream with one query of `batch` samples formed into one batch."""
    from dataclasses import replace

    overrides = list(MEASURE_SETTINGS)
    if batch == 1:
        scenario = "SingleStream"
    else:
        scenario = "MultiStream"
        overrides += [f"samples_per_query={batch}", f"max_batch_size={batch}"]
    return replace(base, kind="loadgen", scenario=scenario, mode="performance",
                   overrides=(*overrides, *base.overrides), backend=base.backend or "onnxruntime")


def run_suite(models: Sequence[str], base: RunRequest, measure: bool = True, say: Any = print) -> SuiteOutcome:
    from mlharness.running.progress import Steps

    outcome = SuiteOutcome()
    with Steps(len(models), quiet=base.quiet, unit="models") as progress:
        for model in models:
            started = time.monotonic()
            progress.starting(model)
            _run_model(model, base, measure, say, outcome)
            progress.finished(outcome.bricks[-1].model_name or model, "ok", time.monotonic() - started)
    if len(outcome.bricks) > 1:
        say(format_suite(outcome.bricks))
    return outcome


def _run_model(model: str, base: RunRequest, measure: bool, say: Any, outcome: SuiteOutcome) -> None:
    """The model's measuring run (unless not asked for), then its bricks run; records into `outcome`."""
    from dataclasses import replace

    from mlharness.running.launcher import run_request

    measured_id = None
    if measure:
        measured = run_request(measuring_request(replace(base, model=model), base.batch))
        outcome.measured.append(measured)
        measured_id = measured.run_id
        p50 = measured.perf.p50_latency_ns if measured.perf else None
        say(f"{measured.model_name}: measured whole by LoadGen {measured.scenario}: p50 "
            f"{p50 / 1e6:.3f} ms (run {measured.run_id})" if p50 else f"{model}: measured (run {measured.run_id})")
    record = run_request(replace(base, model=model, kind="bricks", measured_run=measured_id))
    outcome.bricks.append(record)
    say(format_model(record))


def _ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def format_model(record: RunRecord) -> str:
    import json

    data = json.loads((Path(record.results_path) / "bricks.json").read_text())
    summary = data["summary"]
    lines = [f"{record.model_name}: {summary['nodes']} nodes as executed ({summary['optimization_level']}), "
             f"{summary['unique_bricks']} unique bricks, {summary['reused_bricks']} reused from the database"]
    top = {key: i for i, key in enumerate(data["top_bricks"])}
    rows = [(b["label"], b["multiplicity"], b["median_ms"], b["total_ms"],
             f"{b['ci_low_ms']:.3g}-{b['ci_high_ms']:.3g}" if b.get("ci_low_ms") is not None else "-",
             b.get("best_variant") or "-", "yes" if b["reused"] else "")
            for b in sorted(data["bricks"], key=lambda b: top.get(b["key"], len(top)))[:len(top)]]
    lines.append(format_table(("top brick", "x", "median ms", "total ms", "95% CI ms", "best variant", "reused"), rows))
    if summary.get("estimate_only"):  # no variants: no lower bound to show
        ops = [(r["op_type"], r["nodes"], r["measured_ms"], f"{100 * r['measured_share']:.1f}%") for r in data["by_op_type"]]
        lines.append(format_table(("op type", "nodes", "stored ms", "share"), ops))
    else:
        ops = [(r["op_type"], r["nodes"], r["measured_ms"], f"{100 * r['measured_share']:.1f}%", r["lower_bound_ms"],
                f"{100 * r['lower_bound_share']:.1f}%", r["gap_ms"]) for r in data["by_op_type"]]
        lines.append(format_table(("op type", "nodes", "measured ms", "share", "lower bound ms", "share", "gap ms"), ops))
    if summary.get("estimate_only"):
        lines.append(f"  estimate {_ms(summary['estimate_ms'])} ms (95% CI +-{_ms(summary['estimate_ci_ms'])} ms) "
                     f"composed from stored bricks: {summary['new_measurements']} new measurements "
                     f"({summary['measured_bricks']} bricks of {summary['unique_bricks']}"
                     + (", the empty call" if summary.get("empty_call_measured") else "")
                     + f"), {summary['estimate_seconds']:.2f} s")
        lines.append(f"  results : {record.results_path}")
        return "\n".join(lines)
    error = summary.get("error_pct")
    lines.append(f"  estimate {_ms(summary['estimate_ms'])} ms, lower bound {_ms(summary['lower_bound_ms'])} ms, "
                 f"measured {_ms(summary['measured_ms'])} ms (LoadGen p50)"
                 + (f", error {error:+.1f}%" if error is not None else "")
                 + f"; plain session {_ms(summary['plain_session_ms'])} ms")
    speedup = summary.get("speedup")
    lines.append(f"  benchmarking time: bricks {summary['brick_seconds']:.2f} s "
                 f"(+{summary['reuse_saved_seconds']:.2f} s saved by reuse; lower-bound variants "
                 f"{summary.get('variant_seconds', 0.0):.2f} s), whole model to the same confidence "
                 f"{summary['whole_model_seconds']:.2f} s" + (f", speedup {speedup:.2f}x" if speedup else ""))
    lines.append(f"  results : {record.results_path}")
    return "\n".join(lines)


def format_suite(records: Sequence[RunRecord]) -> str:
    rows = []
    for r in records:
        s = r.bricks_summary or BricksSummary()
        rows.append((r.model_name, s.unique_bricks, s.reused_bricks, s.estimate_ms, s.lower_bound_ms, s.measured_ms,
                     f"{s.error_pct:+.1f}%" if s.error_pct is not None else "-"))
    return format_table(("model", "bricks", "reused", "estimate ms", "lower bound ms", "measured ms", "error"), rows)
