"""`mlharness bricks --estimate-only` (and `--measure-missing`): a model composed from the bricks the results
database holds under this run's fingerprint, as executed. Nothing else is measured: no whole model, no
variants. A brick (or the empty call) not stored is refused in one line naming the first few, unless the
mode is "measure-missing": then only those are measured, by the estimate's rule, and stored as any
run's are (their rows travel in the record, mlharness.bricks.rows)."""
from __future__ import annotations

import time
from typing import Any

from mlharness.bricks import compose
from mlharness.bricks.prepared import Prepared
from mlharness.bricks.refine import refine
from mlharness.bricks.rows import EMPTY_CALL_KEY, Row, brick_row, empty_row, entry, write_results
from mlharness.errors import UserError
from mlharness.sut.brick_timing import ConfidenceRule, Sampler
from mlharness.sut.bricks import Brick

MEASURE_MISSING = "measure-missing"
MISSING_SHOWN = 5  # missing bricks named in the refusal; the rest are counted


def estimate_from_store(p: Prepared, mode: str) -> dict[str, Any]:
    """The estimate from stored bricks (`mode`: request.brick_estimate, "only" or "measure-missing");
    writes bricks.json. Returns the record's `bricks`."""
    main = p.main_variant
    missing = [b for b in p.decomposition.bricks if (b.key, main) not in p.known]
    empty_missing = (EMPTY_CALL_KEY, main) not in p.known
    if (missing or empty_missing) and mode != MEASURE_MISSING:
        raise _refusal(p, missing, empty_missing)
    rule = ConfidenceRule(time_cap=p.request.brick_time_cap)
    measured_rows: list[Row] = []
    if empty_missing:
        measurement = p.measure_empty_call(p.threads)
        measured_rows.append(empty_row(main, measurement))
        empty = measurement.median_ms
    else:
        empty = float(p.known[(EMPTY_CALL_KEY, main)]["median_ms"])
    samplers = {brick.key: p.open_sampler(brick, main, rule) for brick in missing}
    fixed = {b.key: p.known[(b.key, main)] for b in p.decomposition.bricks if (b.key, main) in p.known}
    estimate_ci = refine(samplers, fixed, p.decomposition.by_key, empty, rule)
    figures, entries, brick_seconds = _compose(p, samplers, fixed, empty, rule, measured_rows)
    estimate = compose.estimate_ms(figures, empty)
    summary = {
        "batch": p.request.batch, "threads": p.threads, "optimization_level": p.level, "providers": p.providers,
        "fingerprint": p.fingerprint, "nodes": p.decomposition.node_count, "unique_bricks": len(figures),
        "reused_bricks": len(figures) - len(samplers), "measured_bricks": len(samplers),
        "estimate_only": True, "missing_bricks": len(missing), "empty_call_measured": empty_missing,
        "new_measurements": len(measured_rows), "estimate_seconds": time.perf_counter() - p.started,
        "estimate_ms": estimate, "estimate_ci_ms": estimate_ci,
        "estimate_stable": estimate_ci <= rule.tolerance * estimate, "lower_bound_ms": None,
        "measured_ms": None, "measured_run": None, "error_pct": None,
        "plain_session_ms": None, "plain_session_error_pct": None, "empty_call_ms": empty,
        "brick_seconds": brick_seconds, "variant_seconds": 0.0,
        "reuse_saved_seconds": sum(float(r.get("seconds") or 0.0) for r in fixed.values()),
        "decompose_seconds": None, "whole_model_seconds": None, "whole_model_repeats": None,
        "whole_model_stable": None, "speedup": None, "speedup_without_reuse": None,
    }
    return write_results(p.staged_dir, p.record, p.model_name, summary, figures, entries, measured_rows,
                         rule=rule.describe(), variant_rule=None, main_variant=main,
                         empty_call_ms={str(p.threads): empty})


def _refusal(p: Prepared, missing: list[Brick], empty_missing: bool) -> UserError:
    """One line: how many bricks are not stored, the first few by name, and the two ways on."""
    name, main = p.model_name, p.main_variant
    named = [f"{b.label} (x{b.multiplicity}, key {b.key})" for b in missing[:MISSING_SHOWN]]
    if empty_missing:
        named.insert(0, "the empty session call")
    more = len(missing) + empty_missing - len(named)
    return UserError(f"{name}: --estimate-only: {len(missing)} of {len(p.decomposition.bricks)} bricks"
                     f"{' and the empty call' if empty_missing else ''} are not stored for this system "
                     f"(fingerprint {p.fingerprint}, {main}): {'; '.join(named)}{f'; and {more} more' if more else ''}"
                     f" (add --measure-missing to measure only those, or run `mlharness bricks {name}`)")


def _compose(p: Prepared, samplers: dict[str, Sampler], fixed: dict[str, Row], empty: float, rule: ConfidenceRule,
             measured_rows: list[Row]) -> tuple[list[compose.BrickFigures], list[dict[str, Any]], float]:
    """Each brick's figures and bricks.json entry, from its stored row or this run's sampler (whose row
    is added to `measured_rows`); and the seconds the sampled bricks took."""
    main = p.main_variant
    figures, entries = [], []
    brick_seconds = 0.0
    for brick in p.decomposition.bricks:
        if brick.key in samplers:
            sampler = samplers[brick.key]
            sampler.release()
            brick_seconds += sampler.seconds
            row = brick_row(brick, main, sampler.measurement(rule.tolerance))
            measured_rows.append(row)
        else:
            row = fixed[brick.key]
        figure = compose.BrickFigures(brick.key, brick.op_type, brick.label, brick.multiplicity,
                                      float(row["median_ms"]), empty)
        figures.append(figure)
        entries.append(entry(brick, figure, row, brick.key not in samplers, {main: row}))
    return figures, entries, brick_seconds
