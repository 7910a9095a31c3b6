"""One run: manifests -> runtime -> LoadGen (per mode) -> results tree and run record."""
from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import RunFailed, UserError
from mlharness.records import results
from mlharness.records.loadgen_logs import detail_problems, parse_summary
from mlharness.records.run_record import RunRecord, new_run_id, utc_now
from mlharness.running import accuracy as accuracy_mod
from mlharness.running import system as system_mod
from mlharness.running.request import DEFAULT_RESULTS_DIR, RunRequest
from mlharness.running.settings import (
    Settings,
    apply_to_loadgen,
    build_settings,
    validate_loadgen_settings,
)
from mlharness.specs.index import SpecIndex
from mlharness.specs.manifests import ModelManifest, ReferenceLog

__all__ = ["DEFAULT_RESULTS_DIR", "RunFailed", "RunRequest", "run_here", "select_model"]


def select_model(index: SpecIndex, name_or_path: str, backend: str | None) -> ModelManifest:
    """A model manifest by path, or by name and backend; without a backend, the registry's first."""
    from mlharness.sut import backends as backend_registry

    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        return index.find("model", name_or_path)
    candidates = index.named("model", name_or_path)
    if not candidates:
        return index.find("model", name_or_path)  # raises with the known names
    if backend:
        matching = [m for m in candidates if m.framework == backend]
        if matching:
            return matching[0]
        if backend == "null":
            return candidates[0]  # the null backend runs any model's declared outputs
        have = ", ".join(sorted(m.framework for m in candidates))
        raise UserError(f"model {name_or_path!r} has no manifest for backend {backend!r} (have: {have})")
    order = backend_registry.names()
    return sorted(candidates, key=lambda m: order.index(m.framework) if m.framework in order else len(order))[0]


def find_reference(index: SpecIndex, model: ModelManifest, dataset_name: str, backend: str) -> ReferenceLog | None:
    """The reference log made with this model (same name and version), dataset and backend."""
    for ref in index.all("reference"):
        if (ref.model.get("name"), ref.model.get("version")) == (model.name, model.version) \
                and ref.dataset.get("name") == dataset_name and ref.backend == backend:
            return ref
    return None


def stale_reference_notes(reference: ReferenceLog, model: ModelManifest, dataset: Any) -> list[str]:
    """Say when a manifest's content changed since the reference was made (its sha256 differs)."""
    notes = []
    for kind, manifest in (("model", model), ("dataset", dataset)):
        pinned = getattr(reference, kind).get("sha256")
        if pinned and pinned != manifest.sha256:
            notes.append(f"note: the reference was made with {kind} {manifest.ref} sha256 {pinned[:12]}…, "
                         f"this run used sha256 {manifest.sha256[:12]}… (the manifest changed since)")
    return notes


def _conf_model(model: ModelManifest) -> str:
    return model.mlperf_benchmark or model.name


def prepare_settings(request: RunRequest, model: ModelManifest, tuned: dict[str, Any] | None = None) -> Settings:
    """The run's settings; `tuned` is a stored tuned configuration (mlharness.running.tuning.lookup)."""
    presets = (["quick"] if request.quick else []) + list(request.presets)
    return build_settings(scenario=request.scenario, mode=request.mode, conf_model=_conf_model(model),
                          model_name=model.name, model_hints=model.attributes.get("settings"),
                          presets=presets, user_conf=request.user_conf, overrides=request.overrides,
                          user_conf_text=request.user_conf_text,
                          tuned=(tuned or {}).get("settings"),
                          tuned_where=f"tuned {(tuned or {}).get('tuning_id')} ({(tuned or {}).get('figure_name')} "
                                      f"{(tuned or {}).get('figure_value')})")


def _harness_options(settings: Settings, model: ModelManifest) -> dict[str, Any]:
    from mlharness.running.settings import HARNESS_DEFAULTS

    options = {"max_batch_size": int(model.attributes.get("max_batch_size", 1)), **HARNESS_DEFAULTS}
    options.update(settings.harness)
    return options


def resolve_manifests(request: RunRequest) -> tuple[ModelManifest, str, Any, Any, Any, ReferenceLog | None]:
    """(model, backend name, dataset, hardware, software, reference) the request names; pins the
    process to the hardware manifest's CPUs first, so everything detected or started later sees it."""
    from mlharness.specs.index import default_index

    index = SpecIndex(request.specs_root) if request.specs_root else default_index()
    model = select_model(index, request.model, request.backend)
    backend_name = request.backend or model.framework
    dataset_name = request.dataset or model.default_dataset
    if not dataset_name:
        raise UserError(f"{model.path}: dataset: no default dataset; pass --dataset")
    dataset = index.find("dataset", dataset_name)
    hardware = index.find("hardware", request.hardware)
    _pin_cpus(hardware)  # first: the detected system and every thread started from here see the pinning
    software = index.find("software", request.software or backend_name)
    reference = index.find("reference", request.reference) if request.reference else \
        find_reference(index, model, dataset.name, backend_name)
    return model, backend_name, dataset, hardware, software, reference


def run_here(request: RunRequest, guard: Any) -> RunRecord:
    """The run itself, in this process (the launcher's child): `guard` (mlharness.running.launcher.RunGuard)
    is told where the run is staged and which SUT serves it, so a signal or timeout can stop it."""
    model, backend_name, dataset, hardware, software, reference = resolve_manifests(request)
    settings = prepare_settings(request, model)
    check_device(backend_name, hardware)
    check_cuda_graphs(settings, backend_name, hardware, model)
    check_generative_settings(settings, model)
    endpoint = _endpoint_for(request, model)
    # Against a server the framework runs there: nothing of it needs to be installed here.
    installed = system_mod.check_software(software) if not request.endpoint else {}
    for var, value in software.environment.items():
        os.environ.setdefault(var, value)
    detected = system_mod.detect_system()
    system_name = system_mod.system_name(detected, hardware.device)
    settings, untuned_note = _with_tuned(request, model, backend_name, system_name, settings)
    if model.generation is not None:
        _token_mode(settings)
    run_id = new_run_id()
    where = results.scenario_dir(Path(request.results_dir), system_name, model.name, request.scenario, run_id)
    record = RunRecord(
        run_id=run_id, command=request.command or _command_line(request), model=model.identity(),
        dataset=dataset.identity(), backend=backend_name, scenario=request.scenario, mode=request.mode,
        system_name=system_name, system=detected,
        software={"manifest": software.identity(), "checked": installed, "versions": system_mod.software_versions()},
        hardware=hardware.identity() | {"device": hardware.device,
                                        "cpu_affinity": list(hardware.cpu_affinity or ())}, settings=settings.as_record(),
        reference=reference.identity() if reference else None, results_path=str(where.staging))
    guard.started(record, where)
    runtime = None
    try:
        from mlharness.sut.runtime import build_runtime

        options = _harness_options(settings, model)
        if model.generation is not None:  # a generative model: mlharness.sut.llm (issue 19)
            from mlharness.sut.llm.runtime import build_llm_runtime as build_runtime  # noqa: F811
        if endpoint is not None and endpoint.protocol == "openai":  # an LLM server (mlharness.sut.network)
            from mlharness.sut.network.openai_runtime import build_openai_runtime

            runtime = build_openai_runtime(model, dataset, endpoint, options)
        elif endpoint is not None:  # the model runs on a server (mlharness.sut.network)
            from mlharness.sut.network.runtime import build_endpoint_runtime

            runtime = build_endpoint_runtime(model, dataset, endpoint, options)
        else:
            runtime = build_runtime(model, dataset, hardware, backend_name, options)
        record.backend_info = runtime.backend.describe()
        record.artifacts = runtime.artifacts
        record.cold_start = dict(runtime.cold_start)
        # The first inference and the warm-up, outside LoadGen: its test measures a warm system.
        from mlharness.sut.warmup import first_inference_and_warm_up

        # SingleStream sends one sample per query, so it warms up at batch 1.
        warm_batch = 1 if request.scenario == "SingleStream" else options["max_batch_size"]
        warmed = guard.watch(float(options["load_timeout"]) + float(options["warmup_seconds"]),
                             "the first inference and warm-up (user code and the backend, before LoadGen)")
        if getattr(runtime, "network", False) and getattr(runtime, "generative", False):
            from mlharness.sut.network.openai_runtime import warm_up_openai

            record.cold_start.update(warm_up_openai(runtime, int(options["warmup_queries"]),
                                                    float(options["warmup_seconds"])))
        elif getattr(runtime, "network", False):
            from mlharness.sut.network.runtime import warm_up_endpoint

            record.cold_start.update(warm_up_endpoint(runtime, int(options["warmup_queries"]),
                                                      float(options["warmup_seconds"])))
        elif getattr(runtime, "generative", False):
            from mlharness.sut.llm.runtime import first_generation_and_warm_up

            record.cold_start.update(first_generation_and_warm_up(
                runtime, int(options["warmup_queries"]), float(options["warmup_seconds"])))
        else:
            record.cold_start.update(first_inference_and_warm_up(
                runtime, warm_batch, int(options["warmup_queries"]), float(options["warmup_seconds"])))
        warmed()
        _expect_measured_latency(settings, record.cold_start, request.scenario)
        _say_untuned_once(untuned_note, Path(request.results_dir), model.name, request.scenario, system_name)
        record.settings = settings.as_record()
        user_conf = where.stage() / "user.conf"
        write_text(user_conf, settings.user_conf_text())
        modes = ["accuracy", "performance"] if request.mode == "submission" else [request.mode]
        for mode in modes:
            _run_mode(mode, runtime, settings, user_conf, where, record, request, reference, guard)
        write_json(where.stage() / "measurements.json", results.measurements(model, backend_name))
        write_text(where.stage() / "README.md", results.readme(model, request.scenario, record.command))
        record.status = "ok"
    except BaseException as exc:
        record_usage(record, hardware)
        fail_run(record, where, exc, guard)
    finally:
        if runtime is not None:
            runtime.backend.close()
    record_usage(record, hardware)
    if not guard.finalizing():
        wait_for_abort()
    record.finished_at = utc_now()
    record.results_path = str(where.run_dir)
    write_json(where.stage() / "run.json", record.to_dict())
    (where.staging / "owner.json").unlink(missing_ok=True)
    where.publish()
    results.write_system_json(Path(request.results_dir), system_name, detected, hardware, record.software["versions"])
    return record


def _endpoint_for(request: RunRequest, model: ModelManifest) -> Any:
    """The server a run goes to (None: this process), checked against the model: a generative model
    speaks to an OpenAI-compatible server, a tensor model to an Open Inference Protocol one."""
    if not request.endpoint:
        return None
    from mlharness.specs.endpoint import parse_endpoint

    endpoint = parse_endpoint(request.endpoint)
    if model.generation is not None and endpoint.protocol != "openai":
        raise UserError(f"--endpoint: {model.path}: a generative model; give an OpenAI-compatible server as "
                        f"openai+http://HOST:PORT/v1, not {request.endpoint}")
    if model.generation is None and endpoint.protocol == "openai":
        raise UserError(f"--endpoint: {model.path}: not a generative model; an OpenAI-compatible server takes "
                        "generative ones (a tensor model's server: grpc:// or http://)")
    return endpoint


def _with_tuned(request: RunRequest, model: ModelManifest, backend: str, system_name: str,
                settings: Settings) -> tuple[Settings, str | None]:
    """The settings with the tuned configuration stored for this model, system, backend and software
    (layer "tuned"), unless --no-tuned; without one, a note on how to tune (performance runs), to print
    once the run's inputs have proved good, and only the first time for this model, scenario and system
    under this results folder. Nothing to tune: the null backend with no postprocess (the harness alone,
    as the shipped null model), a run against a server (tuned on the server's side), an LLM."""
    from mlharness.running import tuned as tuning
    from mlharness.running.progress import quiet_from_env

    if not request.use_tuned or request.mode not in ("performance", "submission") or \
            getattr(model, "generation", None) is not None:  # tune does not search generative models
        return settings, None
    key = tuning.tuning_key(model, system_name, backend, system_mod.software_versions(), request.scenario)
    found = tuning.lookup(Path(request.results_dir), key)
    if found is not None:
        return prepare_settings(request, model, found), None
    if request.scenario not in tuning.TUNABLE_SCENARIOS or request.quiet or quiet_from_env() or \
            (backend == "null" and not model.postprocess) or request.endpoint:
        return settings, None
    return settings, tuning.untuned_note(model.name, request.scenario, system_name)


def _say_untuned_once(note: str | None, results_dir: Path, model: str, scenario: str, system_name: str) -> None:
    """Print the untuned note unless this results folder has seen it for this model, scenario and system."""
    if note is None:
        return
    seen = results_dir / "untuned-notes.txt"  # one line per (model, scenario, system) told; appended
    key = f"{model}\t{scenario}\t{system_name}"
    try:
        if key in seen.read_text().splitlines():
            return
    except OSError:
        pass
    print(note, file=sys.stderr, flush=True)
    try:
        with open(seen, "a") as out:
            out.write(key + "\n")
    except OSError:
        pass  # a read-only results folder: the note comes again next time, nothing worse


def _expect_measured_latency(settings: Settings, cold_start: dict[str, Any], scenario: str) -> None:
    """SingleStream and MultiStream: LoadGen pre-generates queries for min_duration at the expected
    latency (twice over) and ends the test with an error when a faster SUT runs out of them. The
    model manifest's figure was measured on some machine; when this machine's fastest warm-up query
    answered in under half of it, expect half of that instead (layer `measured`, in run.json). The
    fastest query, not the mean: one stall of a busy machine inflates the mean, and an expectation
    above what the test then runs at leaves LoadGen short of queries. A latency the user set
    (preset, user.conf, --set) is kept as given."""
    if scenario not in ("SingleStream", "MultiStream") or settings.origin.get("target_latency") not in (None, "model"):
        return
    warmup = cold_start.get("warmup") or {}
    if not warmup.get("queries") or not warmup.get("samples"):
        return
    per_sample_ms = 1000.0 * warmup["fastest_query_seconds"] / warmup["batch_size"]
    per_query_ms = per_sample_ms * (int(settings.loadgen.get("samples_per_query", 8)) if scenario == "MultiStream" else 1)
    hint = settings.loadgen.get("target_latency")
    if hint is not None and per_query_ms >= float(hint) / 2:
        return
    expected = max(per_query_ms / 2, 0.001)
    settings.set("target_latency", f"{expected:.6g}", "measured",
                 f"the warm-up's fastest query of {warmup['queries']} ({per_query_ms:.4g} ms a query)")
    if "measured" not in settings.layers:
        settings.layers.append("measured")


def _token_mode(settings: Settings) -> None:
    """A generative model runs in LoadGen's token mode: TTFT and TPOT measured per token."""
    if settings.loadgen.get("use_token_latencies") != "1":
        settings.set("use_token_latencies", 1, "generative", "a generative model (LoadGen's token mode)")
        if "generative" not in settings.layers:
            settings.layers.append("generative")


def check_device(backend_name: str, hardware: Any) -> None:
    """A device the backend cannot use here is refused before anything is written."""
    from mlharness.sut import backends as backend_registry

    problem = backend_registry.backend_class(backend_name).device_problem(hardware)
    if problem:
        raise UserError(f"{hardware.path}: {problem}")


def check_generative_settings(settings: Settings, model: ModelManifest) -> None:
    """llm_batching schedules a generative model's tokens: set for a tensor model (by any layer) it would be
    ignored, so it is refused before anything is written, naming where it was set."""
    if model.generation is None and "llm_batching" in settings.origin:
        raise UserError(f"llm_batching={settings.harness['llm_batching']} ({settings.where.get('llm_batching', '?')}): "
                        f"{model.path}: model {model.name} is not generative (no generation: section); llm_batching "
                        f"schedules a generative model's token generation")


def check_cuda_graphs(settings: Settings, backend_name: str, hardware: Any, model: ModelManifest) -> None:
    """The harness key cuda_graphs where it cannot apply (not torch, not a cuda device, symbolic dims)
    is refused before anything is written, as a device the backend cannot use is."""
    if not settings.harness.get("cuda_graphs"):
        return
    if backend_name != "torch":
        raise UserError(f"cuda_graphs: only the torch backend captures CUDA graphs, this run's backend is "
                        f"{backend_name} (set by {settings.origin.get('cuda_graphs', '?')})")
    from mlharness.sut.device_torch import cuda_graph_problem

    problem = cuda_graph_problem(hardware.device, model.inputs)
    if problem:
        raise UserError(f"{hardware.path if problem.startswith('cuda_graphs: CUDA') else model.path}: {problem}")


def record_usage(record: RunRecord, hardware: Any) -> None:
    """Peak memory of the run's process (and of the device where one was used), for run.json."""
    from mlharness.resources import usage

    record.cold_start.update(usage(hardware.device))


def fail_run(record: RunRecord, where: results.ScenarioDir, exc: BaseException, guard: Any) -> None:
    """Keep the failed run in failed-<run id>/ with its record (and the traceback of anything that is
    not a user's mistake) and raise RunFailed; unless an abort is already writing it."""
    if not guard.finalizing():
        wait_for_abort()
    failure = guard.aborted or exc
    record.status = "failed"
    record.error = str(failure) if isinstance(failure, UserError) else f"{type(failure).__name__}: {failure}"
    record.finished_at = utc_now()
    (where.staging / "owner.json").unlink(missing_ok=True)
    failed_dir = where.keep_failed()
    record.results_path = str(failed_dir)
    cause = _bug_behind(failure)
    traceback_path = None
    if cause is not None:
        traceback_path = failed_dir / "traceback.txt"
        write_text(traceback_path, "".join(traceback.format_exception(cause)))
        record.error_traceback = str(traceback_path)
    write_json(failed_dir / "run.json", record.to_dict())
    message = f"run failed: {record.error} (logs kept in {failed_dir})"
    if traceback_path is not None:
        message += f"; traceback in {traceback_path}"
    raise RunFailed(message, record, getattr(failure, "exit_status", 1)) from exc


def _bug_behind(failure: BaseException) -> BaseException | None:
    """The exception whose traceback is worth keeping: anything but a user's mistake, including what
    user code or a backend raised behind a SampleError."""
    if not isinstance(failure, UserError):
        return failure
    cause = getattr(failure, "cause", None) or failure.__cause__
    return cause if cause is not None and not isinstance(cause, UserError) else None


def wait_for_abort() -> None:
    """The guard's abort is writing the failed run and will end this process; wait for it."""
    while True:
        time.sleep(60)


def run_arguments(request: RunRequest, with_results_dir: bool = False) -> list[str]:
    """The `mlharness` arguments that repeat this request (README.md and re-runs use them)."""
    parts = ["run", request.model, "--scenario", request.scenario, "--mode", request.mode]
    for flag, value in (("--dataset", request.dataset), ("--backend", request.backend),
                        ("--software", request.software), ("--user-conf", request.user_conf),
                        ("--endpoint", request.endpoint)):
        if value:
            parts += [flag, str(value)]
    if request.hardware != "cpu":
        parts += ["--hardware", request.hardware]
    if request.quick:
        parts.append("--quick")
    for preset in request.presets:
        parts += ["--preset", preset]
    for item in request.overrides:
        parts += ["--set", item]
    if with_results_dir:
        parts += ["--results-dir", str(request.results_dir)]
    return parts


def _pin_cpus(hardware: Any) -> None:
    if not hardware.cpu_affinity or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(0, hardware.cpu_affinity)
    except OSError:
        available = sorted(os.sched_getaffinity(0))
        raise UserError(f"{hardware.path}: cpu_affinity: expected CPUs this process may use {available}, "
                        f"got {list(hardware.cpu_affinity)}") from None


def _command_line(request: RunRequest) -> str:
    return shlex.join(["mlharness", *run_arguments(request)])


def _run_mode(mode: str, runtime: Any, settings: Settings, user_conf: Path, where: results.ScenarioDir,
              record: RunRecord, request: RunRequest, reference: ReferenceLog | None, guard: Any) -> None:
    dest = where.stage("accuracy") if mode == "accuracy" else where.stage("performance", "run_1")
    mode_settings = replace(settings, mode=mode)
    profile = _profile_session(request, where, mode)
    # LoadGen writes straight into the staged folder, so a run stopped mid-test keeps its logs so far.
    facts: dict[str, Any] = {}
    failure, elapsed = run_loadgen(runtime, mode_settings, user_conf, dest, request, profile, guard, facts,
                                   cold_start=record.cold_start)
    kept = results.prune_loadgen_logs(dest, drop_empty_accuracy=mode != "accuracy")
    if profile is not None:
        record.profile = profile.finish(loadgen_trace=dest / "mlperf_log_trace.json")
    summary = parse_summary(dest / "mlperf_log_summary.txt")
    summary["wall_seconds"] = round(elapsed, 3)
    summary.update(facts.pop("token_figures", None) or {})
    problems = detail_problems(dest / "mlperf_log_detail.txt")
    record.loadgen[mode] = {"logs": kept, **problems, "sut": facts}
    if mode == "accuracy":
        record.loadgen[mode]["summary"] = summary
    else:
        record.performance = summary
    if failure is not None:
        raise failure
    if problems["errors"]:
        # LoadGen replaced a setting or found the run broken: the numbers do not mean what was asked.
        raise UserError(f"LoadGen logged {len(problems['errors'])} error(s) in the {mode} test, the first: "
                        f"{problems['errors'][0][:300]}")
    if mode == "accuracy":
        report = _score(runtime, dest, reference)
        record.accuracy = report.as_record()


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


def batch_wait_bound(settings: Settings, options: dict[str, Any], service_ms: float | None) -> dict[str, Any]:
    """How long a Server worker may wait for a batch to fill (harness key batch_wait_ms), as a bound
    derived from the latency target T and the measured service time S of a full batch: the query that
    opens a batch waits W, may find the one batch before it still in service (S), then is served (S),
    so W <= T - 2S keeps it within T. Without a measured S (no warm-up) the bound is T/2. Returns the
    wait applied and how it was derived, for the record."""
    wanted = float(options.get("batch_wait_ms") or 0.0)
    if settings.scenario != "Server" or wanted <= 0:
        return {"batch_wait_ms": 0.0}
    target = settings.loadgen.get("target_latency")
    if target is None:
        return {"batch_wait_ms": wanted}
    if service_ms is None:
        bound, rule = float(target) / 2, "target_latency / 2 (no measured service time)"
    else:
        bound, rule = max(0.0, float(target) - 2 * service_ms), "target_latency - 2 x service time of a full batch"
    return {"batch_wait_ms": round(min(wanted, bound), 6), "batch_wait_bound_ms": round(bound, 6),
            "batch_wait_rule": rule, **({"batch_service_ms": round(service_ms, 6)} if service_ms is not None else {})}


def full_batch_service_ms(cold_start: dict[str, Any], max_batch_size: int) -> float | None:
    """The warm-up's time per batch (ms) when it ran full batches of max_batch_size; else None."""
    warmup = cold_start.get("warmup") or {}
    if not warmup.get("queries") or warmup.get("batch_size") != max_batch_size:
        return None
    return 1000.0 * float(warmup["seconds"]) / int(warmup["queries"])


def run_test_beside_caller(start_test: Callable[[], None], serve: Callable[[], None], end: Callable[[], None]) -> None:
    """Run LoadGen's test (`start_test`) on a thread of its own while the calling thread serves the SUT
    (`serve`, which returns after `end`, called when the test is over); the test's exception, if any,
    is raised here once both are done."""
    failure: list[BaseException] = []

    def test() -> None:
        try:
            start_test()
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)
        finally:
            end()

    thread = threading.Thread(target=test, name="mlharness-loadgen", daemon=True)
    thread.start()
    try:
        serve()
    finally:
        thread.join()
    if failure:
        raise failure[0]


def run_loadgen(runtime: Any, settings: Settings, user_conf: Path, logdir: Path,
                request: RunRequest, profile: Any = None, guard: Any = None,
                facts: dict[str, Any] | None = None,
                cold_start: dict[str, Any] | None = None) -> tuple[BaseException | None, float]:
    """One LoadGen test; returns the failure the SUT recorded (None when it ran clean) and its wall time.
    `facts` receives how the SUT was served (issue path, batch wait), for the record; the warm-up in
    `cold_start` (its time per full batch) derives the batch wait's bound."""
    import mlperf_loadgen as lg

    from mlharness.sut.handoff import load_handoff, load_issue_queue
    from mlharness.sut.loadgen_handles import loadgen_handles
    from mlharness.sut.system_under_test import SystemUnderTest

    test_settings = apply_to_loadgen(settings, user_conf)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(logdir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = bool(settings.harness.get("enable_trace", False))
    options = _harness_options(settings, runtime.model)
    generative = getattr(runtime, "generative", False)
    network = getattr(runtime, "network", False)
    # A run against a server has no issue queue and no batch wait here: the server batches.
    issue_queue, issue_path = load_issue_queue(settings.scenario) if not network else (None, "network")
    service_ms = full_batch_service_ms(cold_start or {}, int(options["max_batch_size"]))
    wait = batch_wait_bound(settings, options, service_ms) if not (generative or network) else {"batch_wait_ms": 0.0}
    if facts is not None and not network:
        facts.update(issue_path=issue_path, **wait)
    if network:  # the query dispatch library of a run against a server
        from mlharness.sut.network.network_sut import NetworkSUT, TensorExchange

        exchange = runtime.exchange() if generative else \
            TensorExchange(runtime.backend, runtime.staged, runtime.input_name, runtime.model.result or runtime.model.outputs[0])
        sut = NetworkSUT(connection=runtime.backend, exchange=exchange,
                         issue_lag_limit_ms=float(options["issue_lag_limit_ms"]), scenario=settings.scenario,
                         # the first failed request ends the run (its logs kept), not min_duration later
                         on_failure=(lambda text: threading.Thread(target=guard.abort, args=(text, 1), daemon=True,
                                                                   name="mlharness-endpoint-failed").start())
                         if guard is not None else None)
        if facts is not None:
            facts.update(sut.describe())
    elif generative:  # LoadGen's token mode: FirstTokenComplete, n_tokens (issue 19)
        from mlharness.sut.llm.token_sut import TokenStreamingSUT

        sut = TokenStreamingSUT(backend=runtime.backend, prompts=runtime.staged, scenario=settings.scenario,
                                batching=options["llm_batching"], max_batch_size=options["max_batch_size"],
                                warm_sequences=options["max_batch_size"] if options["warmup_queries"] else 0,
                                serve_on_caller=True)
        if facts is not None:  # the token SUT takes LoadGen's Python callback
            facts.update(issue_path="python", batch_wait_ms=0.0, **sut.describe())
    else:
        sut = SystemUnderTest(backend=runtime.backend, staged=runtime.staged, handoff=load_handoff(),
                              scenario=settings.scenario, postprocess=runtime.postprocess, ctx=runtime.ctx,
                              max_batch_size=options["max_batch_size"], workers=options["workers"],
                              observer=profile, result_spec=runtime.model.result or runtime.model.outputs[0],
                              issue_queue=issue_queue, batch_wait_s=wait["batch_wait_ms"] / 1e3,
                              postprocess_group_rows=int(options["postprocess_group_rows"]),
                              # not under a profile: its tracers follow the SUT's worker threads
                              serve_on_caller=profile is None and getattr(runtime.backend, "prefers_caller_thread", False))
        if facts is not None:
            facts.update(served_on="caller" if sut.serve_on_caller else "workers",
                         postprocess_group_rows=sut.postprocess_group_rows)
    if guard is not None:
        guard.attach_sut(sut)
    load_timeout = float(options.get("load_timeout") or 0)

    def load_samples(indices: list[int]) -> None:
        loaded = guard.watch(load_timeout, f"LoadQuerySamples (load and preprocess of {len(indices)} samples)") \
            if guard is not None else (lambda: None)
        try:
            runtime.staged.load_samples(indices)
        except BaseException as exc:  # must not propagate into LoadGen's C++ thread
            sut.fail_staging(exc)
        finally:
            loaded()

    def unload_samples(indices: list[int]) -> None:
        runtime.staged.unload_samples(indices)

    total = len(runtime.staged)
    perf_count = min(total, int(runtime.model.attributes.get("performance_sample_count", 1024)))
    validate_loadgen_settings(settings, performance_sample_count=perf_count)
    # An explicit audit.config path: LoadGen otherwise reads ./audit.config from the working directory.
    audit = str(request.audit_config) if request.audit_config else str(logdir / "no-audit.config")
    from mlharness.running.progress import Ticker, plan_loadgen_test, quiet_from_env

    plan = plan_loadgen_test(test_settings, settings.scenario, settings.mode, settings.origin, total)
    quiet = bool(getattr(request, "quiet", False)) or quiet_from_env()
    if not quiet:
        for line in plan.describe():
            print(f"[run] {line}", file=sys.stderr, flush=True)
    first_done: list[float] = []  # when the first sample was seen completed (LoadGen's test under way)

    def watch() -> None:
        if not first_done and sut.completed_samples:
            first_done.append(time.perf_counter())

    def progress() -> Any:
        return plan.snapshot(sut.completed_samples, time.perf_counter() - first_done[0] if first_done else None)

    ticker = Ticker(f"{runtime.model.name} {settings.scenario} {settings.mode}", progress, "samples", quiet=quiet,
                    watch=watch)
    # Tracers wrap only the test (and the SUT's workers, so they can follow them); none without --profile.
    with profile.measuring(runtime, sut) if profile is not None else contextlib.nullcontext(), \
            loadgen_handles(sut, total, perf_count, load_samples, unload_samples) as (lg_sut, qsl):
        started = time.perf_counter()
        try:
            with ticker:
                if getattr(sut, "serve_on_caller", False):  # this thread generates, LoadGen's test runs beside it
                    run_test_beside_caller(lambda: lg.StartTestWithLogSettings(lg_sut, qsl, test_settings, log_settings,
                                                                           audit), sut.serve_here, sut.end_serving)
                else:
                    lg.StartTestWithLogSettings(lg_sut, qsl, test_settings, log_settings, audit)
        finally:
            elapsed = time.perf_counter() - started
    if facts is not None and hasattr(sut, "token_figures"):  # inter-token latency, goodput (issue 19)
        facts["token_figures"] = sut.token_figures(settings.loadgen.get("ttft_latency"),
                                                   settings.loadgen.get("tpot_latency"))
    if hasattr(sut, "figures"):  # a run against a server: issue lag, the server's timings, failures
        if facts is not None:
            facts["network"] = sut.figures()
            facts["requests_log"] = sut.write_requests(logdir)  # token mode: requests.jsonl, else None
        if sut.failure is not None and not isinstance(sut.failure, UserError):
            return sut.failure, elapsed  # a bug: raised with its traceback
        return (UserError(sut.failure_text()) if sut.failure is not None else None), elapsed
    return sut.failure, elapsed
