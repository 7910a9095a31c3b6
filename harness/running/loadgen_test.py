"""One LoadGen test of a built runtime: the SUT that serves it (in process, token streaming, or through
a server), the QSL's sample loading, the progress display, and the test itself on its own thread
where the SUT serves on the caller's."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from mlharness.errors import UserError
from mlharness.running.lifecycle import wait_for_abort
from mlharness.running.request import RunRequest
from mlharness.running.resolve import harness_options
from mlharness.running.settings import Settings, apply_to_loadgen, validate_loadgen_settings


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


def build_sut(runtime: Any, settings: Settings, options: dict[str, Any], profile: Any, guard: Any,
              facts: dict[str, Any] | None, cold_start: dict[str, Any] | None, handoff: str | None = None,
              issue: str | None = None) -> Any:
    """The SUT that serves this test: through a server (the query dispatch library), token streaming
    (a generative model), or the in-process one; `facts` receives how it serves, for the record."""
    from mlharness.sut.handoff import load_handoff, load_issue_queue
    from mlharness.sut.system_under_test import SystemUnderTest

    generative = getattr(runtime, "generative", False)
    network = getattr(runtime, "network", False)
    # A run against a server has no issue queue and no batch wait here: the server batches.
    issue_queue, issue_path = load_issue_queue(settings.scenario, issue) if not network else (None, "network")
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
        sut = SystemUnderTest(backend=runtime.backend, staged=runtime.staged, handoff=load_handoff(handoff),
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
    return sut


def sample_loaders(runtime: Any, sut: Any, guard: Any, load_timeout: float) -> tuple[Callable, Callable]:
    """The QSL's load and unload callbacks: loading is watched by the guard (load_timeout), and its
    failure goes to the SUT, never into LoadGen's C++ thread."""
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

    return load_samples, unload_samples


def progress_ticker(runtime: Any, settings: Settings, sut: Any, test_settings: Any, request: RunRequest,
                    total: int) -> Any:
    """The test's plan, printed once, and the progress display that follows the SUT's completed samples."""
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

    return Ticker(f"{runtime.model.name} {settings.scenario} {settings.mode}", progress, "samples", quiet=quiet,
                  watch=watch)


def sut_outcome(sut: Any, settings: Settings, logdir: Path, facts: dict[str, Any] | None) -> BaseException | None:
    """What the SUT recorded once the test is over: its figures into `facts`, and its failure (a server's
    failures as one UserError; a bug as itself, raised with its traceback)."""
    if facts is not None and hasattr(sut, "token_figures"):  # inter-token latency, goodput (issue 19)
        facts["token_figures"] = sut.token_figures(settings.loadgen.get("ttft_latency"),
                                                   settings.loadgen.get("tpot_latency"))
    if hasattr(sut, "figures"):  # a run against a server: issue lag, the server's timings, failures
        if facts is not None:
            facts["network"] = sut.figures()
            facts["requests_log"] = sut.write_requests(logdir)  # token mode: requests.jsonl, else None
        if sut.failure is not None and not isinstance(sut.failure, UserError):
            return sut.failure
        return UserError(sut.failure_text()) if sut.failure is not None else None
    return sut.failure


def run_loadgen(runtime: Any, settings: Settings, user_conf: Path, logdir: Path,
                request: RunRequest, profile: Any = None, guard: Any = None,
                facts: dict[str, Any] | None = None,
                cold_start: dict[str, Any] | None = None) -> tuple[BaseException | None, float]:
    """One LoadGen test; returns the failure the SUT recorded (None when it ran clean) and its wall time.
    `facts` receives how the SUT was served (issue path, batch wait), for the record; the warm-up in
    `cold_start` (its time per full batch) derives the batch wait's bound."""
    import mlperf_loadgen as lg

    from mlharness.sut.loadgen_handles import loadgen_handles

    test_settings = apply_to_loadgen(settings, user_conf)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(logdir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = bool(settings.harness.get("enable_trace", False))
    options = harness_options(settings, runtime.model)
    # The request's handoff and issue path: read from the submitting process's environment, not this one's.
    sut = build_sut(runtime, settings, options, profile, guard, facts, cold_start, request.handoff, request.issue_path)
    if guard is not None:
        guard.attach_sut(sut)
    load_samples, unload_samples = sample_loaders(runtime, sut, guard, float(options.get("load_timeout") or 0))
    total = len(runtime.staged)
    perf_count = min(total, int(runtime.model.attributes.get("performance_sample_count", 1024)))
    validate_loadgen_settings(settings, performance_sample_count=perf_count)
    # An explicit audit.config path: LoadGen otherwise reads ./audit.config from the working directory.
    audit = str(request.audit_config) if request.audit_config else str(logdir / "no-audit.config")
    ticker = progress_ticker(runtime, settings, sut, test_settings, request, total)
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
    # LoadGen has returned: this thread writes the outcome from here, the SUT's logs included, and an abort
    # from now on (a failed request's) leaves it to this thread; unless an abort is already writing it.
    if guard is not None and not guard.finalizing():
        wait_for_abort()
    return sut_outcome(sut, settings, logdir, facts), elapsed
