"""One LoadGen test of a built runtime (running/loadgen_test.py), each rule a mutant made visible: the batch
wait's bound, the SUT chosen and what it records in the facts, the QSL's loaders, the progress plan, the
outcome, and run_loadgen itself: real runtimes (the shipped null model, a tiny torch model), real Settings
from a RunRequest, a real RunGuard, and short real LoadGen tests (run_loadgen's in a fresh process each:
LoadGen takes one configuration a process)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.profiling import new_session
from mlharness.running import loadgen_test
from mlharness.running.request import RunRequest
from mlharness.running.resolve import harness_options, prepare_settings, resolve_manifests
from mlharness.running.run_child import RunGuard
from mlharness.running.settings import build_settings
from mlharness.specs.manifests import load_manifest
from mlharness.sut.runtime import build_runtime
from tests.support import REPO, answer_of_child, loadgen_hang_guard, null_model_with, tiny_torch_model, write_manifest

HANG_SECONDS = 30
# Making a connection's client (never asked to connect here) took over 1 s on 2 busy cores: a bound, not a verdict.
CONNECT_SECONDS = 60.0
# A bound on a run's process as a whole (a fresh interpreter that imports the harness, and torch where
# the test needs it, which on a loaded machine can take a minute); a lost query ends it long before.
CHILD_SECONDS = 300
RUN_HANG_SECONDS = 10  # a run_loadgen of its own process (well under a second) that loses a query ends its process here
FULL_BATCH_RULE = "target_latency - 2 x service time of a full batch"
BAD_PREPROCESS = "def preprocess(sample, ctx):\n    raise ValueError('bad sample')\n"


def _settings(scenario: str, *overrides: str) -> Any:
    return build_settings(scenario=scenario, mode="performance", conf_model="m", model_name="m",
                          overrides=list(overrides))


def _request(scenario: str = "Offline", *overrides: str, mode: str = "performance", **fields: Any) -> RunRequest:
    return RunRequest(model="null", scenario=scenario, mode=mode, quick=True,
                      overrides=("dataset_limit=16", *overrides), **fields)


def _parts(request: RunRequest, manifest: Path | None = None, backend: str | None = None,
           dataset_manifest: Path | None = None) -> tuple[Any, Any, dict]:
    """(runtime, settings, harness options) for the request, as the runner builds them."""
    model, backend_name, dataset, hardware, _, _ = resolve_manifests(request)
    model = load_manifest(manifest) if manifest is not None else model
    dataset = load_manifest(dataset_manifest) if dataset_manifest is not None else dataset
    settings = prepare_settings(request, model)
    options = harness_options(settings, model)
    return build_runtime(model, dataset, hardware, backend or backend_name, options), settings, options


class WatchedGuard(RunGuard):
    """The real RunGuard (no workdir), keeping what each watch() was asked and ended, and any abort, which
    would end this process, recorded instead (with the thread that asked)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.watched: list[tuple[float | None, str]] = []
        self.ended: list[str] = []
        self.aborts: list[tuple[str, int, str, bool]] = []
        self.told = threading.Event()

    def watch(self, timeout: float | None, what: str) -> Any:
        self.watched.append((timeout, what))
        return lambda: self.ended.append(what)

    def abort(self, reason: str, exit_status: int) -> None:
        thread = threading.current_thread()
        self.aborts.append((reason, exit_status, thread.name, thread.daemon))
        self.told.set()


@pytest.fixture
def torch_model(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    return write_manifest(tmp_path / "specs", "tiny.yaml", tiny_torch_model("tiny-cnn"))


# batch_wait_bound and full_batch_service_ms -----------------------------------------------------------

@pytest.mark.parametrize("scenario, options, target, service, expected", [
    ("Server", {"batch_wait_ms": 100.0}, 10, 1 / 3, {"batch_wait_ms": 9.333333, "batch_wait_bound_ms": 9.333333,
                                                     "batch_service_ms": 0.333333, "batch_wait_rule": FULL_BATCH_RULE}),
    ("Server", {"batch_wait_ms": 0.5}, 10, 2.0, {"batch_wait_ms": 0.5, "batch_wait_bound_ms": 6.0,
                                                 "batch_service_ms": 2.0, "batch_wait_rule": FULL_BATCH_RULE}),
    ("Server", {"batch_wait_ms": 100.0}, 4, 3.0, {"batch_wait_ms": 0.0, "batch_wait_bound_ms": 0.0,
                                                  "batch_service_ms": 3.0, "batch_wait_rule": FULL_BATCH_RULE}),
    ("Server", {"batch_wait_ms": 100.0}, 7, None, {"batch_wait_ms": 3.5, "batch_wait_bound_ms": 3.5,
                                                   "batch_wait_rule": "target_latency / 2 (no measured service time)"}),
    ("Server", {"batch_wait_ms": 2.5}, None, 1.0, {"batch_wait_ms": 2.5}),
    ("Server", {"batch_wait_ms": 0.0}, 10, None, {"batch_wait_ms": 0.0}),
    ("Server", {}, 10, None, {"batch_wait_ms": 0.0}),
    ("Offline", {"batch_wait_ms": 8.0}, None, None, {"batch_wait_ms": 0.0}),
])
def test_the_batch_wait_and_how_its_bound_was_derived(scenario: str, options: dict, target: Any, service: Any,
                                                      expected: dict) -> None:
    """The wait applied, its bound, the rule and the service time, as recorded (rounded to 6 places)."""
    settings = _settings(scenario, *([] if target is None else [f"target_latency={target}"]))
    assert loadgen_test.batch_wait_bound(settings, options, service) == expected


def test_the_full_batch_service_time_is_the_warm_ups_milliseconds_per_query() -> None:
    """A warm-up of full batches gives ms per batch; another batch size, no queries or no warm-up gives None."""
    full = loadgen_test.full_batch_service_ms
    assert full({"warmup": {"queries": 4, "seconds": 0.03, "batch_size": 8}}, 8) == pytest.approx(7.5)
    assert full({"warmup": {"queries": 4, "seconds": 0.03, "batch_size": 4}}, 8) is None
    assert full({"warmup": {"queries": 0, "seconds": 0.0, "batch_size": 8}}, 8) is None
    assert full({"warmup": None}, 8) is None and full({}, 8) is None


# run_test_beside_caller -------------------------------------------------------------------------------

def test_the_test_runs_on_its_own_named_daemon_thread_while_the_caller_serves() -> None:
    """start_test runs on the daemon thread mlharness-loadgen, serve on the caller, end after the test."""
    seen: dict[str, Any] = {}
    ended = threading.Event()

    def start_test() -> None:
        seen["test"] = (threading.current_thread().name, threading.current_thread().daemon)

    def serve() -> None:
        seen["serve"] = threading.current_thread().name
        assert ended.wait(HANG_SECONDS)

    loadgen_test.run_test_beside_caller(start_test, serve, ended.set)
    assert seen == {"test": ("mlharness-loadgen", True), "serve": threading.current_thread().name}


def test_the_tests_exception_is_raised_on_the_caller_once_serving_has_ended() -> None:
    """The test's exception itself is raised here, after serving ended."""
    ended, boom = threading.Event(), ValueError("loadgen refused")

    def start_test() -> None:
        raise boom

    with pytest.raises(ValueError) as info:
        loadgen_test.run_test_beside_caller(start_test, lambda: ended.wait(HANG_SECONDS), ended.set)
    assert info.value is boom and ended.is_set()


# build_sut --------------------------------------------------------------------------------------------

def test_a_server_sut_in_process_takes_the_requested_issue_path_handoff_and_bounded_wait(tmp_path: Path) -> None:
    """Server: the native issue queue, the python handoff asked for, the bounded wait, the profile observing."""
    native = pytest.importorskip("mlharness.sut._native")
    from mlharness.sut.handoff import PythonHandoff
    from mlharness.sut.system_under_test import SystemUnderTest

    runtime, settings, options = _parts(_request("Server", "target_latency=10", "batch_wait_ms=100", "workers=2"))
    facts: dict[str, Any] = {}
    profile = new_session(["harness"], tmp_path, "Server", calibrate=False)
    warm = {"warmup": {"queries": 4, "seconds": 0.01, "batch_size": 1024}}
    sut = loadgen_test.build_sut(runtime, settings, options, profile, None, facts, warm, "python", "native")
    assert isinstance(sut, SystemUnderTest) and isinstance(sut.handoff, PythonHandoff)
    assert isinstance(sut.issue_queue, native.IssueQueue) and sut.batch_wait_s == pytest.approx(0.005)
    assert facts == {"issue_path": "native", "batch_wait_ms": 5.0, "batch_wait_bound_ms": 5.0, "batch_service_ms": 2.5,
                     "batch_wait_rule": FULL_BATCH_RULE, "served_on": "workers", "postprocess_group_rows": 0}
    assert (sut.backend, sut.staged, sut.ctx, sut.observer) == (runtime.backend, runtime.staged, runtime.ctx, profile)
    assert (sut.scenario, sut.workers, sut.max_batch_size) == ("Server", 2, 1024)
    assert sut.result_contract.spec == runtime.model.outputs[0]


def test_without_a_warm_up_the_server_wait_is_half_the_target_and_the_python_issue_path_is_named() -> None:
    """No cold start: the T/2 bound; MLHARNESS_ISSUE=python asked: no queue, and the path says why."""
    runtime, settings, options = _parts(_request("Server", "target_latency=10", "batch_wait_ms=100"))
    facts: dict[str, Any] = {}
    sut = loadgen_test.build_sut(runtime, settings, options, None, None, facts, None, "native", "python")
    assert sut.issue_queue is None and type(sut.handoff).__name__ != "PythonHandoff"
    assert facts["issue_path"] == "python (MLHARNESS_ISSUE=python)" and "batch_service_ms" not in facts
    assert (facts["batch_wait_ms"], facts["batch_wait_rule"]) == (5.0, "target_latency / 2 (no measured service time)")


def test_an_offline_sut_groups_postprocessing_and_records_it_and_builds_without_facts() -> None:
    """Offline: no wait, the group rows as set, served by workers; facts None records nothing and still builds."""
    runtime, settings, options = _parts(_request("Offline", "postprocess_group_rows=4096", "batch_wait_ms=3"))
    facts: dict[str, Any] = {}
    sut = loadgen_test.build_sut(runtime, settings, options, None, None, facts, {}, None, None)
    assert facts == {"issue_path": "python (the native issue path serves Server; this is Offline)",
                     "batch_wait_ms": 0.0, "served_on": "workers", "postprocess_group_rows": 4096}
    assert sut.postprocess_group_rows == 4096 and sut.batch_wait_s == 0.0
    assert loadgen_test.build_sut(runtime, settings, options, None, None, None, {}, None, None).scenario == "Offline"


def test_a_torch_model_on_the_cpu_is_served_on_the_callers_thread_unless_profiled(
        tmp_path: Path, torch_model: Path) -> None:
    """torch on the CPU prefers the caller's thread: served_on caller; under a profile, on the workers."""
    runtime, settings, options = _parts(_request("Offline"), torch_model, "torch")
    facts: dict[str, Any] = {}
    assert loadgen_test.build_sut(runtime, settings, options, None, None, facts, None).serve_on_caller
    assert facts["served_on"] == "caller"
    profiled: dict[str, Any] = {}
    profile = new_session(["harness"], tmp_path, "Offline", calibrate=False)
    assert not loadgen_test.build_sut(runtime, settings, options, profile, None, profiled, None).serve_on_caller
    assert profiled["served_on"] == "workers"


class _Engine:
    """A generative engine that can batch (open_batch) and answers three tokens; a real LLM loads for seconds."""

    max_new_tokens = 2

    def generate(self, prompt: Any, on_token: Any = None) -> Any:
        for position, token in enumerate((7, 8, 2)):
            on_token(token, position)
        return np.array([7, 8, 2], dtype=np.int64)

    def open_batch(self, max_sequences: int, max_sequence_tokens: int) -> Any:
        raise AssertionError("no batch is opened in these tests")


def _llm_runtime() -> Any:
    """A generative runtime as build_sut reads it (generative, backend, staged prompts), without model weights."""
    from mlharness.sut.llm.runtime import PromptSet

    prompts = PromptSet([(f"p{i}", "x") for i in range(4)], [np.array([i, 1], np.int64) for i in range(4)])
    return SimpleNamespace(generative=True, network=False, backend=_Engine(), staged=prompts)


@pytest.mark.parametrize("warmup_queries, batching, scenario, expected", [
    (4, "static", "Offline", {"batching": "static", "max_batch_size": 3}),
    (0, "continuous", "Server", {"batching": "continuous", "max_batch_size": 3}),
    (4, "continuous", "SingleStream", {"batching": "sequential", "max_batch_size": 1}),
])
def test_a_generative_model_gets_the_token_streaming_sut_with_its_batching(warmup_queries: int, batching: str,
                                                                          scenario: str, expected: dict) -> None:
    """Token mode: the python issue path, no batch wait, the batching asked, warm sequences only with a warm-up."""
    from mlharness.sut.llm.token_sut import TokenStreamingSUT

    settings = _settings(scenario, "batch_wait_ms=5", *(["target_latency=10"] if scenario == "Server" else []))
    options = {**harness_options(settings, SimpleNamespace(attributes={})), "max_batch_size": 3,
               "llm_batching": batching, "warmup_queries": warmup_queries}
    runtime, facts = _llm_runtime(), {}
    sut = loadgen_test.build_sut(runtime, settings, options, None, None, facts, None, None, "native")
    assert isinstance(sut, TokenStreamingSUT) and sut.backend is runtime.backend and sut.prompts is runtime.staged
    assert facts == {"issue_path": "python", "batch_wait_ms": 0.0, "admission": "SUT scheduler", **expected}
    assert (sut.scenario, sut.max_batch_size, sut.warm_sequences) == (scenario, 3, 3 if warmup_queries else 0)
    assert sut.serve_on_caller == (expected["batching"] == "sequential")
    assert loadgen_test.build_sut(runtime, settings, options, None, None, None, None).scenario == scenario


def _endpoint_runtime(llm: bool = False) -> Any:
    """A real endpoint runtime of the null model (or an LLM server's of smollm2-135m, its tokenizer a stand-in:
    its weights are not needed here), connected to a port nobody serves (never asked here)."""
    from mlharness.specs.endpoint import parse_endpoint
    from mlharness.sut.network.connection import EndpointConnection

    if llm:
        from mlharness.sut.network.openai_runtime import LLMEndpointRuntime
        from mlharness.sut.network.token_exchange import PromptTexts

        model = load_manifest(REPO / "specs" / "models" / "smollm2-135m.yaml")
        connection = EndpointConnection(parse_endpoint("openai+http://127.0.0.1:9/v1"), "smollm2", 4, 1.0, CONNECT_SECONDS)
        return LLMEndpointRuntime(model, None, connection, PromptTexts([("p", "x")]), None,
                                  SimpleNamespace(name="stand-in"), "chat", "server")
    from mlharness.sut.network.runtime import EndpointRuntime, open_raw_samples

    model, _, dataset, _, _, _ = resolve_manifests(_request("Server"))
    samples, _ = open_raw_samples(model, dataset, 16)
    connection = EndpointConnection(parse_endpoint("http://127.0.0.1:9"), "null", 4, 1.0, CONNECT_SECONDS)
    return EndpointRuntime(model, dataset, connection, samples, samples.ctx, "x")


def test_a_run_against_a_server_gets_the_network_sut_whose_first_failure_aborts_the_run() -> None:
    """network: no issue queue or wait, the connection described, the lag limit; a failure aborts via the guard."""
    from mlharness.sut.network.network_sut import NetworkSUT, TensorExchange

    runtime = _endpoint_runtime()
    try:
        settings = _settings("Server", "issue_lag_limit_ms=7.5", "batch_wait_ms=3", "target_latency=10")
        options = harness_options(settings, runtime.model)
        facts: dict[str, Any] = {}
        guard = WatchedGuard()
        sut = loadgen_test.build_sut(runtime, settings, options, None, guard, facts, None, None, "native")
        assert isinstance(sut, NetworkSUT) and isinstance(sut.exchange, TensorExchange) and not sut.token_mode
        assert sut.connection is runtime.backend and sut.issue_lag_limit_ms == 7.5 and sut.judge_lag
        assert (sut.exchange.connection, sut.exchange.samples, sut.exchange.input_name) == \
            (runtime.backend, runtime.staged, "x")
        assert sut.exchange.result_spec == runtime.model.outputs[0]
        assert facts == sut.describe() and facts["issue_path"] == "network" and "batch_wait_ms" not in facts
        sut.on_failure("server said no")
        assert guard.told.wait(HANG_SECONDS)
        assert guard.aborts == [("server said no", 1, "mlharness-endpoint-failed", True)]
        # no issue path of its own: an MLHARNESS_ISSUE value that would fail an in-process run is not read
        assert loadgen_test.build_sut(runtime, settings, options, None, None, None, None, None, "fast").on_failure is None
    finally:
        runtime.backend.close()


def test_a_run_against_an_llm_server_exchanges_tokens_through_the_runtimes_own_exchange() -> None:
    """network and generative: the runtime's token exchange (token mode), described into facts with the api."""
    from mlharness.sut.network.token_exchange import TokenExchange

    runtime = _endpoint_runtime(llm=True)
    try:
        settings, facts = _settings("Offline"), {}
        sut = loadgen_test.build_sut(runtime, settings, harness_options(settings, runtime.model), None, None, facts, None)
        assert isinstance(sut.exchange, TokenExchange) and sut.token_mode and not sut.judge_lag
        assert facts == sut.describe() and (facts["api"], facts["issue_path"]) == ("chat", "network")
    finally:
        runtime.backend.close()


# sample_loaders ---------------------------------------------------------------------------------------

def test_loading_samples_is_watched_by_the_guard_and_unloading_drops_them() -> None:
    """load: the guard watches it for load_timeout, named with the count; unload frees the samples."""
    runtime, settings, options = _parts(_request("Offline"))
    sut = loadgen_test.build_sut(runtime, settings, options, None, None, None, None)
    guard = WatchedGuard()
    load, unload = loadgen_test.sample_loaders(runtime, sut, guard, 7.5)
    load([0, 1, 2])
    what = "LoadQuerySamples (load and preprocess of 3 samples)"
    assert guard.watched == [(7.5, what)] and guard.ended == [what] and sut.failure is None
    assert runtime.staged.rows([0, 1, 2]) is not None
    unload([0, 1, 2])
    with pytest.raises(Exception):
        runtime.staged.rows([0])
    unguarded, _ = loadgen_test.sample_loaders(runtime, sut, None, 7.5)
    assert unguarded([3]) is None and runtime.staged.rows([3]) is not None


# progress_ticker --------------------------------------------------------------------------------------

def _offline_test_settings(accuracy: bool) -> Any:
    """LoadGen's settings of a short Offline test, set in code (apply_to_loadgen is once a process)."""
    import mlperf_loadgen as lg

    test = lg.TestSettings()
    test.scenario = lg.TestScenario.Offline
    test.mode = lg.TestMode.AccuracyOnly if accuracy else lg.TestMode.PerformanceOnly
    test.offline_expected_qps, test.min_duration_ms, test.min_query_count = 1000, 0, 1
    return test


def test_the_plan_is_printed_once_to_stderr_and_the_ticker_follows_the_suts_completed_samples(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Not quiet: the plan's line on stderr; the ticker counts the samples a real LoadGen test completed."""
    import mlperf_loadgen as lg

    from mlharness.sut.loadgen_handles import loadgen_handles

    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    request = _request("Offline", mode="accuracy")
    runtime, settings, options = _parts(request)
    test_settings = _offline_test_settings(accuracy=True)
    sut = loadgen_test.build_sut(runtime, settings, options, None, None, None, None)
    ticker = loadgen_test.progress_ticker(runtime, settings, sut, test_settings, request, 12)
    assert capfd.readouterr() == ("", "[run] Offline accuracy: every sample once (12 samples)\n")
    assert (ticker.label, ticker.unit, ticker.quiet) == ("null Offline accuracy", "samples", False)
    ticker.watch()  # nothing completed yet: the test's clock has not started
    assert ticker.read().extra == "LoadGen is loading samples and scheduling queries"
    log = lg.LogSettings()
    log.log_output.outdir = str(tmp_path)
    before = time.perf_counter()
    with loadgen_hang_guard(HANG_SECONDS), loadgen_handles(sut, 16, 16, runtime.staged.load_samples,
                                                           runtime.staged.unload_samples) as (lg_sut, qsl):
        lg.StartTestWithLogSettings(lg_sut, qsl, test_settings, log, str(tmp_path / "no-audit.config"))
    ticker.watch()
    snapshot = ticker.read()  # elapsed counts from the first completed sample seen, within this test
    assert (snapshot.done, snapshot.total) == (16, 12) and 0 <= snapshot.elapsed <= time.perf_counter() - before


def test_a_quiet_request_or_progress_off_prints_no_plan_and_a_quiet_ticker(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--quiet or MLHARNESS_PROGRESS=off: nothing printed, the ticker quiet."""
    runtime, settings, options = _parts(_request("Offline"))
    sut = loadgen_test.build_sut(runtime, settings, options, None, None, None, None)
    test_settings = _offline_test_settings(accuracy=False)
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    assert loadgen_test.progress_ticker(runtime, settings, sut, test_settings, _request(quiet=True), 16).quiet
    monkeypatch.setenv("MLHARNESS_PROGRESS", "off")
    assert loadgen_test.progress_ticker(runtime, settings, sut, test_settings, _request(), 16).quiet
    assert capfd.readouterr() == ("", "")


# sut_outcome ------------------------------------------------------------------------------------------

def test_a_server_runs_outcome_records_its_figures_and_makes_its_failures_one_user_error(tmp_path: Path) -> None:
    """network: figures and requests log into facts; an endpoint's UserError becomes its one-line text, a bug stays."""
    runtime = _endpoint_runtime()
    try:
        settings = _settings("Server", "target_latency=10")
        options = harness_options(settings, runtime.model)
        sut = loadgen_test.build_sut(runtime, settings, options, None, None, None, None)
        facts: dict[str, Any] = {}
        assert loadgen_test.sut_outcome(sut, settings, tmp_path, facts) is None
        assert facts == {"token_figures": {}, "network": sut.figures(), "requests_log": None}
        assert loadgen_test.sut_outcome(sut, settings, tmp_path, None) is None
        sut.fail_staging(UserError("the server refused the model"))
        outcome = loadgen_test.sut_outcome(sut, settings, tmp_path, None)
        assert type(outcome) is UserError and outcome is not sut.failure
        assert str(outcome) == sut.failure_text() == "the server refused the model"
        other, bug = loadgen_test.build_sut(runtime, settings, options, None, None, None, None), RuntimeError("bug")
        other.fail_staging(bug)
        assert loadgen_test.sut_outcome(other, settings, tmp_path, {}) is bug
    finally:
        runtime.backend.close()


def test_a_token_runs_outcome_records_its_token_figures_with_the_goodput_limits(tmp_path: Path) -> None:
    """token mode: the inter-token figures and goodput under the run's TTFT and TPOT limits go into facts."""
    import mlperf_loadgen as lg

    from mlharness.sut.llm.token_sut import TokenStreamingSUT
    from mlharness.sut.loadgen_handles import loadgen_handles
    from tests.support import token_mode_settings

    runtime = _llm_runtime()
    sut = TokenStreamingSUT(backend=runtime.backend, prompts=runtime.staged, scenario="SingleStream")
    test_settings, log = token_mode_settings("SingleStream", 4, tmp_path)
    with loadgen_hang_guard(HANG_SECONDS), loadgen_handles(sut, 4, 4, runtime.staged.load_samples,
                                                           runtime.staged.unload_samples) as (lg_sut, qsl):
        lg.StartTestWithLogSettings(lg_sut, qsl, test_settings, log, str(tmp_path / "no-audit.config"))
    settings = _settings("Server", "target_latency=10", "ttft_latency=2000", "tpot_latency=1000")
    facts: dict[str, Any] = {}
    assert loadgen_test.sut_outcome(sut, settings, tmp_path, facts) is None
    assert facts == {"token_figures": sut.token_figures("2000", "1000")} and "itl_p50_ns" in facts["token_figures"]
    assert facts["token_figures"]["goodput_limits"] == "TTFT <= 2000 ms and TPOT <= 1000 ms"
    assert loadgen_test.sut_outcome(sut, settings, tmp_path, None) is None


# run_loadgen ------------------------------------------------------------------------------------------

def _null8(tmp_path: Path, count: str = "performance_sample_count: 8") -> Path:
    """The shipped null model with a performance sample count of 8 (of the 16 samples a test loads)."""
    text = (REPO / "specs" / "models" / "null.yaml").read_text()
    path = tmp_path / "null8.yaml"
    path.write_text(text.replace("performance_sample_count: 1024", count))
    return path


def _run_in_child(tmp_path: Path, request: RunRequest, manifest: Path | None, backend: str | None,
                  kwargs: dict[str, Any], pipe: Any) -> None:
    try:
        if kwargs.pop("llm", False):  # smollm2-135m's settings, its engine a stand-in (as _llm_runtime)
            runtime = SimpleNamespace(**vars(_llm_runtime()), model=resolve_manifests(request)[0])
            settings = prepare_settings(request, runtime.model)
        elif kwargs.get("endpoint"):  # the null model on a server that is not there
            runtime = _endpoint_runtime()
            settings = prepare_settings(request, runtime.model)
        else:
            runtime, settings, _ = _parts(request, manifest or _null8(tmp_path), backend, kwargs.pop("dataset", None))
        user_conf, logdir = tmp_path / "user.conf", tmp_path / "logs"
        user_conf.write_text(settings.user_conf_text())
        logdir.mkdir()
        # an audit.config where LoadGen would look by default: never read unless the request names one
        write_manifest(tmp_path / "cwd", "audit.config", "*.*.min_query_count = 3\n")
        os.chdir(tmp_path / "cwd")
        guard, facts = WatchedGuard(), {}
        endpoint = kwargs.pop("endpoint", False)
        levels = kwargs.pop("profile", None)  # a real profile session of these levels, not calibrated
        profile = new_session(levels, tmp_path / "profile", request.scenario, calibrate=False) if levels else None
        with loadgen_hang_guard(RUN_HANG_SECONDS):
            started = time.perf_counter()
            failure, elapsed = loadgen_test.run_loadgen(runtime, settings, user_conf, logdir, request, profile=profile,
                                                        guard=guard, facts=facts, **kwargs)
            outer = time.perf_counter() - started
        sut = guard.sut
        if endpoint:  # the failed request's abort, on a thread of its own
            guard.told.wait(RUN_HANG_SECONDS)
        # Whether another thread (an abort's) may still write the run's final state: not once LoadGen returned.
        elsewhere: list[bool] = []
        other = threading.Thread(target=lambda: elsewhere.append(guard.finalizing()))
        other.start()
        other.join()
        pipe.send({"failure": None if failure is None else f"{type(failure).__name__}: {failure}",
                   "failure_is_the_suts": failure is sut.failure, "elapsed": elapsed, "outer": outer, "facts": facts,
                   "watched": guard.watched, "ended": guard.ended, "scenario": getattr(sut, "scenario", None),
                   "serve_on_caller": getattr(sut, "serve_on_caller", None), "completed": sut.completed_samples,
                   "handoff": type(getattr(sut, "handoff", None)).__name__, "aborts": guard.aborts,
                   "profile": profile.finish() if profile else None, "finalizing_elsewhere": elsewhere[0]})
    except BaseException as exc:  # noqa: BLE001 - sent to the test, which asserts on it
        pipe.send({"raised": f"{type(exc).__name__}: {exc}"})


def _run(tmp_path: Path, request: RunRequest, manifest: Path | None = None, backend: str | None = None,
         **kwargs: Any) -> dict[str, Any]:
    """run_loadgen of the request as the runner calls it (a real guard, facts), in a fresh process of its own:
    what it returned and what the guard and the SUT saw."""
    # A fresh process, not a fork of this one: a fork inherits LoadGen's configuration if an earlier test of
    # this worker made one (LoadGen takes one a process: the run is refused), and after a torch or llama.cpp
    # test GNU OpenMP's pool is missing in a fork (torch there waits for it for ever). Both seen in make test.
    return answer_of_child("spawn", _run_in_child, tmp_path, request, manifest, backend, kwargs,
                           seconds=CHILD_SECONDS)


def _logged(logdir: Path, key: str) -> Any:
    for line in (logdir / "mlperf_log_detail.txt").read_text().splitlines():
        if f'"key": "{key}"' in line:
            return json.loads(line.split(":::MLLOG ", 1)[1])["value"]
    return None


def test_a_run_gives_loadgen_the_settings_samples_and_log_folder_and_returns_clean(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline null: LoadGen logs the user.conf's settings, 16 samples with 8 for performance, no summary on stdout."""
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    monkeypatch.setenv("MLHARNESS_PROGRESS_INTERVAL", "0.001")  # drawn during the test, however short
    done, logdir = _run(tmp_path, _request("Offline", "target_qps=1000")), tmp_path / "logs"
    assert done["failure"] is None and 0 < done["elapsed"] <= done["outer"]
    assert done["facts"] == {"issue_path": "python (the native issue path serves Server; this is Offline)",
                             "batch_wait_ms": 0.0, "served_on": "workers", "postprocess_group_rows": 0}
    assert (_logged(logdir, "qsl_reported_total_count"), _logged(logdir, "qsl_reported_performance_count")) == (16, 8)
    assert (_logged(logdir, "requested_scenario"), _logged(logdir, "effective_target_qps")) == ("Offline", 1000)
    assert _logged(logdir, "requested_test_mode") == "PerformanceOnly"
    assert "Found Audit Config" not in (logdir / "mlperf_log_detail.txt").read_text()
    assert (logdir / "mlperf_log_trace.json").stat().st_size == 0
    out, err = capfd.readouterr()
    assert "MLPerf Results Summary" not in out and "[run] Offline performance:" in err
    assert "[progress] null Offline performance: " in err
    assert done["completed"] > 0 and done["scenario"] == "Offline"
    what = "LoadQuerySamples (load and preprocess of 8 samples)"
    assert done["watched"] == [(600.0, what)] and done["ended"] == [what]
    assert done["finalizing_elsewhere"] is False  # this thread claimed the run's final writing when LoadGen returned


def test_a_quiet_traced_audited_run_writes_the_trace_reads_the_audit_config_and_prints_no_plan(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """enable_trace, an explicit audit.config and --quiet reach LoadGen and the display; load_timeout the guard."""
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    audit = tmp_path / "audit.config"
    audit.write_text("*.Offline.min_query_count = 7\n")
    request = _request("Offline", "target_qps=1000", "enable_trace=1", "load_timeout=42", audit_config=audit, quiet=True)
    done, logdir = _run(tmp_path, request), tmp_path / "logs"
    assert done["failure"] is None and (logdir / "mlperf_log_trace.json").stat().st_size > 0
    assert "Found Audit Config file (audit.config)" in (logdir / "mlperf_log_detail.txt").read_text()
    assert [timeout for timeout, _ in done["watched"]] == [42.0]
    assert "[run]" not in capfd.readouterr().err


@pytest.mark.parametrize("stage", ["preprocess", "postprocess"])
def test_a_sample_that_fails_to_load_or_postprocess_is_the_runs_failure(tmp_path: Path, stage: str) -> None:
    """The model's preprocess (in LoadQuerySamples) or postprocess raises: run_loadgen returns the SUT's failure."""
    code = BAD_PREPROCESS if stage == "preprocess" else "def postprocess(outputs, ctx):\n    raise ValueError('bad sample')\n"
    done = _run(tmp_path, _request("Offline", "target_qps=1000"), null_model_with(tmp_path / "m", **{stage: code}))
    assert "bad sample" in done["failure"] and done["failure_is_the_suts"] and done["facts"]["served_on"] == "workers"


def test_a_setting_loadgen_would_refuse_is_refused_against_the_models_performance_sample_count(tmp_path: Path) -> None:
    """performance_issue_same_index 10 with 8 performance samples: one UserError before LoadGen starts."""
    done = _run(tmp_path, _request("Offline", "performance_issue_same=1", "performance_issue_same_index=10"))
    assert done["raised"].startswith("UserError: ")
    assert "expected a sample index below the performance sample count 8" in done["raised"]


def test_a_torch_model_is_served_on_the_callers_thread_while_loadgen_runs_beside_it(
        tmp_path: Path, torch_model: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """torch on the CPU: the caller serves, every sample of the accuracy test is answered, facts say caller."""
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)
    done, logdir = _run(tmp_path, _request("Offline", mode="accuracy"), torch_model, "torch"), tmp_path / "logs"
    assert "[run] Offline accuracy: every sample once (16 samples)" in capfd.readouterr().err
    assert done["failure"] is None and done["facts"]["served_on"] == "caller" and done["serve_on_caller"]
    logged = json.loads((logdir / "mlperf_log_accuracy.json").read_text())
    assert sorted(entry["qsl_idx"] for entry in logged) == list(range(16))
    assert _logged(logdir, "requested_test_mode") == "AccuracyOnly"
    assert "Found Audit Config" not in (logdir / "mlperf_log_detail.txt").read_text()


def test_a_server_run_bounds_its_wait_by_the_warm_ups_full_batches_and_takes_the_requests_handoff(
        tmp_path: Path) -> None:
    """Server with a warm-up of full batches in cold_start: its bound in facts; the issue path and handoff asked for."""
    request = _request("Server", "target_qps=200", "target_latency=10", "batch_wait_ms=100", "min_query_count=8",
                       "min_duration=0", mode="accuracy", issue_path="python", handoff="python")
    done = _run(tmp_path, request, cold_start={"warmup": {"queries": 4, "seconds": 0.008, "batch_size": 1024}})
    assert done["failure"] is None and done["facts"]["issue_path"] == "python (MLHARNESS_ISSUE=python)"
    assert (done["facts"]["batch_service_ms"], done["facts"]["batch_wait_ms"]) == (2.0, 6.0)
    assert done["handoff"] == "PythonHandoff" and done["profile"] is None


def test_a_profiled_run_measures_the_test_and_sees_every_batch_the_sut_served(tmp_path: Path) -> None:
    """--profile harness: the session is around the test and is the SUT's batch observer (its stages counted)."""
    done = _run(tmp_path, _request("Offline", "target_qps=1000"), profile=["harness"])
    assert done["failure"] is None and done["profile"]["levels"] == {"harness": "ok"}
    stages = done["profile"]["stages"]
    assert stages["query"]["count"] > 0 and stages["queue_wait"]["count"] >= 1 and stages["complete"]["count"] >= 1


def test_a_model_without_a_performance_sample_count_gives_loadgen_1024_of_a_larger_dataset(tmp_path: Path) -> None:
    """No performance_sample_count in the manifest: LoadGen is told 1024 of the dataset's 1100 samples."""
    text = (REPO / "specs" / "datasets" / "null-samples.yaml").read_text().replace("1024", "1100")
    dataset = write_manifest(tmp_path / "d", "null-1100.yaml", text)
    request = RunRequest(model="null", scenario="Offline", quick=True, overrides=("target_qps=1000",))
    done = _run(tmp_path, request, _null8(tmp_path, ""), dataset=dataset)
    assert done["failure"] is None
    assert (_logged(tmp_path / "logs", "qsl_reported_total_count"),
            _logged(tmp_path / "logs", "qsl_reported_performance_count")) == (1100, 1024)


def test_a_generative_run_streams_tokens_on_the_caller_and_records_its_token_figures_and_profile(
        tmp_path: Path) -> None:
    """smollm2-135m's settings (token mode) with a stand-in engine: the caller generates, the token figures
    reach facts, and the profile's harness level is read from the token SUT's own stamps."""
    request = RunRequest(model="smollm2-135m", scenario="SingleStream", quick=True,
                         overrides=("min_query_count=4", "min_duration=0"))
    done = _run(tmp_path, request, llm=True, profile=["harness"])
    assert done["failure"] is None and done["serve_on_caller"] and done["completed"] >= 4
    assert done["facts"]["issue_path"] == "python" and "itl_p50_ns" in done["facts"]["token_figures"]
    assert done["profile"]["levels"] == {"harness": "ok"} and {"prefill", "decode"} <= set(done["profile"]["stages"])


def test_a_run_against_a_server_nobody_answers_fails_as_one_user_error_and_tells_the_guard(tmp_path: Path) -> None:
    """network: every request refused; run_loadgen returns one UserError and the first failure aborted via the guard."""
    done = _run(tmp_path, _request("Offline", "target_qps=1000"), endpoint=True)
    assert done["failure"].startswith("UserError: ") and "failed at http://127.0.0.1:9" in done["failure"]
    assert done["facts"]["issue_path"] == "network" and "network" in done["facts"]
    assert [(status, thread) for _, status, thread, _ in done["aborts"]] == [(1, "mlharness-endpoint-failed")]
