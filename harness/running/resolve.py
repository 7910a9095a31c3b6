"""What a run request names, found and checked before anything is written: the manifests, the
settings (presets, user.conf, tuned, measured), the endpoint, and the refusals of what cannot run here."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlharness.errors import UserError
from mlharness.running import system as system_mod
from mlharness.running.request import RunRequest
from mlharness.running.presets import scenarios_from_environment, shipped_scenarios
from mlharness.running.settings import Settings, build_settings
from mlharness.sut.handoff import handoff_from_environment, issue_path_from_environment
from mlharness.specs.index import SpecIndex, default_index, shipped_specs, specs_from_environment
from mlharness.specs.manifests import ModelManifest, ReferenceLog


def resolved_for_run(request: RunRequest) -> RunRequest:
    """The request as it is run, read where the run is submitted (the launcher; a cluster sweep's driver):
    user.conf's text and the environment's settings that decide a run ($MLHARNESS_SPECS,
    $MLHARNESS_HANDOFF, $MLHARNESS_ISSUE) taken in, so the run's process or a cluster node gets them
    rather than a path or its own environment. What the request already sets is kept; a resolved
    request is returned as it is."""
    if request.resolved:
        return request
    text = request.user_conf_text
    if request.user_conf is not None and text is None:
        try:
            text = request.user_conf.read_text()
        except OSError as exc:
            raise UserError(f"{request.user_conf}: cannot read user.conf: {exc.strerror or exc}") from None
    return replace(request, user_conf_text=text, specs_root=request.specs_root or specs_from_environment(),
                   scenarios_root=request.scenarios_root or scenarios_from_environment(),
                   handoff=request.handoff or handoff_from_environment(),
                   issue_path=request.issue_path or issue_path_from_environment(), resolved=True)


def spec_index(request: RunRequest) -> SpecIndex:
    """The specs a request runs with: its own folder; else, once resolved, the shipped specs (the
    environment was read when it was resolved, maybe on another machine); else $MLHARNESS_SPECS's."""
    if request.specs_root:
        return SpecIndex(request.specs_root)
    return SpecIndex(shipped_specs()) if request.resolved else default_index()


def presets_root(request: RunRequest) -> Path | None:
    """The presets a request runs with: its own folder; else, once resolved, the shipped presets (the
    environment was read when it was resolved); else None, $MLHARNESS_SCENARIOS's or the shipped."""
    if request.scenarios_root:
        return request.scenarios_root
    return shipped_scenarios() if request.resolved else None


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
    tuned = tuned or {}  # the stored configuration's row (ResultStore.get_tuned), or none
    return build_settings(scenario=request.scenario, mode=request.mode, conf_model=_conf_model(model),
                          model_name=model.name, model_hints=model.attributes.get("settings"),
                          presets=presets, user_conf=request.user_conf, overrides=request.overrides,
                          user_conf_text=request.user_conf_text,
                          tuned=tuned.get("settings"), scenarios_root=presets_root(request),
                          tuned_where=f"tuned {tuned.get('tuning_id')} ({tuned.get('figure_name')} "
                                      f"{tuned.get('figure_value')})")


def harness_options(settings: Settings, model: ModelManifest) -> dict[str, Any]:
    from mlharness.running.settings import HARNESS_DEFAULTS

    options = {"max_batch_size": int(model.attributes.get("max_batch_size", 1)), **HARNESS_DEFAULTS}
    options.update(settings.harness)
    return options


def resolve_manifests(request: RunRequest) -> tuple[ModelManifest, str, Any, Any, Any, ReferenceLog | None]:
    """(model, backend name, dataset, hardware, software, reference) the request names; pins the
    process to the hardware manifest's CPUs first, so everything detected or started later sees it."""
    index = spec_index(request)
    model = select_model(index, request.model, request.backend)
    backend_name = request.backend or model.framework
    dataset_name = request.dataset or model.default_dataset
    if not dataset_name:
        raise UserError(f"{model.path}: dataset: no default dataset; pass --dataset")
    dataset = index.find("dataset", dataset_name)
    hardware = index.find("hardware", request.hardware)
    pin_cpus(hardware)  # first: the detected system and every thread started from here see the pinning
    software = index.find("software", request.software or backend_name)
    reference = index.find("reference", request.reference) if request.reference else \
        find_reference(index, model, dataset.name, backend_name)
    return model, backend_name, dataset, hardware, software, reference


def pin_cpus(hardware: Any) -> None:
    if not hardware.cpu_affinity or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(0, hardware.cpu_affinity)
    except OSError:
        available = sorted(os.sched_getaffinity(0))
        raise UserError(f"{hardware.path}: cpu_affinity: expected CPUs this process may use {available}, "
                        f"got {list(hardware.cpu_affinity)}") from None


def endpoint_for(request: RunRequest, model: ModelManifest) -> Any:
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


def with_tuned(request: RunRequest, model: ModelManifest, backend: str, system_name: str,
                settings: Settings) -> tuple[Settings, str | None]:
    """The settings with the tuned configuration stored for this model, system, backend and software
    (layer "tuned"), unless --no-tuned; without one, a note on how to tune (performance runs), to print
    once the run's inputs have proved good, and only the first time for this model, scenario and system
    under this results folder. Nothing to tune: the null backend with no postprocess (the harness alone,
    as the shipped null model), a run against a server (tuned on the server's side), an LLM."""
    from mlharness.running import tuned as tuning
    from mlharness.running.progress import quiet_from_env

    if not request.use_tuned or request.mode not in ("performance", "submission") or request.endpoint or \
            getattr(model, "generation", None) is not None:  # tune does not search generative models
        return settings, None  # a server's configuration is the server's: one tuned here is not applied
    key = tuning.tuning_key(model, system_name, backend, system_mod.software_versions(), request.scenario)
    found = tuning.lookup(Path(request.results_dir), key)
    if found is not None:
        return prepare_settings(request, model, found), None
    if request.scenario not in tuning.TUNABLE_SCENARIOS or request.quiet or quiet_from_env() or \
            (backend == "null" and not model.postprocess):
        return settings, None
    return settings, tuning.untuned_note(model.name, request.scenario, system_name)


def say_untuned_once(note: str | None, results_dir: Path, model: str, scenario: str, system_name: str) -> None:
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


def expect_measured_latency(settings: Settings, cold_start: dict[str, Any], scenario: str) -> None:
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


def token_mode(settings: Settings) -> None:
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
