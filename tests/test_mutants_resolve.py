"""What a run request resolves to before anything is written (mlharness.running.resolve), as mutation
testing of that module found it: the request as it crosses to the run's process, the specs and presets
it runs with, the model, reference and other manifests it names, the settings layers, the CPU pinning,
the endpoint, the tuned configuration and its note, the measured latency, token mode, and the refusals
of what cannot run here. In process, with the shipped manifests, real settings and a real results
database."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from mlharness.errors import UserError
from mlharness.running import resolve, system as system_mod, tuned as tuning
from mlharness.running.presets import shipped_scenarios
from mlharness.running.request import RunRequest
from mlharness.running.settings import HARNESS_DEFAULTS, Settings, build_settings
from mlharness.specs.index import SpecIndex, shipped_specs
from mlharness.specs.manifests import load_manifest
from mlharness.store.result_store import ResultStore
from tests.support import REPO, null_model_with, tiny_torch_model, write_manifest

INDEX = SpecIndex(REPO / "specs")


def settings_of(*overrides: str, scenario: str = "Offline", model: str = "null") -> Settings:
    return build_settings(scenario=scenario, mode="performance", conf_model=model, model_name=model,
                          overrides=list(overrides))


def hardware_with(folder: Path, line: str) -> Any:
    path = write_manifest(folder, "pinned.yaml", f"kind: hardware\nname: pinned\nversion: 1.0.0\ndevice: cpu\n{line}\n")
    return load_manifest(path, "hardware")


@pytest.fixture
def affinity_kept() -> Iterator[set[int]]:
    """The CPUs this process may use, put back after the test."""
    before = os.sched_getaffinity(0)
    yield set(before)
    os.sched_setaffinity(0, before)


# ---- resolved_for_run, spec_index, presets_root ------------------------------------------------------

def test_user_conf_is_read_into_the_request_once(tmp_path: Path) -> None:
    """Its text crosses to the run's process, not a path; text already read or a resolved request is kept as it
    is (the file, gone since, is not read again); unreadable: why, in one line."""
    resolved = RunRequest(model="null", scenario="Offline", user_conf=tmp_path / "gone.conf", resolved=True)
    assert resolve.resolved_for_run(resolved) is resolved
    conf, text = tmp_path / "user.conf", "null.Offline.target_qps = 3\n"
    conf.write_text(text)
    assert resolve.resolved_for_run(RunRequest(model="null", scenario="Offline", user_conf=conf)).user_conf_text == text
    kept = resolve.resolved_for_run(RunRequest(model="null", scenario="Offline", user_conf=tmp_path / "gone.conf",
                                               user_conf_text=text))
    assert kept.user_conf_text == text and kept.resolved
    assert resolve.resolved_for_run(RunRequest(model="null", scenario="Offline")).user_conf_text is None
    with pytest.raises(UserError) as caught:  # a folder given as user.conf
        resolve.resolved_for_run(RunRequest(model="null", scenario="Offline", user_conf=tmp_path))
    assert str(caught.value) == f"{tmp_path}: cannot read user.conf: Is a directory"


def test_resolving_takes_the_environment_where_the_request_says_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """$MLHARNESS_SPECS/SCENARIOS/HANDOFF/ISSUE fill what the request leaves unset, never what it sets."""
    for var, value in (("SPECS", str(tmp_path / "s")), ("SCENARIOS", str(tmp_path / "p")),
                       ("HANDOFF", "python"), ("ISSUE", "python")):
        monkeypatch.setenv(f"MLHARNESS_{var}", value)
    taken = resolve.resolved_for_run(RunRequest(model="null", scenario="Offline"))
    assert (taken.specs_root, taken.scenarios_root, taken.handoff, taken.issue_path, taken.resolved) == \
        (tmp_path / "s", tmp_path / "p", "python", "python", True)
    own = resolve.resolved_for_run(RunRequest(model="null", scenario="Offline", specs_root=Path("/own/s"),
                                              scenarios_root=Path("/own/p"), handoff="native", issue_path="native"))
    assert (own.specs_root, own.scenarios_root, own.handoff, own.issue_path) == \
        (Path("/own/s"), Path("/own/p"), "native", "native")


def test_the_specs_and_presets_a_request_runs_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own folders first; resolved, the shipped ones; unresolved, the environment's (or None)."""
    monkeypatch.setenv("MLHARNESS_SPECS", str(tmp_path / "env"))
    own = RunRequest(model="null", scenario="Offline", specs_root=tmp_path / "mine", scenarios_root=tmp_path / "p")
    assert resolve.spec_index(own) == SpecIndex(tmp_path / "mine") and resolve.presets_root(own) == tmp_path / "p"
    resolved = RunRequest(model="null", scenario="Offline", resolved=True)
    assert resolve.spec_index(resolved) == SpecIndex(shipped_specs())
    assert resolve.presets_root(resolved) == shipped_scenarios()
    fresh = RunRequest(model="null", scenario="Offline")
    assert resolve.spec_index(fresh) == SpecIndex(tmp_path / "env") and resolve.presets_root(fresh) is None


# ---- select_model --------------------------------------------------------------------------------

def test_a_model_is_chosen_by_backend_else_by_the_registry_s_preference() -> None:
    """minilm-l6 has an onnxruntime and a torch manifest; smollm2-135m a llama_cpp one listed first."""
    assert resolve.select_model(INDEX, "minilm-l6", "torch").path.name == "minilm-l6-torch.yaml"
    assert resolve.select_model(INDEX, "minilm-l6", "onnxruntime").path.name == "minilm-l6-onnx.yaml"
    assert resolve.select_model(INDEX, "minilm-l6", None).path.name == "minilm-l6-onnx.yaml"
    assert resolve.select_model(INDEX, "smollm2-135m", None).path.name == "smollm2-135m.yaml"  # transformers first
    assert resolve.select_model(INDEX, "smollm2-135m", "llama_cpp").path.name == "smollm2-135m-llamacpp.yaml"
    # the null backend runs any model's declared outputs: the first manifest of that name
    assert resolve.select_model(INDEX, "minilm-l6", "null").path.name == "minilm-l6-onnx.yaml"


def test_a_model_or_backend_the_specs_lack_is_refused_naming_what_they_have() -> None:
    """The backends the model has, or the model names known, so the user can pick one."""
    with pytest.raises(UserError) as caught:
        resolve.select_model(INDEX, "minilm-l6", "transformers")
    assert str(caught.value) == \
        "model 'minilm-l6' has no manifest for backend 'transformers' (have: onnxruntime, torch)"
    with pytest.raises(UserError, match=r"^no model manifest named 'nul' under .*specs \(known: .*minilm-l6, .*null"):
        resolve.select_model(INDEX, "nul", None)


def test_a_name_that_looks_like_a_file_is_taken_as_a_path(tmp_path: Path) -> None:
    """Ending in .yaml or .yml, or holding a path separator: read as a file, not looked up by name."""
    text = (REPO / "specs" / "models" / "null.yaml").read_text()
    specs = tmp_path / "specs"
    for name in ("mine.yaml", "mine.yml"):  # manifests named like files: a name may hold dots
        write_manifest(specs / "models", f"{name}.yaml", text.replace('name: "null"', f'name: "{name}"', 1))
    index = SpecIndex(specs)
    for name in ("mine.yaml", "mine.yml"):
        with pytest.raises(UserError, match=rf"^{name}: no such model manifest file$"):
            resolve.select_model(index, name, None)  # the folder (cwd) has no such file
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model").write_text(text)
    assert resolve.select_model(index, f"sub{os.sep}model", "torch").path == Path("sub", "model")


# ---- find_reference, stale_reference_notes ----------------------------------------------------------

def test_the_reference_is_the_one_of_this_model_version_dataset_and_backend(tmp_path: Path) -> None:
    """Every part of the match counts: another dataset's, backend's or model version's is not this run's."""
    onnx, torch = (resolve.select_model(INDEX, "minilm-l6", b) for b in ("onnxruntime", "torch"))
    assert resolve.find_reference(INDEX, torch, "wordsim353", "torch").name == "minilm-l6.wordsim353.torch"
    assert resolve.find_reference(INDEX, onnx, "lee", "onnxruntime").name == "minilm-l6.lee.onnxruntime"
    assert resolve.find_reference(INDEX, torch, "synthetic-images", "torch") is None
    assert resolve.find_reference(INDEX, torch, "lee", "null") is None
    text = (REPO / "specs" / "models" / "minilm-l6-torch.yaml").read_text().replace("version: 1.0.0", "version: 2.0.0")
    bumped = load_manifest(write_manifest(tmp_path, "m.yaml", text), "model")
    assert resolve.find_reference(INDEX, bumped, "lee", "torch") is None  # minilm-l6 2.0.0


def reference_pinning(folder: Path, model_sha: str, dataset_sha: str | None) -> Any:
    dataset = f", sha256: {dataset_sha}" if dataset_sha else ""
    path = write_manifest(folder, "ref.yaml", f"""\
        kind: reference
        name: pinned
        version: 1.0.0
        model: {{name: "null", version: 1.0.0, sha256: {model_sha}}}
        dataset: {{name: null-samples, version: 1.0.0{dataset}}}
        backend: "null"
        """)
    return load_manifest(path, "reference")


def test_a_reference_made_with_other_manifests_says_which_changed(tmp_path: Path) -> None:
    """Each manifest whose sha256 differs from the pinned one gets a note, model first."""
    model, dataset = INDEX.find("model", "null"), INDEX.find("dataset", "null-samples")
    ref = reference_pinning(tmp_path, "a" * 64, "b" * 64)
    assert resolve.stale_reference_notes(ref, model, dataset) == [
        f"note: the reference was made with model null@1.0.0 sha256 aaaaaaaaaaaa…, this run used sha256 "
        f"{model.sha256[:12]}… (the manifest changed since)",
        f"note: the reference was made with dataset null-samples@1.0.0 sha256 bbbbbbbbbbbb…, this run used sha256 "
        f"{dataset.sha256[:12]}… (the manifest changed since)"]
    assert resolve.stale_reference_notes(reference_pinning(tmp_path, model.sha256, None), model, dataset) == []


# ---- prepare_settings, harness_options -------------------------------------------------------------

def test_the_settings_layers_a_request_and_its_tuned_configuration_give(tmp_path: Path) -> None:
    """The model's figures, tuned, --quick, presets, user.conf and --set, each where it came from."""
    (tmp_path / "mine.yaml").write_text("settings:\n  Server: {min_query_count: 9}\n")
    (tmp_path / "quick.yaml").write_text((shipped_scenarios() / "quick.yaml").read_text())
    conf = tmp_path / "user.conf"
    request = RunRequest(model="mobilenet-v2", scenario="Server", quick=True, presets=("mine",), user_conf=conf,
                         user_conf_text="mobilenet.Server.target_qps = 7\n", overrides=("workers=3",),
                         scenarios_root=tmp_path)
    model = resolve.select_model(INDEX, "mobilenet-v2", "onnxruntime")
    tuned = {"settings": {"batch_wait_ms": 2}, "tuning_id": "t1", "figure_name": "qps", "figure_value": 12.5}
    settings = resolve.prepare_settings(request, model, tuned)
    assert (settings.scenario, settings.mode, settings.conf_model) == ("Server", "performance", "mobilenet")
    assert settings.layers == ["model", "tuned", "preset:quick", "preset:mine", "user.conf", "cli"]
    assert settings.loadgen["min_query_count"] == "9" and settings.loadgen["target_qps"] == "7"
    assert settings.where["target_qps"] == f"{conf}: line 1" and settings.harness["workers"] == 3
    assert settings.where["batch_wait_ms"] == "tuned t1 (qps 12.5)"
    assert settings.where["target_latency"] == "model mobilenet-v2: attributes.settings: Server"


def test_without_a_tuned_configuration_or_benchmark_name_the_model_s_name_scopes_user_conf() -> None:
    """No tuned layer; user.conf lines for the model's own name apply (no mlperf_benchmark to use)."""
    request = RunRequest(model="null", scenario="Server", mode="accuracy", user_conf=Path("u.conf"),
                         user_conf_text="null.Server.target_qps = 5\n")
    settings = resolve.prepare_settings(request, INDEX.find("model", "null"))
    assert (settings.conf_model, settings.mode, settings.loadgen["target_qps"]) == ("null", "accuracy", "5")
    assert settings.layers == ["model", "user.conf"] and settings.origin["target_latency"] == "model"


def test_harness_options_start_from_the_model_s_batch_and_the_defaults(tmp_path: Path) -> None:
    """max_batch_size from the manifest (1 without one), the harness defaults, then the settings."""
    null = INDEX.find("model", "null")
    assert resolve.harness_options(settings_of("workers=3"), null) == {"max_batch_size": 1024, **HARNESS_DEFAULTS,
                                                                       "workers": 3}
    text = (REPO / "specs" / "models" / "null.yaml").read_text().replace("  max_batch_size: 1024\n", "")
    unbatched = load_manifest(write_manifest(tmp_path, "m.yaml", text), "model")
    assert resolve.harness_options(settings_of(), unbatched) == {"max_batch_size": 1, **HARNESS_DEFAULTS}


# ---- resolve_manifests, pin_cpus ------------------------------------------------------------------

def test_a_request_names_its_manifests_else_the_model_s_defaults_are_used() -> None:
    """Backend, dataset, software and reference follow the model unless the request names them."""
    model, backend, dataset, hardware, software, reference = resolve.resolve_manifests(
        RunRequest(model="null", scenario="Offline", specs_root=REPO / "specs"))
    assert (model.name, backend, dataset.name, hardware.name, software.name, reference) == \
        ("null", "null", "null-samples", "cpu", "null", None)
    specs = REPO / "specs"  # what the request names wins over the model's defaults
    found = resolve.resolve_manifests(RunRequest(model="minilm-l6", scenario="Offline", backend="torch",
                                                 dataset="lee", specs_root=specs))
    assert [found[0].path.name, found[1], found[2].name, found[4].name, found[5].name] == \
        ["minilm-l6-torch.yaml", "torch", "lee", "torch", "minilm-l6.lee.torch"]
    named = resolve.resolve_manifests(RunRequest(model="minilm-l6", scenario="Offline", hardware="cuda0",
                                                 software="onnxruntime-gpu", reference="minilm-l6.lee.torch",
                                                 specs_root=specs))
    assert [named[1], named[2].name, named[3].name, named[4].name, named[5].name] == \
        ["onnxruntime", "wordsim353", "cuda0", "onnxruntime-gpu", "minilm-l6.lee.torch"]


def test_each_manifest_is_looked_up_among_its_own_kind(specs_copy: Path) -> None:
    """A dataset, hardware and reference named "null", as the null model and software are: no ambiguity."""
    write_manifest(specs_copy / "hardware", "h.yaml", 'kind: hardware\nname: "null"\nversion: 1.0.0\ndevice: cpu\n')
    write_manifest(specs_copy / "datasets", "d.yaml", (specs_copy / "datasets" / "null-samples.yaml").read_text()
                   .replace("name: null-samples", 'name: "null"', 1))
    reference = reference_pinning(specs_copy.parent, "a" * 64, None).path.read_text()
    write_manifest(specs_copy / "references", "r.yaml", reference.replace("name: pinned", 'name: "null"', 1))
    found = resolve.resolve_manifests(RunRequest(model="null", scenario="Offline", dataset="null", hardware="null",
                                                 reference="null"))
    assert [(m.kind, m.name) for m in (found[0], *found[2:])] == [("model", "null"), ("dataset", "null"),
                                                                  ("hardware", "null"), ("software", "null"),
                                                                  ("reference", "null")]


def test_a_model_without_a_default_dataset_asks_for_one(specs_copy: Path) -> None:
    """No dataset: in the manifest and no --dataset: the refusal names the manifest and the flag."""
    text = (specs_copy / "models" / "null.yaml").read_text().replace("dataset: null-samples\n", "")
    path = write_manifest(specs_copy / "models", "null.yaml", text)
    with pytest.raises(UserError) as caught:
        resolve.resolve_manifests(RunRequest(model="null", scenario="Offline"))
    assert str(caught.value) == f"{path}: dataset: no default dataset; pass --dataset"


def test_the_hardware_manifest_s_cpus_are_pinned_while_resolving(specs_copy: Path,
                                                                 affinity_kept: set[int]) -> None:
    """cpu_affinity is applied before anything starts, so every later thread runs on those CPUs; none, none."""
    resolve.pin_cpus(hardware_with(specs_copy.parent, ""))
    assert os.sched_getaffinity(0) == affinity_kept
    one = max(affinity_kept)
    write_manifest(specs_copy / "hardware", "pinned.yaml",
                   f"kind: hardware\nname: pinned\nversion: 1.0.0\ndevice: cpu\ncpu_affinity: [{one}]\n")
    hardware = resolve.resolve_manifests(RunRequest(model="null", scenario="Offline", hardware="pinned"))[3]
    assert hardware.name == "pinned"
    assert os.sched_getaffinity(0) == {one}


def test_cpus_this_process_may_not_use_are_refused_naming_the_ones_it_may(tmp_path: Path,
                                                                         affinity_kept: set[int]) -> None:
    """A CPU that is not there: the manifest, the CPUs available and the ones asked for, in one line."""
    missing = max(os.cpu_count() or 1, max(affinity_kept)) + 512
    hardware = hardware_with(tmp_path, f"cpu_affinity: [{missing}]")
    with pytest.raises(UserError) as caught:
        resolve.pin_cpus(hardware)
    assert str(caught.value) == (f"{hardware.path}: cpu_affinity: expected CPUs this process may use "
                                 f"{sorted(affinity_kept)}, got [{missing}]")
    assert os.sched_getaffinity(0) == affinity_kept


# ---- endpoint_for -------------------------------------------------------------------------------

def test_an_endpoint_must_speak_the_model_s_protocol() -> None:
    """None: this process; a tensor model takes a grpc:// server, a generative one openai+http://, not the other."""
    assert resolve.endpoint_for(RunRequest(model="null", scenario="Offline"), INDEX.find("model", "null")) is None
    tensor = resolve.endpoint_for(RunRequest(model="null", scenario="Offline", endpoint="grpc://h:8001"),
                                  INDEX.find("model", "null"))
    assert (tensor.protocol, tensor.host, tensor.port) == ("grpc", "h", 8001)
    llm = resolve.select_model(INDEX, "smollm2-135m", "transformers")
    generative = resolve.endpoint_for(RunRequest(model="smollm2-135m", scenario="Offline",
                                                 endpoint="openai+http://h:8000/v1"), llm)
    assert (generative.protocol, generative.port) == ("openai", 8000)
    request = RunRequest(model="smollm2-135m", scenario="Offline", endpoint="grpc://h:8001")
    with pytest.raises(UserError) as caught:
        resolve.endpoint_for(request, llm)
    assert str(caught.value) == (f"--endpoint: {llm.path}: a generative model; give an OpenAI-compatible server as "
                                 f"openai+http://HOST:PORT/v1, not {request.endpoint}")
    null = INDEX.find("model", "null")
    with pytest.raises(UserError) as caught:
        resolve.endpoint_for(RunRequest(model="null", scenario="Offline", endpoint="openai+http://h:8000/v1"), null)
    assert str(caught.value) == (f"--endpoint: {null.path}: not a generative model; an OpenAI-compatible server takes "
                                 "generative ones (a tensor model's server: grpc:// or http://)")


# ---- with_tuned, say_untuned_once -------------------------------------------------------------------

SYSTEM = "box_2c"


def store_tuned(results: Path, model: Any, backend: str, scenario: str, settings: dict[str, Any]) -> None:
    key = tuning.tuning_key(model, SYSTEM, backend, system_mod.software_versions(), scenario)
    with ResultStore(results / "mlharness.sqlite") as store:
        store.put_tuned(key, settings, "offline.samples_per_second", 88.5, [], "tune-1", "2026-01-01T00:00:00")


def tuned_for(request: RunRequest, model: Any, backend: str) -> tuple[Settings, str | None]:
    return resolve.with_tuned(request, model, backend, SYSTEM, resolve.prepare_settings(request, model))


def test_a_stored_tuned_configuration_is_run_with_unless_told_not_to(tmp_path: Path) -> None:
    """Stored by `mlharness tune` for this model, system, backend and scenario: a layer of performance and
    submission runs; --no-tuned, accuracy runs, another backend's and a run against a server keep the
    settings, with no note."""
    null = INDEX.find("model", "null")
    store_tuned(tmp_path, null, "null", "Offline", {"workers": 2})
    for mode in ("performance", "submission"):
        settings, note = tuned_for(RunRequest(model="null", scenario="Offline", mode=mode, results_dir=tmp_path),
                                   null, "null")
        assert note is None and settings.layers == ["model", "tuned"] and settings.harness["workers"] == 2
        assert settings.where["workers"] == "tuned tune-1 (offline.samples_per_second 88.5)"
    # a run against a server: tuned on the server's side, not with what was tuned here
    for change, backend in (({"use_tuned": False}, "null"), ({"mode": "accuracy"}, "null"), ({}, "torch"),
                            ({"endpoint": "grpc://h:8001"}, "null")):
        request = RunRequest(model="null", scenario="Offline", results_dir=tmp_path, **change)
        settings = resolve.prepare_settings(request, null)
        assert resolve.with_tuned(request, null, backend, SYSTEM, settings) == (settings, None)


def test_an_untuned_model_gets_a_note_on_how_to_tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with something to tune and no stored configuration: the note names model, scenario, system."""
    monkeypatch.delenv("MLHARNESS_PROGRESS")
    model = load_manifest(write_manifest(tmp_path, "tiny.yaml", tiny_torch_model()), "model")
    request = RunRequest(model="tiny-cnn", scenario="SingleStream", results_dir=tmp_path)
    settings, note = tuned_for(request, model, "torch")
    assert settings.layers == ["model"] and note == tuning.untuned_note("tiny-cnn", "SingleStream", SYSTEM)
    assert "tiny-cnn is untuned for SingleStream on this system (box_2c)" in note
    # the null backend with a postprocess of the model's own has something to tune
    post = "def postprocess(outputs, ctx):\n    return outputs['scores']\n"
    with_post = load_manifest(null_model_with(tmp_path, postprocess=post))
    assert tuned_for(RunRequest(model="null", scenario="Offline", results_dir=tmp_path), with_post, "null")[1] \
        == tuning.untuned_note("null", "Offline", SYSTEM)


@pytest.mark.parametrize("why", ["quiet", "progress off", "null backend", "endpoint", "generative"])
def test_no_untuned_note_where_it_is_not_wanted_or_nothing_can_be_tuned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """--quiet, MLHARNESS_PROGRESS=off, the harness alone, a server's run, an LLM: no note."""
    if why != "progress off":
        monkeypatch.delenv("MLHARNESS_PROGRESS")
    model, backend = load_manifest(write_manifest(tmp_path, "tiny.yaml", tiny_torch_model()), "model"), "torch"
    fields: dict[str, Any] = {"quiet": why == "quiet"}
    if why == "null backend":
        model, backend = INDEX.find("model", "null"), "null"
    elif why == "endpoint":
        fields["endpoint"] = "grpc://h:8001"
    elif why == "generative":
        model, backend = resolve.select_model(INDEX, "smollm2-135m", "transformers"), "transformers"
    request = RunRequest(model=model.name, scenario="Offline", results_dir=tmp_path, **fields)
    settings = resolve.prepare_settings(request, model)
    assert resolve.with_tuned(request, model, backend, SYSTEM, settings) == (settings, None)


def test_the_untuned_note_is_said_once_per_model_scenario_and_system(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Advice, not news: said on stderr the first time under a results folder, remembered there if it can be."""
    (tmp_path / "untuned-notes.txt").write_text("old\tOffline\tbox\n")
    resolve.say_untuned_once("note: tune it", tmp_path, "m", "Offline", "box")
    resolve.say_untuned_once("note: tune it", tmp_path, "m", "Offline", "box")
    assert capsys.readouterr() == ("", "note: tune it\n")
    assert (tmp_path / "untuned-notes.txt").read_text() == "old\tOffline\tbox\nm\tOffline\tbox\n"
    for other in (("m2", "Offline", "box"), ("m", "Server", "box"), ("m", "Offline", "box2")):
        resolve.say_untuned_once("note: again", tmp_path, *other)
        assert capsys.readouterr().err == "note: again\n"
    resolve.say_untuned_once(None, tmp_path, "m3", "Offline", "box")
    assert capsys.readouterr() == ("", "") and "m3" not in (tmp_path / "untuned-notes.txt").read_text()
    # a results folder not there (nothing to read, nowhere to write): the note, and no error
    resolve.say_untuned_once("note: tune it", tmp_path / "absent", "m", "Offline", "box")
    assert capsys.readouterr().err == "note: tune it\n" and not (tmp_path / "absent").exists()


# ---- expect_measured_latency, token_mode ------------------------------------------------------------

def latency_settings(origin: str | None = "model", hint: float = 10, layers: tuple[str, ...] = ("model",),
                     **loadgen: Any) -> Settings:
    settings = Settings("SingleStream", "PerformanceOnly", "null", layers=list(layers))
    if origin is not None:
        settings.set("target_latency", hint, origin, origin)
    for key, value in loadgen.items():
        settings.set(key, value, "model", "model")
    return settings


def warm(fastest_s: float, batch: int = 2, queries: int = 10, samples: int = 20) -> dict[str, Any]:
    return {"warmup": {"queries": queries, "samples": samples, "batch_size": batch, "fastest_query_seconds": fastest_s}}


def test_a_faster_warm_up_halves_its_fastest_query_per_sample_as_the_expectation() -> None:
    """8 ms for a batch of 2 is 4 ms a query, under half the model's 10 ms: expect 2 ms (layer measured); a
    MultiStream query holds samples_per_query samples."""
    settings = latency_settings()
    resolve.expect_measured_latency(settings, warm(0.008), "SingleStream")
    assert (settings.loadgen["target_latency"], settings.origin["target_latency"]) == ("2", "measured")
    assert settings.where["target_latency"] == "the warm-up's fastest query of 10 (4 ms a query)"
    assert settings.layers == ["model", "measured"]
    # a MultiStream query holds samples_per_query samples (8 unless set)
    default, two = latency_settings(), latency_settings(samples_per_query=2)
    resolve.expect_measured_latency(default, warm(0.001), "MultiStream")  # 0.5 ms a sample
    resolve.expect_measured_latency(two, warm(0.001), "MultiStream")
    assert (default.loadgen["target_latency"], two.loadgen["target_latency"]) == ("2", "0.5")


def test_without_an_expected_latency_the_warm_up_sets_one_at_least_a_microsecond() -> None:
    """No figure at all: half the measured query, never below LoadGen's 0.001 ms; measured listed once."""
    settings = latency_settings(origin=None, layers=("measured",))
    resolve.expect_measured_latency(settings, warm(1e-7, batch=1), "SingleStream")
    assert (settings.loadgen["target_latency"], settings.layers) == ("0.001", ["measured"])


@pytest.mark.parametrize("scenario, origin, cold_start", [
    ("Offline", "model", warm(0.001)), ("Server", "model", warm(0.001)), ("SingleStream", "cli", warm(0.001)),
    ("SingleStream", "user.conf", warm(0.001)), ("SingleStream", "model", {}),
    ("SingleStream", "model", warm(0.001, queries=0)), ("SingleStream", "model", warm(0.001, samples=0)),
    ("SingleStream", "model", warm(0.01))])  # 5 ms a query: exactly half of 10 ms is not under half
def test_the_expectation_is_kept_where_the_user_set_it_or_the_warm_up_does_not_beat_it(
        scenario: str, origin: str, cold_start: dict[str, Any]) -> None:
    """Offline and Server pre-generate no queries; a user's figure stands; no warm-up or not twice as fast: kept."""
    settings = latency_settings(origin=origin)
    resolve.expect_measured_latency(settings, cold_start, scenario)
    assert (settings.loadgen["target_latency"], settings.origin["target_latency"], settings.layers) == \
        ("10", origin, ["model"])


def test_a_generative_model_runs_in_token_mode() -> None:
    """use_token_latencies=1 from layer generative, unless already on; the layer listed once."""
    settings = settings_of("use_token_latencies=0")
    resolve.token_mode(settings)
    assert (settings.loadgen["use_token_latencies"], settings.origin["use_token_latencies"]) == ("1", "generative")
    assert settings.where["use_token_latencies"] == "a generative model (LoadGen's token mode)"
    assert settings.layers == ["cli", "generative"]
    resolve.token_mode(settings)
    assert settings.layers == ["cli", "generative"]
    on = settings_of("use_token_latencies=1")
    resolve.token_mode(on)
    assert (on.origin["use_token_latencies"], on.layers) == ("cli", ["cli"])
    listed = Settings("Offline", "PerformanceOnly", "m", layers=["generative"])
    resolve.token_mode(listed)
    assert listed.layers == ["generative"] and listed.loadgen == {"use_token_latencies": "1"}


# ---- check_device, check_generative_settings, check_cuda_graphs -------------------------------------

def test_a_device_the_backend_cannot_use_is_refused_naming_the_hardware_manifest() -> None:
    """The null backend runs on the CPU only: cuda0 is refused before anything is written."""
    resolve.check_device("null", INDEX.find("hardware", "cpu"))
    cuda = INDEX.find("hardware", "cuda0")
    with pytest.raises(UserError) as caught:
        resolve.check_device("null", cuda)
    assert str(caught.value) == f"{cuda.path}: device: the null backend runs on cpu only, got cuda:0"


def test_llm_batching_for_a_tensor_model_is_refused_naming_where_it_was_set() -> None:
    """It would be ignored: the value, where it came from, the model; a generative model takes it."""
    null = INDEX.find("model", "null")
    resolve.check_generative_settings(settings_of(), null)
    resolve.check_generative_settings(settings_of("llm_batching=static"),
                                      resolve.select_model(INDEX, "smollm2-135m", "transformers"))
    with pytest.raises(UserError) as caught:
        resolve.check_generative_settings(settings_of("llm_batching=static"), null)
    assert str(caught.value) == (f"llm_batching=static (--set llm_batching=static): {null.path}: model null is not "
                                 "generative (no generation: section); llm_batching schedules a generative model's "
                                 "token generation")
    unplaced = Settings("Offline", "PerformanceOnly", "null", harness={"llm_batching": "static"},
                        origin={"llm_batching": "cli"})  # a setting recorded without its place
    with pytest.raises(UserError, match=r"^llm_batching=static \(\?\): "):
        resolve.check_generative_settings(unplaced, null)


def test_cuda_graphs_where_they_cannot_apply_are_refused_naming_the_cause(tmp_path: Path) -> None:
    """Only torch captures them (the backend and the layer that asked named), on a cuda device, with fixed
    shapes (the manifest at fault named); off, nothing is asked."""
    for off in (settings_of(), settings_of("cuda_graphs=false")):
        resolve.check_cuda_graphs(off, "null", INDEX.find("hardware", "cpu"), INDEX.find("model", "null"))
    with pytest.raises(UserError) as caught:
        resolve.check_cuda_graphs(settings_of("cuda_graphs=true"), "onnxruntime", INDEX.find("hardware", "cpu"),
                                  INDEX.find("model", "null"))
    assert str(caught.value) == ("cuda_graphs: only the torch backend captures CUDA graphs, this run's backend is "
                                 "onnxruntime (set by cli)")
    unplaced = Settings("Offline", "PerformanceOnly", "null", harness={"cuda_graphs": True})
    with pytest.raises(UserError, match=r"backend is null \(set by \?\)$"):
        resolve.check_cuda_graphs(unplaced, "null", INDEX.find("hardware", "cpu"), INDEX.find("model", "null"))
    # where graphs cannot apply: a CPU device blames the hardware manifest, symbolic input dims the model's
    cpu, cuda = INDEX.find("hardware", "cpu"), INDEX.find("hardware", "cuda0")
    tiny = load_manifest(write_manifest(tmp_path, "tiny.yaml", tiny_torch_model()), "model")
    on = settings_of("cuda_graphs=true")
    with pytest.raises(UserError) as caught:
        resolve.check_cuda_graphs(on, "torch", cpu, tiny)
    assert str(caught.value) == \
        f"{cpu.path}: cuda_graphs: CUDA graphs need a cuda:N device, the hardware manifest has cpu"
    minilm = resolve.select_model(INDEX, "minilm-l6", "torch")
    with pytest.raises(UserError) as caught:
        resolve.check_cuda_graphs(on, "torch", cuda, minilm)
    assert str(caught.value) == (f"{minilm.path}: cuda_graphs: input 'input_ids' has symbolic dims ['sequence']; "
                                 "CUDA graphs replay fixed shapes only")
    resolve.check_cuda_graphs(on, "torch", cuda, tiny)  # fixed shapes on a cuda device: captured
