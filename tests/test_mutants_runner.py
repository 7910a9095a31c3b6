"""The runner's own steps (mlharness.running.runner), each seen in the record and the folder of a real
run in this process: the null model's runs take well under a second, so every test runs its own.
Written for the mutants of runner.py that the CLI's whole runs left alive (issue 38, step 6)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from mlharness.errors import RunFailed, UserError
from mlharness.records import results
from mlharness.records.run_record import RunRecord
from mlharness.running import runner
from mlharness.running.arguments import command_line
from mlharness.running.request import RunRequest
from mlharness.running.resolve import prepare_settings, resolve_manifests, resolved_for_run
from mlharness.running import system as system_mod, tuned as tuning
from mlharness.running.run_child import RunGuard
from mlharness.store.result_store import ResultStore
from tests.network_support import mlharness_serve
from tests.support import answer_of_child, failing_null_model, null_model_with, sleeping_postprocess, write_manifest
from tests.fake_openai import fake_openai

# A bound on a run here (each takes well under a second): a run that hangs fails its test, not the suite.
CHILD_SECONDS = 120
WARMUP = "the first inference and warm-up (user code and the backend, before LoadGen)"


class RecordingGuard(RunGuard):
    """The run's real guard (no parent, no workdir) that also keeps what it was asked to watch and
    whether it was given the SUT."""

    def __init__(self) -> None:
        super().__init__(None)
        self.watched: list[tuple[float | None, str]] = []
        self.given_sut = False

    def watch(self, timeout: float | None, what: str) -> Callable[[], None]:
        self.watched.append((timeout, what))
        return super().watch(timeout, what)

    def attach_sut(self, sut: Any) -> None:
        self.given_sut = hasattr(sut, "completed_samples")
        super().attach_sut(sut)


def _run_and_send(request: RunRequest, environment: dict[str, str], cwd: str, pipe: Any) -> None:
    # The fork server's own environment is the one it started with: this test's is set here.
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    guard = RecordingGuard()
    said = io.StringIO()  # what the run says on stderr (its notes), sent back and still shown
    try:
        with contextlib.redirect_stderr(said):
            outcome: dict[str, Any] = {"record": runner.run_here(request, guard).to_dict()}
    except RunFailed as exc:
        outcome = {"failed": str(exc), "failed_record": exc.record.to_dict()}
    except UserError as exc:  # refused before anything was staged
        outcome = {"refused": str(exc)}
    except BaseException as exc:  # a bug: said in the test's failure, not left for the bound
        outcome = {"raised": f"{type(exc).__name__}: {exc}"}
    sys.stderr.write(said.getvalue())
    pipe.send(outcome | {"watched": guard.watched, "given_sut": guard.given_sut, "stderr": said.getvalue()})


def run(tmp_path: Path, model: str = "null", *, seen: dict[str, Any] | None = None, **fields: Any) -> RunRecord:
    """One run as the launcher's child runs it, in a process of its own (LoadGen takes one configuration a
    process), forked from a fork server (not from this process: after a torch test GNU OpenMP's thread pool
    would be missing in the fork, and llama.cpp's first parallel region would wait for it for ever). The
    child imports the harness itself, from this process's sys.path (a module the server preloaded would
    come from the server's own path: the installed harness, not a mutation run's copy). Its published record. RunFailed when it failed,
    UserError when it was refused; `seen` receives what the guard was asked and what
    the run said on stderr."""
    request = RunRequest(model=model, scenario=fields.pop("scenario", "Offline"), quick=True,
                         results_dir=fields.pop("results_dir", tmp_path / "results"), **fields)
    outcome = answer_of_child("forkserver", _run_and_send, request, dict(os.environ), os.getcwd(),
                              seconds=CHILD_SECONDS)
    if seen is not None:
        seen.update(watched=outcome["watched"], given_sut=outcome["given_sut"], stderr=outcome["stderr"])
    assert "raised" not in outcome, outcome.get("raised")
    if "refused" in outcome:
        raise UserError(outcome["refused"])
    if "failed" in outcome:
        raise RunFailed(outcome["failed"], RunRecord.from_dict(outcome["failed_record"]))
    return RunRecord.from_dict(outcome["record"])


def failed_record(results_dir: Path, model: str, scenario: str = "Offline") -> dict[str, Any]:
    (path,) = results_dir.glob(f"*/{model}/{scenario}/failed-*/run.json")
    return json.loads(path.read_text())


# -- a performance run: its record and folder ---------------------------------------------------------------

def test_a_performance_run_records_what_ran_and_how_it_was_served(tmp_path: Path) -> None:
    """The record names the model, dataset, hardware, software, scenario and mode; its performance is the
    test's summary with the wall time added; its LoadGen section the kept logs, no errors and the SUT's facts."""
    record = run(tmp_path, "null-routed")
    assert record.status == "ok" and (record.scenario, record.mode) == ("Offline", "performance")
    assert (record.model["name"], record.dataset["name"], record.hardware["name"], record.software["manifest"]["name"]) == \
        ("null-routed", "null-routed-samples", "cpu", "null")
    assert record.backend == "null" and record.reference is None and record.accuracy is None
    assert set(record.software["checked"]) == {"numpy", "mlcommons-loadgen"}  # the software manifest, checked
    assert set(record.loadgen) == {"performance"}
    performance = record.loadgen["performance"]
    assert "mlperf_log_summary.txt" in performance["logs"] and performance["errors"] == []
    assert performance["sut"]["batch_wait_ms"] == 0.0 and performance["sut"]["served_on"] == "workers"
    assert record.performance["scenario"] == "Offline" and record.performance["wall_seconds"] > 0
    assert "summary" not in performance


def test_the_run_folder_holds_user_conf_measurements_readme_and_the_test_logs(tmp_path: Path) -> None:
    """user.conf is the settings' own text; measurements.json and README.md are the model's; the
    performance test's logs are under performance/run_1, without an empty accuracy log."""
    record = run(tmp_path)
    folder = Path(record.results_path)
    request = resolved_for_run(RunRequest(model="null", scenario="Offline", quick=True, results_dir=tmp_path / "results"))
    model = resolve_manifests(request)[0]
    assert (folder / "user.conf").read_text() == prepare_settings(request, model).user_conf_text()
    assert json.loads((folder / "measurements.json").read_text()) == results.measurements(model, "null")
    assert (folder / "README.md").read_text() == results.readme(model, "Offline", record.command)
    assert (folder / "performance" / "run_1" / "mlperf_log_summary.txt").is_file()
    assert not (folder / "performance" / "run_1" / "mlperf_log_accuracy.json").exists()
    assert not (folder / "accuracy").exists()


def test_the_settings_recorded_are_the_runs_own(tmp_path: Path) -> None:
    """run.json's settings are the request's settings as built (no tuned or measured layer for an Offline
    null run), with the options given on the command line."""
    record = run(tmp_path, overrides=("target_qps=123456",))
    request = resolved_for_run(RunRequest(model="null", scenario="Offline", quick=True, overrides=("target_qps=123456",),
                                          results_dir=tmp_path / "results"))
    assert record.settings == prepare_settings(request, resolve_manifests(request)[0]).as_record()
    assert record.settings["loadgen"]["target_qps"] == "123456"


def test_the_command_is_the_requests_or_the_one_that_makes_it(tmp_path: Path) -> None:
    """A request that carries its command line records it; one without records the command that makes it."""
    given = run(tmp_path, command="mlharness run null --scenario Offline --quick")
    assert given.command == "mlharness run null --scenario Offline --quick"
    made = run(tmp_path, results_dir=tmp_path / "made")
    request = RunRequest(model="null", scenario="Offline", quick=True, results_dir=tmp_path / "made")
    assert made.command == command_line(request) and "null" in made.command


def test_the_systems_description_is_written_beside_its_results(tmp_path: Path) -> None:
    """<results>/<system>.json describes the system the run ran on: what was detected, the hardware
    manifest, its device and the software versions of the record."""
    record = run(tmp_path)
    system = json.loads((tmp_path / "results" / f"{record.system_name}.json").read_text())
    assert system["system_name"] == record.system_name and system["detected"] == record.system
    assert system["hardware_manifest"]["name"] == "cpu" and system["device"] == "cpu"
    assert system["software"] == record.software["versions"]


@pytest.mark.parametrize(("model", "backend", "refusal"), [
    ("null", "null", "cuda_graphs: only the torch backend captures CUDA graphs, this run's backend is null (set by cli)"),
    ("mobilenet-v2", "torch", "cpu.yaml: cuda_graphs: CUDA graphs need a cuda:N device, the hardware manifest has cpu")])
def test_cuda_graphs_where_they_cannot_apply_are_refused_before_anything_is_written(
        tmp_path: Path, model: str, backend: str, refusal: str) -> None:
    """cuda_graphs on a backend other than torch, or on a CPU, is refused naming why; no run folder is made."""
    with pytest.raises(UserError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        run(tmp_path, model, backend=backend, overrides=("cuda_graphs=1",))
    assert not (tmp_path / "results").exists()


# -- the warm-up and the guard -------------------------------------------------------------------------------

def test_the_warm_up_is_watched_for_load_timeout_plus_warmup_seconds(tmp_path: Path) -> None:
    """The first inference and the warm-up run under the guard's watch, for load_timeout + warmup_seconds;
    the SUT that serves the test is given to the guard."""
    seen: dict[str, Any] = {}
    run(tmp_path, seen=seen, overrides=("load_timeout=7", "warmup_seconds=0.25"))
    assert seen["watched"][0] == (7.25, WARMUP) and seen["given_sut"]


@pytest.mark.parametrize(("scenario", "batch"), [("SingleStream", 1), ("Offline", 1024), ("Server", 1024)])
def test_the_warm_up_runs_the_requested_queries_at_the_scenarios_batch(tmp_path: Path, scenario: str, batch: int) -> None:
    """SingleStream sends one sample a query, so it warms up at batch 1; the others at max_batch_size; the
    record's cold start keeps both the build's phases and the warm-up's."""
    record = run(tmp_path, scenario=scenario, overrides=("warmup_queries=3",))
    warmup = record.cold_start["warmup"]
    assert (warmup["queries"], warmup["batch_size"]) == (3, batch)
    assert warmup["samples"] == 3 * batch
    assert {"load_seconds", "first_inference_seconds", "peak_rss_bytes"} <= set(record.cold_start)


def test_a_tuned_configuration_stored_for_this_system_is_run_with(tmp_path: Path) -> None:
    """What `mlharness tune` stored for this model, system, backend and scenario is the run's layer `tuned`."""
    request = resolved_for_run(RunRequest(model="null", scenario="Offline", results_dir=tmp_path / "results"))
    model = resolve_manifests(request)[0]
    system = system_mod.system_name(system_mod.detect_system(), "cpu")
    key = tuning.tuning_key(model, system, "null", system_mod.software_versions(), "Offline")
    (tmp_path / "results").mkdir()
    with ResultStore(tmp_path / "results" / "mlharness.sqlite") as store:
        store.put_tuned(key, {"workers": 3}, "offline.samples_per_second", 1.0, [], "tune-1", "2026-01-01T00:00:00")
    record = run(tmp_path)
    assert "tuned" in record.settings["layers"] and record.settings["harness"]["workers"] == 3


def test_an_untuned_run_says_so_once_for_its_results_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tunable model (a null model with a postprocess: its speed is the user's code's) run untuned on
    Offline: a note naming `mlharness tune`, once: the results folder keeps that it was said."""
    monkeypatch.setenv("MLHARNESS_PROGRESS", "on")  # the note is quiet where the progress display is
    model = null_model_with(tmp_path / "models", postprocess=sleeping_postprocess(0.0), name="slow")
    first: dict[str, Any] = {}
    run(tmp_path, str(model), seen=first)
    assert first["stderr"].count("note: slow is untuned for Offline on this system (") == 1, first["stderr"]
    system = system_mod.system_name(system_mod.detect_system(), "cpu")
    assert (tmp_path / "results" / "untuned-notes.txt").read_text() == f"slow\tOffline\t{system}\n"
    again: dict[str, Any] = {}
    run(tmp_path, str(model), seen=again)
    assert "untuned" not in again["stderr"]


def test_a_fast_warm_up_sets_the_single_stream_expectation_it_measured(tmp_path: Path) -> None:
    """A model that expects a second a query, whose warm-up answers in microseconds: the run's SingleStream
    expectation is what the warm-up measured (layer `measured`), not the manifest's."""
    manifest = null_model_with(tmp_path / "models", name="slow-on-paper")
    manifest.write_text(manifest.read_text().replace("SingleStream: {target_latency: 0.002}",
                                                     "SingleStream: {target_latency: 1000}"))
    record = run(tmp_path, str(manifest), scenario="SingleStream")
    assert "measured" in record.settings["layers"]
    assert float(record.settings["loadgen"]["target_latency"]) < 500


# -- accuracy and submission ---------------------------------------------------------------------------------

def reference_for_null_routed(folder: Path, *, model_sha: str | None = None, dataset_sha: str | None = None) -> Path:
    """A reference log of null-routed (top-1 exactly 1 by construction; sample 3's scores one-hot at 3),
    optionally pinned to manifest digests."""
    def pinned(sha: str | None) -> str:
        return f", sha256: {sha}" if sha else ""
    return write_manifest(folder, "reference.yaml", f"""\
        kind: reference
        name: null-routed.samples.null
        version: 1.0.0
        model: {{name: null-routed, version: 1.0.0{pinned(model_sha)}}}
        dataset: {{name: null-routed-samples, version: 1.0.0{pinned(dataset_sha)}}}
        backend: "null"
        accuracy:
          top1: {{expected: 1.0, tolerance: 0}}
        outputs:
          - {{sample: 3, values: [0, 0, 0, 1, 0], atol: 0}}
        """)


def test_an_accuracy_run_scores_its_log_and_writes_accuracy_txt(tmp_path: Path) -> None:
    """Accuracy mode runs the accuracy test alone: its summary sits in the LoadGen section, the score in the
    record and in accuracy/accuracy.txt, and there is no performance figure."""
    record = run(tmp_path, "null-routed", mode="accuracy")
    assert set(record.loadgen) == {"accuracy"} and record.loadgen["accuracy"]["summary"]["wall_seconds"] > 0
    assert not record.performance
    assert record.accuracy["metric"] == "topk" and record.accuracy["values"]["top1"] == 1.0
    assert record.accuracy["headline"] == "accuracy=100.000%, good=1024, total=1024"
    folder = Path(record.results_path) / "accuracy"
    assert (folder / "mlperf_log_accuracy.json").stat().st_size > 0
    assert record.accuracy["headline"] in (folder / "accuracy.txt").read_text()


def test_a_submission_run_runs_the_accuracy_test_then_the_performance_test(tmp_path: Path) -> None:
    """Submission mode: both tests, each in its folder; the accuracy test's summary stays in its LoadGen
    section and the performance test's is the record's performance."""
    record = run(tmp_path, "null-routed", mode="submission")
    assert set(record.loadgen) == {"accuracy", "performance"}
    assert record.loadgen["accuracy"]["summary"]["mode"] != record.performance["mode"]
    assert record.performance["scenario"] == "Offline" and record.accuracy["values"]["top1"] == 1.0
    folder = Path(record.results_path)
    assert (folder / "accuracy" / "accuracy.txt").is_file()
    assert (folder / "performance" / "run_1" / "mlperf_log_summary.txt").is_file()


def test_a_reference_found_for_the_model_checks_the_score_and_the_outputs(tmp_path: Path, specs_copy: Path) -> None:
    """The reference made with this model, dataset and backend is found, named in the record, and each of
    its checks passes; with no digests pinned it says nothing of stale manifests."""
    reference_for_null_routed(specs_copy / "references")
    record = run(tmp_path, "null-routed", mode="accuracy")
    assert record.reference["name"] == "null-routed.samples.null"
    checks = {check["name"]: check["pass"] for check in record.accuracy["checks"]}
    assert checks == {"top1": True, "output[3]": True}
    assert record.accuracy["verdict"] == "PASS" and record.accuracy["notes"] == []


def test_a_reference_made_with_other_manifests_is_noted_in_the_record_and_accuracy_txt(tmp_path: Path, specs_copy: Path) -> None:
    """A reference pinned to other manifest digests still scores the run, and says, for the model and the
    dataset, that the manifest changed since it was made."""
    reference_for_null_routed(specs_copy / "references", model_sha="a" * 64, dataset_sha="b" * 64)
    record = run(tmp_path, "null-routed", mode="accuracy")
    model_note, dataset_note = record.accuracy["notes"]
    assert "the reference was made with model null-routed@1.0.0 sha256 aaaaaaaaaaaa…" in model_note
    assert "dataset null-routed-samples@1.0.0 sha256 bbbbbbbbbbbb…" in dataset_note
    text = (Path(record.results_path) / "accuracy" / "accuracy.txt").read_text()
    assert model_note in text and dataset_note in text


# -- profiles -------------------------------------------------------------------------------------------------

def test_a_profiled_submission_run_profiles_the_performance_test(tmp_path: Path) -> None:
    """--profile on a submission run profiles the performance test (the queries it timed are not the
    accuracy test's 1024), and the profile is in the record and the run's folder."""
    record = run(tmp_path, mode="submission", profile=("harness",))
    assert record.profile["dir"] == "profile" and record.profile["stages"]["query"]["count"] != 1024
    summary = json.loads((Path(record.results_path) / "profile" / "summary.json").read_text())
    assert summary["scenario"] == "Offline"


def test_a_profiled_accuracy_run_profiles_its_accuracy_test(tmp_path: Path) -> None:
    """--profile on an accuracy run profiles the only test it has: the 1024 samples once."""
    record = run(tmp_path, mode="accuracy", profile=("harness",))
    assert record.profile["stages"]["query"]["count"] == 1024


def test_without_profile_there_is_no_profile(tmp_path: Path) -> None:
    record = run(tmp_path, mode="submission")
    assert not record.profile and not (Path(record.results_path) / "profile").exists()


# -- failures -------------------------------------------------------------------------------------------------

def test_a_sut_failure_fails_the_run_with_the_tests_logs_kept(tmp_path: Path, specs_copy: Path) -> None:
    """A postprocess that raises mid-test fails the run with its error, naming the sample, and the failed
    record still has the test's LoadGen section, logs and summary."""
    write_manifest(specs_copy / "models", "flaky.yaml", failing_null_model("flaky", postprocess_calls=5))
    with pytest.raises(RunFailed):  # the warm-up makes two calls, the test (550 samples in groups of 64) nine
        run(tmp_path, "flaky", overrides=("warmup_queries=1",))
    record = failed_record(tmp_path / "results", "flaky")
    assert record["status"] == "failed" and "postprocess raised RuntimeError: postprocess blew up" in record["error"]
    assert record["error"].startswith("sample ")  # the user's code failed: named by its sample, no traceback
    assert "mlperf_log_summary.txt" in record["loadgen"]["performance"]["logs"]
    assert record["performance"]["wall_seconds"] > 0


def test_an_error_loadgen_logs_fails_the_run_naming_the_test_and_the_error(tmp_path: Path) -> None:
    """LoadGen's own error (a second query issued while max_async_queries=1 is outstanding) fails the run in
    one line that names the test and quotes the error; the test's logs are in the failed record."""
    manifest = null_model_with(tmp_path / "models", postprocess=sleeping_postprocess(0.2), name="held")
    seen: dict[str, Any] = {}
    with pytest.raises(RunFailed):
        run(tmp_path, str(manifest), seen=seen, scenario="Server",
            overrides=("target_qps=1000", "max_async_queries=1"))
    record = failed_record(tmp_path / "results", "held", "Server")
    assert record["error"].startswith("LoadGen logged 1 error(s) in the performance test, the first: ")
    assert "clock check" not in seen["stderr"]  # the note is for a clock check's error set aside, not this one
    assert "Too many outstanding queries" in record["error"] and record["error_traceback"] is None
    assert record["loadgen"]["performance"]["errors"]


# -- a generative model in this process -------------------------------------------------------------------------

def test_a_generative_accuracy_run_decodes_scores_and_notes_a_stale_reference(tmp_path: Path) -> None:
    """smollm2-135m on llama.cpp, two prompts: the LLM runtime is built and warmed up (its first generation
    timed), the test runs in token mode, the logged token ids are scored against the reference named (each output
    check in the record) whose pinned digests are not these manifests', which is noted."""
    reference = write_manifest(tmp_path, "smollm2.yaml", f"""\
        kind: reference
        name: smollm2-135m.first-2.llama_cpp
        version: 1.0.0
        model: {{name: smollm2-135m, version: 1.0.0, sha256: {"c" * 64}}}
        dataset: {{name: pang-lee-polarity-prompts, version: 1.0.0, sha256: {"d" * 64}}}
        backend: llama_cpp
        accuracy:
          exact_match: {{expected: 0.5, min_fraction: 0.99}}
        outputs:
          - {{sample: 0, values: [16185, 2], atol: 0}}
        """)
    record = run(tmp_path, "smollm2-135m", backend="llama_cpp", mode="accuracy", reference=str(reference),
                 overrides=("dataset_limit=2", "intra_op_threads=1", "warmup_queries=1"))
    assert record.backend_info["name"] == "llama_cpp" and record.settings["loadgen"]["use_token_latencies"] == "1"
    assert record.cold_start["warmup"]["queries"] == 1 and record.cold_start["first_inference_seconds"] > 0
    assert record.accuracy["metric"] == "exact_match" and record.reference["name"] == "smollm2-135m.first-2.llama_cpp"
    assert {check["name"]: check["pass"] for check in record.accuracy["checks"]}["output[0]"] is True
    model_note, dataset_note = record.accuracy["notes"]
    assert "the reference was made with model smollm2-135m@1.0.0 sha256 cccccccccccc…" in model_note
    assert "dataset pang-lee-polarity-prompts@1.0.0 sha256 dddddddddddd…" in dataset_note
    assert model_note in (Path(record.results_path) / "accuracy" / "accuracy.txt").read_text()
    assert record.loadgen["accuracy"]["summary"]["itl_p50_ns"] > 0  # the token SUT's figures join the summary


# -- the metric comes from the dataset's evaluation, else the model's accuracy ----------------------------------

UNKNOWN_METRIC = "metric: expected one of"


def declare_unknown_metric(specs: Path, model_file: str, dataset_file: str, declared_by: str) -> Path:
    """The metric `no-such-metric` declared by the model's accuracy section or the dataset's evaluation
    (which then wins over the model's); the file that declares it."""
    model, dataset = specs / "models" / model_file, specs / "datasets" / dataset_file
    dataset_text = dataset.read_text().split("\nevaluation:")[0] + "\n"
    if declared_by == "dataset":
        dataset.write_text(dataset_text + "evaluation: {metric: no-such-metric}\n")
        return dataset
    dataset.write_text(dataset_text)
    text = model.read_text()
    model.write_text(text.replace("metric: topk", "metric: no-such-metric") if "metric: topk" in text
                     else text + "accuracy: {metric: no-such-metric}\n")
    return model


@pytest.mark.parametrize("declared_by", ["model", "dataset"])
def test_a_tensor_models_unknown_metric_fails_the_run_naming_the_file_that_declares_it(
        tmp_path: Path, specs_copy: Path, declared_by: str) -> None:
    """A metric the harness does not know fails the accuracy run in one line that names the manifest to mend."""
    declared = declare_unknown_metric(specs_copy, "null-routed.yaml", "null-routed-samples.yaml", declared_by)
    with pytest.raises(RunFailed):
        run(tmp_path, "null-routed", mode="accuracy")
    error = failed_record(tmp_path / "results", "null-routed")["error"]
    assert error.startswith(f"{declared}: {UNKNOWN_METRIC}") and "no-such-metric" in error


def test_the_datasets_evaluation_scores_a_tensor_model_in_place_of_the_models(tmp_path: Path, specs_copy: Path) -> None:
    """null-routed's own accuracy asks for top-1 and top-5; a dataset that evaluates top-1 alone is what counts."""
    dataset = specs_copy / "datasets" / "null-routed-samples.yaml"
    dataset.write_text(dataset.read_text() + "evaluation: {metric: topk, k: [1]}\n")
    record = run(tmp_path, "null-routed", mode="accuracy")
    assert record.accuracy["values"] == {"top1": 1.0}


@pytest.mark.parametrize("declared_by", ["model", "dataset"])
def test_a_generative_models_unknown_metric_fails_the_run_naming_the_file_that_declares_it(
        tmp_path: Path, specs_copy: Path, declared_by: str) -> None:
    """The same for a generative model's decoded answers: the error names the manifest that declares the metric."""
    declared = declare_unknown_metric(specs_copy, "smollm2-135m-llamacpp.yaml", "pang-lee-polarity-prompts.yaml",
                                      declared_by)
    with pytest.raises(RunFailed):
        run(tmp_path, "smollm2-135m", backend="llama_cpp", mode="accuracy",
            overrides=("dataset_limit=1", "intra_op_threads=1", "warmup_queries=0"))
    error = failed_record(tmp_path / "results", "smollm2-135m")["error"]
    assert error.startswith(f"{declared}: {UNKNOWN_METRIC}") and "no-such-metric" in error


def test_results_not_of_the_shape_the_named_dims_give_fail_the_accuracy_run_naming_the_sample(
        tmp_path: Path, specs_copy: Path) -> None:
    """null-routed declared as [batch, 2, classes] with dims {classes: 512}, its postprocess keeping 3 of each
    row's 512 values: the accuracy log is read against the declared (2, 512), and the run fails naming a
    sample and both sizes."""
    model = specs_copy / "models" / "null-routed.yaml"
    model.write_text(model.read_text().replace("shape: [batch, 1024]", "shape: [batch, 2, classes]").replace(
        "attributes:\n", 'postprocess: |\n  def postprocess(outputs, ctx):\n      return outputs["scores"][:, :, :3]\n'
        "attributes:\n  dims: {classes: 512}\n", 1))
    with pytest.raises(RunFailed):
        run(tmp_path, "null-routed", mode="accuracy")
    error = failed_record(tmp_path / "results", "null-routed")["error"]
    assert "mlperf_log_accuracy.json: sample " in error and "expected (2, 512) float32, got 6 values" in error


# -- runs against a server ----------------------------------------------------------------------------------------

def test_an_accuracy_run_against_a_tensor_models_server_scores_what_the_server_answered(tmp_path: Path) -> None:
    """null-routed served by `mlharness serve` (HTTP, on loopback): the run builds the endpoint's runtime, warms
    the server up with the queries asked, checks no framework here (it runs there), and scores exactly 1."""
    with mlharness_serve("null-routed", grpc=False) as served:
        record = run(tmp_path, "null-routed", mode="accuracy", endpoint=served.http, overrides=("warmup_queries=2",))
    assert record.accuracy["values"]["top1"] == 1.0
    assert record.cold_start["warmup_requests"] == 3  # the first inference, then the two queries
    assert record.software["checked"] == {} and record.loadgen["accuracy"]["sut"]["issue_path"] == "network"


def test_a_run_against_an_openai_server_warms_it_up_and_records_both_token_counts(tmp_path: Path) -> None:
    """smollm2-135m against a fake OpenAI-compatible server on loopback (tests/fake_openai.py, whose
    answers are "positive"): the LLM server's runtime is built, the warm-up asked for sent, nothing checked
    of a framework here, and the run's performance carries the server's and the client's token counts."""
    with fake_openai("usage-differs") as fake:
        record = run(tmp_path, "smollm2-135m", backend="llama_cpp", endpoint=fake.endpoint,
                     overrides=("dataset_limit=8", "warmup_queries=0"))
    assert record.cold_start["warmup"]["queries"] == 0 and record.software["checked"] == {}
    assert record.performance["output_tokens_server"] >= record.performance["output_tokens_client"] > 0
    # Token mode against a server: every request's clock and counts, in the test's logs, named in its facts.
    assert record.loadgen["performance"]["sut"]["requests_log"] == "requests.jsonl"
    (log,) = Path(record.results_path).rglob("requests.jsonl")
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert requests and all(request["status"] == "ok" and request["server_tokens"] > 0 for request in requests)


def test_a_server_runs_batch_wait_is_bounded_by_the_warm_ups_full_batch_time(tmp_path: Path) -> None:
    """Server with batch_wait_ms: the warm-up's time per full batch (from the run's cold start) derives the
    wait's bound, recorded with its rule; and a profile with LoadGen's trace reads that trace in."""
    record = run(tmp_path, scenario="Server", profile=("harness",),
                 overrides=("batch_wait_ms=5", "target_latency=100", "enable_trace=1"))
    facts = record.loadgen["performance"]["sut"]
    assert facts["batch_wait_rule"] == "target_latency - 2 x service time of a full batch"
    assert facts["batch_service_ms"] > 0 and facts["batch_wait_ms"] == 5.0
    summary = json.loads((Path(record.results_path) / "profile" / "summary.json").read_text())
    trace = summary["harness"]["loadgen_trace"]
    assert trace["status"] == "ok" and trace["file"] == "mlperf_log_trace.json" and trace["spans"] > 0
