"""A layer-level benchmark run (kind "bricks"), in the run's own process (mlharness.running.launcher):
the model's executed graph decomposed into bricks (mlharness.sut.bricks), each unique brick benchmarked once
(or taken from the results database, measured earlier on this system and software), the model
composed from them and compared with the LoadGen run that measured it whole (request.measured_run).

Nothing here writes the database: the bricks measured by this run travel back in the record
(`bricks.measured`), and the launching process stores them (mlharness.store.result_store)."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json, write_text
from mlharness.bricks import compose
from mlharness.errors import UserError
from mlharness.records import results
from mlharness.records.run_record import BRICKS, RunRecord, new_run_id, utc_now
from mlharness.running import resolve
from mlharness.running import runner as loadgen_runner
from mlharness.running import system as system_mod
from mlharness.running.request import RunRequest

# `mlharness bricks --estimate-only` / `--measure-missing`: how the launching command tells the bricks
# run's process to compose from the stored bricks. RunRequest has no field for it yet (the request's
# schema is not this module's), so it travels in the environment the child inherits.
# The empty session call is stored with the bricks, under this key (one row per thread count), so an
# estimate composed from stored bricks subtracts the same empty call as the run that measured them.
EMPTY_CALL_KEY = "empty-call"
MISSING_SHOWN = 5  # missing bricks named in the refusal; the rest are counted

BRICKS_FOLDER = "bricks"  # <results>/<system>/<model>/bricks/runs/<run id>/
BRICKS_JSON_VERSION = 1


def fingerprint(system: dict[str, Any], hardware: dict[str, Any], versions: dict[str, str], providers: list[str]) -> str:
    """What a brick's time depends on besides the brick: the CPU, the CPUs it may use, the device and
    the runtime's version. A later model or invocation reuses a brick only under the same fingerprint."""
    data = {"cpu_model": system.get("cpu_model"), "cpus_available": system.get("cpus_available"),
            "device": hardware.get("device"), "cpu_affinity": hardware.get("cpu_affinity") or [],
            "onnxruntime": versions.get("onnxruntime"), "providers": providers}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _say(text: str, request: RunRequest) -> None:
    from mlharness.running.progress import quiet_from_env

    if not (request.quiet or quiet_from_env()):
        print(f"[bricks] {text}", file=sys.stderr, flush=True)


def run_here(request: RunRequest, guard: Any) -> RunRecord:
    model, backend_name, dataset, hardware, software, _ = resolve.resolve_manifests(
        _as_onnxruntime(request))
    if backend_name != "onnxruntime":
        raise UserError(f"--backend {backend_name}: bricks are measured on onnxruntime only")
    if model.framework != "onnxruntime":
        raise UserError(f"{model.path}: framework: bricks need an ONNX graph; model {model.name!r} runs on "
                        f"{model.framework} (write an onnxruntime manifest whose sources.graph converts it)")
    settings = resolve.prepare_settings(_settings_request(request), model)
    resolve.check_device(backend_name, hardware)
    installed = system_mod.check_software(software)
    for var, value in software.environment.items():
        os.environ.setdefault(var, value)
    detected = system_mod.detect_system()
    system_name = system_mod.system_name(detected, hardware.device)
    run_id = new_run_id()
    where = results.scenario_dir(Path(request.results_dir), system_name, model.name, BRICKS_FOLDER, run_id)
    versions = system_mod.software_versions()
    record = RunRecord(
        run_id=run_id, command=request.command, model=model.identity(), dataset=dataset.identity(),
        backend=backend_name, scenario=BRICKS_FOLDER, mode=BRICKS_FOLDER, kind=BRICKS, system_name=system_name,
        system=detected, software={"manifest": software.identity(), "checked": installed, "versions": versions},
        hardware=hardware.identity() | {"device": hardware.device, "cpu_affinity": list(hardware.cpu_affinity or ())},
        settings=settings.as_record(), results_path=str(where.staging))
    guard.started(record, where)
    runtime = None
    try:
        from mlharness.sut.runtime import build_runtime

        options = resolve.harness_options(settings, model) | {"max_batch_size": request.batch}
        runtime = build_runtime(model, dataset, hardware, backend_name, options)
        record.backend_info = runtime.backend.describe()
        record.artifacts = runtime.artifacts
        record.cold_start = dict(runtime.cold_start)
        loaded = guard.watch(float(options["load_timeout"]), "preparing the model's bricks (samples, graph, capture)")
        try:
            record.bricks = measure_model(runtime, request, record, where)
        finally:
            loaded()
        record.status = "ok"
    except BaseException as exc:
        loadgen_runner.record_usage(record, hardware)
        loadgen_runner.fail_run(record, where, exc, guard)
    finally:
        if runtime is not None:
            runtime.backend.close()
    loadgen_runner.record_usage(record, hardware)
    if not guard.finalizing():
        loadgen_runner.wait_for_abort()
    record.finished_at = utc_now()
    record.results_path = str(where.run_dir)
    write_json(where.stage() / "run.json", record.to_dict())
    (where.staging / "owner.json").unlink(missing_ok=True)
    where.publish()
    return record


def _as_onnxruntime(request: RunRequest) -> RunRequest:
    from dataclasses import replace

    return replace(request, backend=request.backend or "onnxruntime")


def _settings_request(request: RunRequest) -> RunRequest:
    """The settings layers of the measuring run (SingleStream; MultiStream at a batch above 1)."""
    from dataclasses import replace

    return replace(request, scenario="SingleStream" if request.batch == 1 else "MultiStream", mode="performance")


def measure_model(runtime: Any, request: RunRequest, record: RunRecord, where: results.ScenarioDir) -> dict[str, Any]:
    """Decompose, benchmark (or reuse) every brick and its variants, compose; writes bricks.json."""
    import numpy as np

    from mlharness.sut import bricks as sb
    from mlharness.sut.warmup import prepare_batch

    backend = runtime.backend
    batch = request.batch
    count = len(runtime.staged)
    first = [i % count for i in range(batch)]
    second = [(batch + i) % count for i in range(batch)]
    feeds = prepare_batch(runtime.staged, first)
    check_feeds = prepare_batch(runtime.staged, second) if second != first else None
    providers = list(backend.providers)
    level = _level_name(backend.session_options.graph_optimization_level)
    threads = int(backend.intra_op_threads)
    where_text = str(runtime.model.path)
    staged_dir = where.stage()
    started = time.perf_counter()
    optimized = sb.optimized_graph(Path(backend.graph_path), backend.new_session_options(), providers,
                                   staged_dir / "optimized.onnx")
    decomposition = sb.decompose(optimized, feeds, check_feeds, backend.new_session_options, providers, level, where_text)
    decompose_seconds = time.perf_counter() - started
    _say(f"{runtime.model.name}: {decomposition.node_count} nodes of the graph as executed "
         f"({level}), {len(decomposition.bricks)} unique bricks", request)

    model_weights = sb.model_weight_bytes(decomposition)
    fp = fingerprint(record.system, record.hardware, record.software.get("versions", {}), providers)
    known = _known_measurements(request, fp, [b.key for b in decomposition.bricks] + [EMPTY_CALL_KEY])
    rule = sb.ConfidenceRule(time_cap=request.brick_time_cap)
    variant_rule = sb.ConfidenceRule(time_cap=max(request.brick_time_cap / 4, 0.05))
    main_variant = variant_name(threads, sb.AS_EXECUTED, providers[0])
    variants = _variants(threads, providers, request.variants)
    variant_names = [variant_name(t, lvl, providers[0]) for t, lvl in variants]

    def options_for(variant_threads: int, opt_level: str) -> Any:
        options = backend.new_session_options()
        options.intra_op_num_threads = variant_threads
        options.graph_optimization_level = sb.ort_level(opt_level)
        return options

    # The cost of a session call that does nothing, at each thread count a variant uses.
    empties_started = time.perf_counter()
    empty_model = sb.empty_session_model(optimized.opset_import, optimized.ir_version)
    mode = request.brick_estimate
    if mode is not None:
        return _estimate_from_store(runtime, request, record, staged_dir, decomposition, fp, threads, level, providers,
                                    options_for, empty_model, model_weights, main_variant, mode, started)
    empties: dict[str, float] = {}
    empty_rows: list[dict[str, Any]] = []
    for variant_threads in sorted({threads} | {v[0] for v in variants}):
        session = sb.new_session(empty_model, options_for(variant_threads, sb.AS_EXECUTED), providers[:1])
        empty_call, _, _ = sb.bound_call(session, {"x": np.zeros(1, np.float32)})  # called as a brick is
        empty_measurement = sb.measure(empty_call, sb.ConfidenceRule(time_cap=0.5))
        empties[str(variant_threads)] = empty_measurement.median_ms
        empty_rows.append(_empty_row(variant_name(variant_threads, sb.AS_EXECUTED, providers[0]), empty_measurement))
    empties_seconds = time.perf_counter() - empties_started
    # The whole model, in a plain session with the run's options: its median, and how long it took to
    # reach the same confidence as a brick (the time the bricks are compared with).
    whole_started = time.perf_counter()
    whole_session = sb.new_session(str(backend.graph_path), backend.new_session_options(), providers)
    whole_setup = time.perf_counter() - whole_started
    whole_call, whole_fresh = sb.fresh_inputs_call(whole_session, feeds)
    whole = sb.measure(whole_call, sb.ConfidenceRule(time_cap=whole_model_cap(rule)),
                       setup_seconds=whole_setup, before_each=whole_fresh)
    del whole_session

    measured_rows: list[dict[str, Any]] = list(empty_rows)
    brick_entries: list[dict[str, Any]] = []
    figures: list[compose.BrickFigures] = []
    reused = 0
    reuse_saved = 0.0
    measuring_seconds = 0.0  # the bricks as executed: what the composed estimate cost
    variant_seconds = 0.0  # the lower bound's other variants
    samplers: dict[str, Any] = {}  # brick key -> its as-executed Sampler, for bricks measured by this run
    # (brick key, variant) -> its Sampler, for the other variants this run measured. Only the fastest
    # of a brick's other variants keeps its session (and may take more calls); the others' are let go.
    variant_samplers: dict[tuple[str, str], Any] = {}
    threads_of = {name: str(parse_variant(name)[0]) for name in [main_variant, *variant_names]}

    def net(name: str, median_ms: float) -> float:
        return compose.net_variant_ms(median_ms, empties.get(threads_of[name], 0.0))
    found_by_key: dict[str, dict[str, dict[str, Any]]] = {}
    from mlharness.running.progress import Snapshot, Ticker, quiet_from_env

    done_bricks = [0]
    ticker = Ticker(f"{runtime.model.name} bricks", lambda: Snapshot(done_bricks[0], len(decomposition.bricks)),
                    "bricks", quiet=request.quiet or quiet_from_env())
    ticker.__enter__()  # left below, after the estimate's rule: the first pass and the refinement
    for position, brick in enumerate(decomposition.bricks, 1):
        wanted = list(dict.fromkeys([main_variant, *variant_names]))
        found = {name: known[(brick.key, name)] for name in wanted if (brick.key, name) in known}
        found_by_key[brick.key] = found
        if main_variant in found:
            reused += 1
            reuse_saved += float(found[main_variant].get("seconds") or 0.0)
        for name in (name for name in wanted if name not in found):
            variant_threads, opt_level, provider = parse_variant(name)
            setup_started = time.perf_counter()
            session = sb.new_session(brick.model_bytes, options_for(variant_threads, opt_level), [provider])
            setup = time.perf_counter() - setup_started
            call, fresh = sb.fresh_bound_call(session, brick.feed)
            fresh = sb.evicting(fresh, brick, model_weights)
            # A first sample now; the estimate's rule (the lower bound's, for the other variants)
            # decides how many more.
            sampler = sb.Sampler(call, fresh, setup, rule.warmup_repeats, rule.warmup_seconds)
            sampler.extend(rule.min_repeats)
            if name == main_variant:
                samplers[brick.key] = sampler
            else:
                variant_samplers[(brick.key, name)] = sampler
        mine = sorted((net(name, float(np.median(sampler.times))), name)
                      for (key, name), sampler in variant_samplers.items() if key == brick.key)
        for _, name in mine[1:]:
            variant_samplers[(brick.key, name)].release()
        done_bricks[0] = position

    # The estimate's confidence: more calls for the bricks that add most to its interval, until the
    # interval is within the rule's tolerance of the estimate or no brick may take more time.
    empty = empties[str(threads)]
    fixed = {key: found[main_variant] for key, found in found_by_key.items() if main_variant in found}
    by_key = decomposition.by_key
    try:
        estimate_ci = _refine(samplers, fixed, by_key, empty, rule)
        if variant_samplers:
            # The lower bound's confidence, by the same rule: a brick counts at its fastest variant, and
            # where that is one this run sampled, that variant takes more calls as the estimate's do.
            for key in samplers:
                found_by_key[key][main_variant] = _row(by_key[key], main_variant, samplers[key].measurement(rule.tolerance))
            for key in samplers:
                samplers[key].release()  # the estimate is settled: its sessions are not needed
            best_samplers: dict[str, Any] = {}
            best_fixed: dict[str, dict[str, Any]] = {}
            for brick in decomposition.bricks:
                candidates = {name: float(row["median_ms"]) for name, row in found_by_key[brick.key].items()}
                candidates |= {name: float(np.median(sampler.times)) for (key, name), sampler in variant_samplers.items()
                               if key == brick.key}
                best_name = min(candidates, key=lambda name: net(name, candidates[name]))
                if (brick.key, best_name) in variant_samplers:
                    best_samplers[brick.key] = variant_samplers[(brick.key, best_name)]
                else:
                    best_fixed[brick.key] = found_by_key[brick.key][best_name]
            _refine(best_samplers, best_fixed, by_key, empty, variant_rule, whole_model_cap(rule) / 4)
    finally:
        ticker.__exit__(None, None, None)
    for (key, name), sampler in variant_samplers.items():
        sampler.release()
        variant_seconds += sampler.seconds
        found_by_key[key][name] = _row(by_key[key], name, sampler.measurement(variant_rule.tolerance))
        measured_rows.append(found_by_key[key][name])
    brick_phases = {"setup": 0.0, "warmup": 0.0, "prepare": 0.0, "timed": 0.0, "loop": 0.0}
    for brick in decomposition.bricks:
        found = found_by_key[brick.key]
        if brick.key in samplers:
            sampler = samplers[brick.key]
            measuring_seconds += sampler.seconds
            for phase, seconds in sampler.phases.items():
                brick_phases[phase] += seconds
            found[main_variant] = _row(brick, main_variant, sampler.measurement(rule.tolerance))
            measured_rows.append(found[main_variant])
            sampler.release()
        main = found[main_variant]
        others = {name: float(r["median_ms"]) for name, r in found.items()}
        best = compose.best_variant(others, empties, {name: str(parse_variant(name)[0]) for name in others}) \
            if request.variants else None
        figure = compose.BrickFigures(brick.key, brick.op_type, brick.label, brick.multiplicity,
                                      float(main["median_ms"]), empty,
                                      best[1] if best else None, best[0] if best else None)
        figures.append(figure)
        brick_entries.append(brick.describe() | {
            "reused": brick.key in fixed, "median_ms": figure.median_ms, "net_ms": figure.net_ms,
            "ci_low_ms": main.get("ci_low_ms"), "ci_high_ms": main.get("ci_high_ms"), "repeats": main.get("repeats"),
            "stable": bool(main.get("stable")), "total_ms": figure.total_ms,
            "variants": {name: {k: r.get(k) for k in ("median_ms", "ci_low_ms", "ci_high_ms", "repeats", "stable")}
                         for name, r in sorted(found.items())},
            "best_variant": figure.best_variant, "best_net_ms": figure.best_ms})
    samplers.clear()

    estimate = compose.estimate_ms(figures, empties[str(threads)])
    lower = compose.lower_bound_ms(figures, empties[str(threads)]) if request.variants else None
    measured = _measured_latency(request)
    summary = {
        "batch": batch, "threads": threads, "optimization_level": level, "providers": providers,
        "fingerprint": fp, "nodes": decomposition.node_count, "unique_bricks": len(figures),
        "reused_bricks": reused, "measured_bricks": len(figures) - reused,
        "estimate_ms": estimate, "estimate_ci_ms": estimate_ci,
        "estimate_stable": estimate_ci <= rule.tolerance * estimate, "lower_bound_ms": lower,
        "measured_ms": measured["latency_ms"] if measured else None,
        "measured_run": measured["run_id"] if measured else None,
        "error_pct": compose.error_pct(estimate, measured["latency_ms"]) if measured else None,
        "plain_session_ms": whole.median_ms,
        "plain_session_error_pct": compose.error_pct(estimate, whole.median_ms),
        "empty_call_ms": empties[str(threads)],
        "brick_seconds": measuring_seconds, "variant_seconds": variant_seconds, "reuse_saved_seconds": reuse_saved,
        "decompose_seconds": decompose_seconds,
        # Where this run's wall time went (docs/bricks.md, "Where a brick's time goes").
        "phase_seconds": {"decompose": decompose_seconds, "empty_calls": empties_seconds,
                          "whole_model": whole.seconds, **{f"brick_{k}": v for k, v in brick_phases.items()},
                          "variants": variant_seconds, "total": time.perf_counter() - started},
        "whole_model_seconds": whole.seconds, "whole_model_repeats": whole.repeats, "whole_model_stable": whole.stable,
        # Benchmarking time at equal confidence: the whole model against the bricks this run measured
        # (what reuse saved included in the second figure, as if nothing had been measured before).
        "speedup": compose.time_to_confidence_speedup(whole.seconds, measuring_seconds),
        "speedup_without_reuse": compose.time_to_confidence_speedup(whole.seconds, measuring_seconds + reuse_saved),
    }
    data = {
        "schema_version": BRICKS_JSON_VERSION, "model": runtime.model.name, "summary": summary,
        "rule": rule.describe(), "variant_rule": variant_rule.describe(), "main_variant": main_variant,
        "empty_call_ms": empties, "by_op_type": compose.by_op_type(figures),
        "top_bricks": [f.key for f in compose.top_bricks(figures)],
        "bricks": brick_entries,
    }
    write_json(staged_dir / "bricks.json", data)
    write_text(staged_dir / "README.md", _readme(runtime.model.name, summary, record.command))
    (staged_dir / "optimized.onnx").unlink(missing_ok=True)  # large, and made again from the graph on demand
    record.bricks = {"summary": summary, "by_op_type": data["by_op_type"], "bricks_json": "bricks.json",
                     "measured": measured_rows}
    return record.bricks


def _empty_row(variant: str, measurement: Any) -> dict[str, Any]:
    return {"brick_key": EMPTY_CALL_KEY, "variant": variant, "op_type": "(empty call)", "label": "empty session call",
            "descriptor": {"empty_call": True}, **measurement.describe()}


def _estimate_from_store(runtime: Any, request: RunRequest, record: RunRecord, staged_dir: Path, decomposition: Any,
                         fp: str, threads: int, level: str, providers: list[str], options_for: Any, empty_model: bytes,
                         model_weights: int, main_variant: str, mode: str, started: float) -> dict[str, Any]:
    """`--estimate-only`: the model composed from the bricks stored under this fingerprint, as executed.
    Nothing else is measured: no whole model, no variants. A brick (or the empty call) not stored is
    refused in one line naming the first few, unless `mode` is "measure-missing": then only those are
    measured, by the estimate's rule, and stored as any run's are."""
    import numpy as np

    from mlharness.sut import bricks as sb

    name = runtime.model.name
    known = _known_measurements(request, fp, [b.key for b in decomposition.bricks] + [EMPTY_CALL_KEY])
    missing = [b for b in decomposition.bricks if (b.key, main_variant) not in known]
    empty_missing = (EMPTY_CALL_KEY, main_variant) not in known
    if (missing or empty_missing) and mode != "measure-missing":
        named = [f"{b.label} (x{b.multiplicity}, key {b.key})" for b in missing[:MISSING_SHOWN]]
        if empty_missing:
            named.insert(0, "the empty session call")
        more = len(missing) + empty_missing - len(named)
        raise UserError(f"{name}: --estimate-only: {len(missing)} of {len(decomposition.bricks)} bricks"
                        f"{' and the empty call' if empty_missing else ''} are not stored for this system "
                        f"(fingerprint {fp}, {main_variant}): {'; '.join(named)}{f'; and {more} more' if more else ''}"
                        f" (add --measure-missing to measure only those, or run `mlharness bricks {name}`)")
    rule = sb.ConfidenceRule(time_cap=request.brick_time_cap)
    measured_rows: list[dict[str, Any]] = []
    if empty_missing:
        session = sb.new_session(empty_model, options_for(threads, sb.AS_EXECUTED), providers[:1])
        empty_call, _, _ = sb.bound_call(session, {"x": np.zeros(1, np.float32)})
        measurement = sb.measure(empty_call, sb.ConfidenceRule(time_cap=0.5))
        measured_rows.append(_empty_row(main_variant, measurement))
        empty = measurement.median_ms
    else:
        empty = float(known[(EMPTY_CALL_KEY, main_variant)]["median_ms"])
    samplers: dict[str, Any] = {}
    for brick in missing:
        setup_started = time.perf_counter()
        session = sb.new_session(brick.model_bytes, options_for(threads, sb.AS_EXECUTED), providers[:1])
        setup = time.perf_counter() - setup_started
        call, fresh = sb.fresh_bound_call(session, brick.feed)
        sampler = sb.Sampler(call, sb.evicting(fresh, brick, model_weights), setup, rule.warmup_repeats,
                             rule.warmup_seconds)
        sampler.extend(rule.min_repeats)
        samplers[brick.key] = sampler
    fixed = {b.key: known[(b.key, main_variant)] for b in decomposition.bricks if b.key in known_keys(known, main_variant)}
    estimate_ci = _refine(samplers, fixed, decomposition.by_key, empty, rule)
    figures, entries = [], []
    brick_seconds = 0.0
    for brick in decomposition.bricks:
        if brick.key in samplers:
            sampler = samplers[brick.key]
            sampler.release()
            brick_seconds += sampler.seconds
            row = _row(brick, main_variant, sampler.measurement(rule.tolerance))
            measured_rows.append(row)
        else:
            row = fixed[brick.key]
        figure = compose.BrickFigures(brick.key, brick.op_type, brick.label, brick.multiplicity,
                                      float(row["median_ms"]), empty)
        figures.append(figure)
        entries.append(brick.describe() | {
            "reused": brick.key not in samplers, "median_ms": figure.median_ms, "net_ms": figure.net_ms,
            "ci_low_ms": row.get("ci_low_ms"), "ci_high_ms": row.get("ci_high_ms"), "repeats": row.get("repeats"),
            "stable": bool(row.get("stable")), "total_ms": figure.total_ms,
            "variants": {main_variant: {k: row.get(k) for k in ("median_ms", "ci_low_ms", "ci_high_ms", "repeats", "stable")}},
            "best_variant": None, "best_net_ms": None})
    estimate = compose.estimate_ms(figures, empty)
    seconds = time.perf_counter() - started
    summary = {
        "batch": request.batch, "threads": threads, "optimization_level": level, "providers": providers,
        "fingerprint": fp, "nodes": decomposition.node_count, "unique_bricks": len(figures),
        "reused_bricks": len(figures) - len(samplers), "measured_bricks": len(samplers),
        "estimate_only": True, "missing_bricks": len(missing), "empty_call_measured": empty_missing,
        "new_measurements": len(measured_rows), "estimate_seconds": seconds,
        "estimate_ms": estimate, "estimate_ci_ms": estimate_ci,
        "estimate_stable": estimate_ci <= rule.tolerance * estimate, "lower_bound_ms": None,
        "measured_ms": None, "measured_run": None, "error_pct": None,
        "plain_session_ms": None, "plain_session_error_pct": None, "empty_call_ms": empty,
        "brick_seconds": brick_seconds, "variant_seconds": 0.0,
        "reuse_saved_seconds": sum(float(r.get("seconds") or 0.0) for r in fixed.values()),
        "decompose_seconds": None, "whole_model_seconds": None, "whole_model_repeats": None,
        "whole_model_stable": None, "speedup": None, "speedup_without_reuse": None,
    }
    data = {"schema_version": BRICKS_JSON_VERSION, "model": name, "summary": summary, "rule": rule.describe(),
            "variant_rule": None, "main_variant": main_variant, "empty_call_ms": {str(threads): empty},
            "by_op_type": compose.by_op_type(figures), "top_bricks": [f.key for f in compose.top_bricks(figures)],
            "bricks": entries}
    write_json(staged_dir / "bricks.json", data)
    write_text(staged_dir / "README.md", _readme(name, summary, record.command))
    (staged_dir / "optimized.onnx").unlink(missing_ok=True)
    record.bricks = {"summary": summary, "by_op_type": data["by_op_type"], "bricks_json": "bricks.json",
                     "measured": measured_rows}
    return record.bricks


def known_keys(known: dict[tuple[str, str], Any], variant: str) -> set[str]:
    return {key for key, name in known if name == variant}


def whole_model_cap(rule: Any) -> float:
    """Seconds of timed calls the whole model may take to reach the rule, and the bricks together."""
    return max(rule.time_cap * 10, 5.0)


def _row(brick: Any, variant: str, measurement: Any) -> dict[str, Any]:
    """A brick measurement as the database stores it (mlharness.store.result_store)."""
    return {"brick_key": brick.key, "variant": variant, "op_type": brick.op_type, "label": brick.label,
            "descriptor": brick.describe() | {"nodes": None, "multiplicity": None}, **measurement.describe()}


def _refine(samplers: dict[str, Any], fixed: dict[str, dict[str, Any]], bricks: dict[str, Any], empty: float,
            rule: Any, total_cap: float | None = None) -> float:
    """Extend the samplers until the estimate's 95% half-width (compose.estimate_halfwidth) is within
    rule.tolerance of the estimate; a brick stops taking calls at rule.time_cap seconds of timed calls,
    all of them together at `total_cap` (default whole_model_cap: the cap the whole model is measured with).
    Returns the final half-width (ms)."""
    from mlharness.sut.bricks import calls_left, median_ci

    total_cap = whole_model_cap(rule) if total_cap is None else total_cap

    def terms() -> tuple[list[compose.Term], dict[str, float]]:
        out, weights = [], {}
        for key, sampler in samplers.items():
            median, low, high = median_ci(sorted(sampler.times))
            out.append(compose.Term(bricks[key].multiplicity, median, low, high))
            weights[key] = (bricks[key].multiplicity * max(median - low, high - median)) ** 2
        for key, row in fixed.items():
            out.append(compose.Term(bricks[key].multiplicity, float(row["median_ms"]),
                                    float(row.get("ci_low_ms") or row["median_ms"]),
                                    float(row.get("ci_high_ms") or row["median_ms"])))
        return out, weights

    while True:
        current, weights = terms()
        halfwidth = compose.estimate_halfwidth(current)
        if halfwidth <= rule.tolerance * compose.estimate_from_terms(current, empty):
            return halfwidth
        open_keys = [key for key in weights if samplers[key].timed < rule.time_cap]
        if not open_keys or sum(sampler.timed for sampler in samplers.values()) >= total_cap:
            return halfwidth
        key = max(open_keys, key=lambda k: weights[k])
        sampler = samplers[key]
        sampler.extend(max(1, min(max(rule.min_repeats, len(sampler.times) // 2), calls_left(sampler, rule.time_cap))))


def variant_name(threads: int, level: str, provider: str) -> str:
    return f"threads={threads},opt={level},ep={provider}"


def parse_variant(name: str) -> tuple[int, str, str]:
    parts = dict(item.split("=", 1) for item in name.split(","))
    return int(parts["threads"]), parts["opt"], parts["ep"]


def _variants(threads: int, providers: list[str], wanted: bool) -> list[tuple[int, str]]:
    """Benanza's variants: every intra-op thread count up to the CPUs this process may use (powers of
    two and the count itself), at the as-executed level and with ONNX Runtime optimizing the brick."""
    from mlharness.sut.bricks import AS_EXECUTED, available_cpus

    if not wanted:
        return []
    cpus = available_cpus()
    counts = sorted({1, cpus, *(2 ** k for k in range(1, 8) if 2 ** k < cpus)} | ({threads} if threads else set()))
    return [(t, level) for t in counts for level in (AS_EXECUTED, "enable_all")]


def _level_name(level: Any) -> str:
    return str(level).rsplit(".", 1)[-1].removeprefix("ORT_").lower()


def _known_measurements(request: RunRequest, fp: str, keys: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Brick measurements already in the results database for this fingerprint (read only)."""
    from mlharness.store import result_store

    try:
        store = result_store.ResultStore.reading(result_store.default_db_path(request.results_dir))
        if store is None:
            return {}
        with store:  # a query that meets damaged pages is a UserError too, on leaving
            return store.brick_measurements(fp, keys)
    except UserError:
        return {}  # a damaged database: every brick is measured; storing the record says why


def _measured_latency(request: RunRequest) -> dict[str, Any] | None:
    """The median latency (ms) of the LoadGen run that measured the model whole, when one was named."""
    if not request.measured_run:
        return None
    from mlharness.store import result_store

    store = result_store.ResultStore.reading(result_store.default_db_path(request.results_dir))
    if store is None:
        raise UserError(f"measured run {request.measured_run}: no results database to read it from")
    with store:
        measured = store.get_record(request.measured_run)
    performance = measured.performance or {}
    p50 = performance.get("p50_latency_ns")
    if not measured.is_ok or p50 is None:
        raise UserError(f"measured run {request.measured_run}: no latency to compare with (status {measured.status})")
    return {"run_id": measured.run_id, "latency_ms": float(p50) / 1e6, "scenario": measured.scenario}


def _readme(model: str, summary: dict[str, Any], command: str) -> str:
    def ms(value: Any) -> str:
        return f"{value:.3f} ms" if isinstance(value, (int, float)) else "-"

    return (f"# Bricks of {model}\n\nCommand: `{command}`\n\n"
            f"- nodes as executed: {summary['nodes']}, unique bricks: {summary['unique_bricks']} "
            f"({summary['reused_bricks']} reused from the results database)\n"
            f"- composed estimate: {ms(summary['estimate_ms'])}; lower bound: {ms(summary['lower_bound_ms'])}; "
            f"measured (LoadGen p50): {ms(summary['measured_ms'])}\n\n"
            "Every brick, its multiplicity, median, confidence interval and variants: `bricks.json`.\n")
