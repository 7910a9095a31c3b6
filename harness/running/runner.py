"""One run: manifests -> runtime -> LoadGen (per mode) -> results tree and run record."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import RunFailed, UserError
from mlharness.records import results
from mlharness.records.loadgen_logs import detail_problems, parse_summary
from mlharness.records.run_record import RunRecord
from mlharness.running import accuracy as accuracy_mod
from mlharness.running import lifecycle
from mlharness.running.arguments import command_line
from mlharness.running.loadgen_test import run_loadgen
from mlharness.running.request import DEFAULT_RESULTS_DIR, RunRequest
from mlharness.running.resolve import (
    check_cuda_graphs,
    check_device,
    check_generative_settings,
    endpoint_for,
    expect_measured_latency,
    harness_options,
    prepare_settings,
    resolve_manifests,
    say_untuned_once,
    stale_reference_notes,
    token_mode,
    with_tuned,
)
from mlharness.running.settings import Settings
from mlharness.specs.manifests import ReferenceLog

__all__ = ["DEFAULT_RESULTS_DIR", "RunFailed", "RunRequest", "fatal_loadgen_errors", "run_here"]

# LoadGen compares its PerfClock with the system clock over the performance test, in whole milliseconds,
# and logs an error when they differ by more than 1%. A pause between its two clock reads at the start or
# the end (a busy machine) is more than 1% of a test of a few milliseconds: over a test this short the
# check says nothing about the clocks, so it does not fail the run. Over a longer one it does.
CLOCK_CHECK = "PerfClock and system_clock differ"
CLOCK_CHECK_MIN_SECONDS = 10.0


def fatal_loadgen_errors(errors: list[str], test_seconds: float) -> list[str]:
    """The errors LoadGen logged that fail the run: all but the clock check of a test under 10 s."""
    return [e for e in errors if not (CLOCK_CHECK in e and test_seconds < CLOCK_CHECK_MIN_SECONDS)]


def run_here(request: RunRequest, guard: lifecycle.Guard) -> RunRecord:
    """The run itself, in this process (the launcher's child): `guard` (mlharness.running.run_child.RunGuard)
    is told where the run is staged and which SUT serves it, so a signal or timeout can stop it. Staging,
    failure and publishing are the lifecycle's (mlharness.running.lifecycle); the LoadGen body is here."""
    model, backend_name, dataset, hardware, software, reference = resolve_manifests(request)
    settings = prepare_settings(request, model)
    check_device(backend_name, hardware)
    check_cuda_graphs(settings, backend_name, hardware, model)
    check_generative_settings(settings, model)
    endpoint = endpoint_for(request, model)
    # Against a server the framework runs there: nothing of it needs to be installed here.
    host = lifecycle.prepare_host(software, hardware, check_software=not request.endpoint)
    settings, untuned_note = with_tuned(request, model, backend_name, host.name, settings)
    if model.generation is not None:
        token_mode(settings)
    where = lifecycle.new_place(request.results_dir, host, model.name, request.scenario)
    record = lifecycle.new_record(where, host, model, dataset, backend_name, software, hardware, settings,
                                  command=request.command or command_line(request), scenario=request.scenario,
                                  mode=request.mode, reference=reference.identity() if reference else None)

    def body(run: lifecycle.StagedRun) -> None:
        options = harness_options(settings, model)
        runtime = run.adopt(build_any_runtime(model, dataset, hardware, backend_name, endpoint, options))
        # The first inference and the warm-up, outside LoadGen: its test measures a warm system.
        warmed = guard.watch(float(options["load_timeout"]) + float(options["warmup_seconds"]),
                             "the first inference and warm-up (user code and the backend, before LoadGen)")
        run.update(cold_start=run.record.cold_start | warm_up(runtime, request.scenario, options))
        warmed()
        expect_measured_latency(settings, run.record.cold_start, request.scenario)
        say_untuned_once(untuned_note, Path(request.results_dir), model.name, request.scenario, host.name)
        run.update(settings=settings.as_record())
        user_conf = where.stage() / "user.conf"
        write_text(user_conf, settings.user_conf_text())
        modes = ["accuracy", "performance"] if request.mode == "submission" else [request.mode]
        for mode in modes:
            _run_mode(mode, runtime, settings, user_conf, run, request, reference, guard)
        write_json(where.stage() / "measurements.json", results.measurements(model, backend_name))
        write_text(where.stage() / "README.md", results.readme(model, request.scenario, run.record.command))

    record = lifecycle.run_staged(record, where, guard, hardware, body)
    results.write_system_json(Path(request.results_dir), host.name, host.detected, hardware, record.software["versions"])
    return record


def build_any_runtime(model: Any, dataset: Any, hardware: Any, backend_name: str, endpoint: Any,
                      options: dict[str, Any]) -> Any:
    """The runtime a run serves from: an LLM server, a tensor model's server, a generative model in
    process, or a model in process."""
    if endpoint is not None and endpoint.protocol == "openai":  # an LLM server (mlharness.sut.network)
        from mlharness.sut.network.openai_runtime import build_openai_runtime

        return build_openai_runtime(model, dataset, endpoint, options)
    if endpoint is not None:  # the model runs on a server (mlharness.sut.network)
        from mlharness.sut.network.runtime import build_endpoint_runtime

        return build_endpoint_runtime(model, dataset, endpoint, options)
    if model.generation is not None:  # a generative model: mlharness.sut.llm (issue 19)
        from mlharness.sut.llm.runtime import build_llm_runtime

        return build_llm_runtime(model, dataset, hardware, backend_name, options)
    from mlharness.sut.runtime import build_runtime

    return build_runtime(model, dataset, hardware, backend_name, options)


def warm_up(runtime: Any, scenario: str, options: dict[str, Any]) -> dict[str, Any]:
    """The first inference and the warm-up queries, as each kind of runtime does them; cold-start figures."""
    queries, seconds = int(options["warmup_queries"]), float(options["warmup_seconds"])
    if getattr(runtime, "network", False) and getattr(runtime, "generative", False):
        from mlharness.sut.network.openai_runtime import warm_up_openai

        return warm_up_openai(runtime, queries, seconds)
    if getattr(runtime, "network", False):
        from mlharness.sut.network.runtime import warm_up_endpoint

        return warm_up_endpoint(runtime, queries, seconds)
    if getattr(runtime, "generative", False):
        from mlharness.sut.llm.runtime import first_generation_and_warm_up

        return first_generation_and_warm_up(runtime, queries, seconds)
    from mlharness.sut.warmup import first_inference_and_warm_up

    # SingleStream sends one sample per query, so it warms up at batch 1.
    return first_inference_and_warm_up(runtime, 1 if scenario == "SingleStream" else options["max_batch_size"],
                                       queries, seconds)


def _run_mode(mode: str, runtime: Any, settings: Settings, user_conf: Path, run: lifecycle.StagedRun,
              request: RunRequest, reference: ReferenceLog | None, guard: Any) -> None:
    """One LoadGen test of the run (`mode`); its logs, summary and score become the run's next record."""
    where = run.where
    dest = where.stage("accuracy") if mode == "accuracy" else where.stage("performance", "run_1")
    mode_settings = replace(settings, mode=mode)
    profile = _profile_session(request, where, mode)
    # LoadGen writes straight into the staged folder, so a run stopped mid-test keeps its logs so far.
    facts: dict[str, Any] = {}
    failure, elapsed = run_loadgen(runtime, mode_settings, user_conf, dest, request, profile, guard, facts,
                                   cold_start=run.record.cold_start)
    kept = results.prune_loadgen_logs(dest, drop_empty_accuracy=mode != "accuracy")
    if profile is not None:
        run.update(profile=profile.finish(loadgen_trace=dest / "mlperf_log_trace.json"))
    summary = parse_summary(dest / "mlperf_log_summary.txt")
    summary["wall_seconds"] = round(elapsed, 3)
    summary.update(facts.pop("token_figures", None) or {})
    problems = detail_problems(dest / "mlperf_log_detail.txt")
    logged = {"logs": kept, **problems, "sut": facts}
    if mode == "accuracy":
        run.update(loadgen=run.record.loadgen | {mode: logged | {"summary": summary}})
    else:
        run.update(loadgen=run.record.loadgen | {mode: logged}, performance=summary)
    if failure is not None:
        raise failure
    fatal = fatal_loadgen_errors(problems["errors"], elapsed)
    if len(fatal) < len(problems["errors"]):
        print(f"note: LoadGen's clock check failed over a test of {elapsed:.2f} s, shorter than "
              f"{CLOCK_CHECK_MIN_SECONDS:g} s: not taken as a failure of this run (the error stays in its detail log)",
              file=sys.stderr)
    if fatal:
        # LoadGen replaced a setting or found the run broken: the numbers do not mean what was asked.
        raise UserError(f"LoadGen logged {len(fatal)} error(s) in the {mode} test, the first: {fatal[0][:300]}")
    if mode == "accuracy":
        report = _score(runtime, dest, reference)
        run.update(accuracy=report.as_record())


def _score(runtime: Any, dest: Path, reference: ReferenceLog | None) -> accuracy_mod.AccuracyReport:
    model, dataset = runtime.model, runtime.dataset
    if getattr(runtime, "generative", False):  # generated token ids, decoded to text (issue 19)
        from mlharness.running import llm_accuracy

        spec = dataset.evaluation or model.accuracy
        report = llm_accuracy.score(dest / "mlperf_log_accuracy.json", runtime.decode, runtime.labels, spec,
                                    str(dataset.path if dataset.evaluation else model.path), reference,
                                    model.result or model.outputs[0])
        if reference is not None:
            report.notes = stale_reference_notes(reference, model, dataset)
        write_text(dest / "accuracy.txt", report.text())
        return report
    result_spec = model.result or model.outputs[0]
    decoded = accuracy_mod.decode_accuracy_log(dest / "mlperf_log_accuracy.json", result_spec,
                                               model.attributes.get("dims"))
    spec = dataset.evaluation or model.accuracy
    where = str(dataset.path if dataset.evaluation else model.path)
    scored = accuracy_mod.evaluate(decoded, runtime.labels, spec, where)
    report = accuracy_mod.compare(scored, reference, decoded, spec["metric"])
    if reference is not None:
        report.notes = stale_reference_notes(reference, model, dataset)
    write_text(dest / "accuracy.txt", report.text())
    return report


def _profile_session(request: RunRequest, where: results.ScenarioDir, mode: str) -> Any:
    """A profiling session for this mode's test when --profile was given: the performance test,
    or the accuracy test when that is the only one."""
    if not request.profile or (mode == "accuracy" and request.mode != "accuracy"):
        return None
    from mlharness import profiling

    return profiling.new_session(request.profile, where.stage("profile"), request.scenario)
