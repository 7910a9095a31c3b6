"""The measurement loop of a bricks run (mlharness.bricks.runner), on a model made ready by
mlharness.bricks.prepared: the empty session call at each thread count a variant uses, the whole model in
a plain session (what the bricks are compared with), a first pass over the bricks that reuses what is
stored and samples the rest, the refinement of the estimate and of the lower bound
(mlharness.bricks.refine), and the composed figures written out (mlharness.bricks.rows)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mlharness.bricks import compose
from mlharness.bricks.prepared import Prepared
from mlharness.bricks.refine import refine, whole_model_cap
from mlharness.bricks.rows import (
    Row,
    brick_row,
    empty_row,
    entry,
    measured_latency,
    parse_variant,
    variant_name,
    variants,
    write_results,
)
from mlharness.running.progress import Snapshot, Ticker, quiet_from_env
from mlharness.sut.brick_timing import ConfidenceRule, Measurement, Sampler, fresh_inputs_call, measure, new_session
from mlharness.sut.bricks import AS_EXECUTED

NetTime = Callable[[str, float], float]  # (variant, median ms) -> its net ms (the empty call at its threads taken off)
PHASES = ("setup", "warmup", "prepare", "timed", "loop")  # a Sampler's, summed over the bricks


@dataclass
class Sampled:
    """What the first pass over the bricks found stored and started measuring."""
    found: dict[str, dict[str, Row]] = field(default_factory=dict)  # brick key -> variant -> row
    samplers: dict[str, Sampler] = field(default_factory=dict)  # brick key -> as executed, measured by this run
    # (brick key, variant) -> its Sampler, for the other variants this run measured. Only the fastest
    # of a brick's other variants keeps its session (and may take more calls); the others' are let go.
    variant_samplers: dict[tuple[str, str], Sampler] = field(default_factory=dict)
    reused: int = 0
    reuse_saved: float = 0.0  # seconds the reused bricks took when they were measured


@dataclass
class Spent:
    """Where the run's seconds went (docs/bricks.md, "Where a brick's time goes")."""
    empty_calls: float = 0.0
    bricks: float = 0.0  # the bricks as executed: what the composed estimate cost
    variants: float = 0.0  # the lower bound's other variants
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))


def measure_bricks(p: Prepared) -> dict[str, Any]:
    """Benchmark (or reuse) every brick and its variants, compose; writes bricks.json. Returns the record's `bricks`."""
    request = p.request
    rule = ConfidenceRule(time_cap=request.brick_time_cap)
    variant_rule = ConfidenceRule(time_cap=max(request.brick_time_cap / 4, 0.05))
    other_variants = variants(p.threads, request.variants)
    variant_names = [variant_name(t, level, p.providers[0]) for t, level in other_variants]
    spent = Spent()
    empties_started = time.perf_counter()
    empties, measured_rows = _empty_calls(p, sorted({p.threads} | {t for t, _ in other_variants}))
    spent.empty_calls = time.perf_counter() - empties_started
    whole = _whole_model(p, rule)

    def net(name: str, median_ms: float) -> float:
        return compose.net_variant_ms(median_ms, empties.get(str(parse_variant(name)[0]), 0.0))

    done = [0]
    with Ticker(f"{p.model_name} bricks", lambda: Snapshot(done[0], len(p.decomposition.bricks)), "bricks",
                quiet=request.quiet or quiet_from_env()):
        sampled = _first_pass(p, list(dict.fromkeys([p.main_variant, *variant_names])), rule, net, done)
        estimate_ci = _refine_estimate(p, sampled, empties[str(p.threads)], rule, variant_rule, net)
    for (key, name), sampler in sampled.variant_samplers.items():
        sampler.release()
        spent.variants += sampler.seconds
        row = brick_row(p.decomposition.by_key[key], name, sampler.measurement(variant_rule.tolerance))
        sampled.found[key][name] = row
        measured_rows.append(row)
    figures, entries = _compose(p, sampled, empties, rule, measured_rows, spent)
    summary = _summary(p, figures, empties, estimate_ci, rule, whole, sampled, spent)
    return write_results(p.staged_dir, p.record, p.model_name, summary, figures, entries, measured_rows,
                         rule=rule.describe(), variant_rule=variant_rule.describe(), main_variant=p.main_variant,
                         empty_call_ms=empties)


def _empty_calls(p: Prepared, thread_counts: list[int]) -> tuple[dict[str, float], list[Row]]:
    """The cost of a session call that does nothing, at each thread count a variant uses: medians by
    thread count, and the rows to store."""
    empties: dict[str, float] = {}
    rows: list[Row] = []
    for threads in thread_counts:
        measurement = p.measure_empty_call(threads)
        empties[str(threads)] = measurement.median_ms
        rows.append(empty_row(variant_name(threads, AS_EXECUTED, p.providers[0]), measurement))
    return empties, rows


def _whole_model(p: Prepared, rule: ConfidenceRule) -> Measurement:
    """The whole model, in a plain session with the run's options: its median, and how long it took to
    reach the same confidence as a brick (the time the bricks are compared with)."""
    backend = p.runtime.backend
    started = time.perf_counter()
    session = new_session(str(backend.graph_path), backend.new_session_options(), p.providers)
    setup = time.perf_counter() - started
    call, fresh = fresh_inputs_call(session, p.feeds)
    return measure(call, ConfidenceRule(time_cap=whole_model_cap(rule)), setup_seconds=setup, before_each=fresh)


def _first_pass(p: Prepared, wanted: list[str], rule: ConfidenceRule, net: NetTime, done: list[int]) -> Sampled:
    """Every brick's stored variants taken, the others sampled once (rule.min_repeats calls); of a
    brick's other variants only the fastest keeps its session. `done[0]` counts the bricks passed."""
    sampled = Sampled()
    for position, brick in enumerate(p.decomposition.bricks, 1):
        found = {name: p.known[(brick.key, name)] for name in wanted if (brick.key, name) in p.known}
        sampled.found[brick.key] = found
        if p.main_variant in found:
            sampled.reused += 1
            sampled.reuse_saved += float(found[p.main_variant].get("seconds") or 0.0)
        for name in (name for name in wanted if name not in found):
            sampler = p.open_sampler(brick, name, rule)
            if name == p.main_variant:
                sampled.samplers[brick.key] = sampler
            else:
                sampled.variant_samplers[(brick.key, name)] = sampler
        mine = sorted((net(name, float(np.median(sampler.times))), name)
                      for (key, name), sampler in sampled.variant_samplers.items() if key == brick.key)
        for _, name in mine[1:]:
            sampled.variant_samplers[(brick.key, name)].release()
        done[0] = position
    return sampled


def _refine_estimate(p: Prepared, sampled: Sampled, empty: float, rule: ConfidenceRule,
                     variant_rule: ConfidenceRule, net: NetTime) -> float:
    """The estimate's confidence: more calls for the bricks that add most to its interval, until the
    interval is within the rule's tolerance of the estimate or no brick may take more time. Then the
    lower bound's, by the same rule: a brick counts at its fastest variant, and where that is one this
    run sampled, that variant takes more calls as the estimate's do. Returns the estimate's half-width."""
    main, by_key = p.main_variant, p.decomposition.by_key
    fixed = {key: found[main] for key, found in sampled.found.items() if main in found}
    estimate_ci = refine(sampled.samplers, fixed, by_key, empty, rule,
                         reopen=lambda key: p.open_sampler(by_key[key], main, rule))
    for key in sampled.samplers:  # a stored brick measured again is not reused
        if main in sampled.found[key]:
            sampled.reused -= 1
            sampled.reuse_saved -= float(sampled.found[key].pop(main).get("seconds") or 0.0)
    if not sampled.variant_samplers:
        return estimate_ci
    for key, sampler in sampled.samplers.items():
        sampled.found[key][main] = brick_row(by_key[key], main, sampler.measurement(rule.tolerance))
    for sampler in sampled.samplers.values():
        sampler.release()  # the estimate is settled: its sessions are not needed
    best_samplers: dict[str, Sampler] = {}
    best_fixed: dict[str, Row] = {}
    for brick in p.decomposition.bricks:
        candidates = {name: float(row["median_ms"]) for name, row in sampled.found[brick.key].items()}
        candidates |= {name: float(np.median(sampler.times))
                       for (key, name), sampler in sampled.variant_samplers.items() if key == brick.key}
        best_name = min(candidates, key=lambda name: net(name, candidates[name]))
        if (brick.key, best_name) in sampled.variant_samplers:
            best_samplers[brick.key] = sampled.variant_samplers[(brick.key, best_name)]
        else:
            best_fixed[brick.key] = sampled.found[brick.key][best_name]
    refine(best_samplers, best_fixed, by_key, empty, variant_rule, whole_model_cap(rule) / 4)
    return estimate_ci


def _compose(p: Prepared, sampled: Sampled, empties: dict[str, float], rule: ConfidenceRule, measured_rows: list[Row],
             spent: Spent) -> tuple[list[compose.BrickFigures], list[dict[str, Any]]]:
    """Each brick's figures (as executed, and its best variant's) and its bricks.json entry; the rows
    of the bricks this run measured added to `measured_rows`, their seconds to `spent`."""
    empty, main_variant = empties[str(p.threads)], p.main_variant
    figures, entries = [], []
    for brick in p.decomposition.bricks:
        found = sampled.found[brick.key]
        if brick.key in sampled.samplers:
            sampler = sampled.samplers[brick.key]
            spent.bricks += sampler.seconds
            for phase, seconds in sampler.phases.items():
                spent.phases[phase] += seconds
            found[main_variant] = brick_row(brick, main_variant, sampler.measurement(rule.tolerance))
            measured_rows.append(found[main_variant])
            sampler.release()
        main = found[main_variant]
        others = {name: float(r["median_ms"]) for name, r in found.items()}
        best = compose.best_variant(others, empties, {name: str(parse_variant(name)[0]) for name in others}) \
            if p.request.variants else None
        figure = compose.BrickFigures(brick.key, brick.op_type, brick.label, brick.multiplicity,
                                      float(main["median_ms"]), empty,
                                      best[1] if best else None, best[0] if best else None)
        figures.append(figure)
        entries.append(entry(brick, figure, main, brick.key not in sampled.samplers, found))
    sampled.samplers.clear()
    return figures, entries


def _summary(p: Prepared, figures: list[compose.BrickFigures], empties: dict[str, float], estimate_ci: float,
             rule: ConfidenceRule, whole: Measurement, sampled: Sampled, spent: Spent) -> dict[str, Any]:
    """The run's figures: the estimate, its lower bound, the measured run's latency and the errors
    against it and the plain session, and the benchmarking time against the whole model's."""
    empty = empties[str(p.threads)]
    estimate = compose.estimate_ms(figures, empty)
    lower = compose.lower_bound_ms(figures, empty) if p.request.variants else None
    measured = measured_latency(p.request)
    return {
        "batch": p.request.batch, "threads": p.threads, "optimization_level": p.level, "providers": p.providers,
        "fingerprint": p.fingerprint, "nodes": p.decomposition.node_count, "unique_bricks": len(figures),
        "reused_bricks": sampled.reused, "measured_bricks": len(figures) - sampled.reused,
        "estimate_ms": estimate, "estimate_ci_ms": estimate_ci,
        "estimate_stable": estimate_ci <= rule.tolerance * estimate, "lower_bound_ms": lower,
        "measured_ms": measured["latency_ms"] if measured else None,
        "measured_run": measured["run_id"] if measured else None,
        "error_pct": compose.error_pct(estimate, measured["latency_ms"]) if measured else None,
        "plain_session_ms": whole.median_ms,
        "plain_session_error_pct": compose.error_pct(estimate, whole.median_ms),
        "empty_call_ms": empty,
        "brick_seconds": spent.bricks, "variant_seconds": spent.variants, "reuse_saved_seconds": sampled.reuse_saved,
        "decompose_seconds": p.decompose_seconds,
        # Where this run's wall time went (docs/bricks.md, "Where a brick's time goes").
        "phase_seconds": {"decompose": p.decompose_seconds, "empty_calls": spent.empty_calls,
                          "whole_model": whole.seconds, **{f"brick_{k}": v for k, v in spent.phases.items()},
                          "variants": spent.variants, "total": time.perf_counter() - p.started},
        "whole_model_seconds": whole.seconds, "whole_model_repeats": whole.repeats, "whole_model_stable": whole.stable,
        # Benchmarking time at equal confidence: the whole model against the bricks this run measured
        # (what reuse saved included in the second figure, as if nothing had been measured before).
        "speedup": compose.time_to_confidence_speedup(whole.seconds, spent.bricks),
        "speedup_without_reuse": compose.time_to_confidence_speedup(whole.seconds, spent.bricks + sampled.reuse_saved),
    }
