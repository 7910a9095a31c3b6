"""`mlharness run`: one model under LoadGen in one scenario and mode."""
from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mlharness.running.arguments import add_request_arguments, environment_assignments, request_from_args
from mlharness.running.request import RunRequest

if TYPE_CHECKING:
    from mlharness.records.payloads import ColdStart
    from mlharness.records.run_record import RunRecord


def request_of(args: argparse.Namespace) -> RunRequest:
    """The request `mlharness run` makes of its parsed arguments (checked before the run: a typo
    must not cost a long run)."""
    tests: list[str] = []
    if getattr(args, "compliance", None):
        from mlharness.submission.compliance import parse_tests

        tests = parse_tests(args.compliance)
    return request_from_args(args, model=args.model, profile=_profile_levels(args.profile), compliance=tests,
                             command=_as_typed(args))


def cmd_run(args: argparse.Namespace) -> int:
    from mlharness import run
    from mlharness.running.resolve import resolved_for_run

    request = resolved_for_run(request_of(args))
    if request.command:  # as typed, after the environment settings it runs with (VAR=value)
        typed = [*environment_assignments(request), *shlex.split(request.command)]
        request = replace(request, command=shlex.join(typed))
    tests = list(request.compliance)
    record = run(request)
    print(format_summary(record))
    verdict = record.accuracy_verdict
    if tests:
        from mlharness.submission.compliance import format_outcomes, run_compliance

        outcomes = run_compliance(replace(request, compliance=()), tests, Path(record.results_path))
        print(format_outcomes(outcomes))
        verdict = "FAIL" if any(o["verdict"] == "FAIL" for o in outcomes.values()) else verdict
    return 1 if verdict == "FAIL" else 0


def _as_typed(args: argparse.Namespace) -> str:
    """The command as the user typed it when it was `mlharness run`; other callers (`submission run`)
    leave it to the runner, which writes the equivalent run command."""
    argv = getattr(args, "argv", None) or []
    return shlex.join(["mlharness", *argv]) if argv[:1] == ["run"] else ""


def _profile_levels(text: str | None) -> list[str]:
    if not text:
        return []
    from mlharness.profiling import parse_levels

    return parse_levels(text)


def format_summary(record: RunRecord) -> str:
    perf = record.perf
    lines = [f"{record.model_name} ({record.backend}) {record.scenario} {record.mode}: {record.status}"]
    if perf is not None:
        lines.append(f"  LoadGen result : {perf.result}")
        if perf.metric is not None:
            lines.append(f"  {perf.metric.label} : {perf.metric.value}")
        for key in ("p50_latency_ns", "p90_latency_ns", "p99_latency_ns"):
            if getattr(perf, key) is not None:
                lines.append(f"  {key.split('_')[0]} latency : {_latency_text(getattr(perf, key))}")
        from mlharness.records.token_metrics import summary_lines as token_lines

        lines.extend(token_lines(perf.tokens))  # a generative model's TTFT, TPOT and tokens/s (LoadGen's token mode)
    lines.extend(_cold_start_lines(record.cold))
    for mode, logged in record.loadgen_logs.items():
        # An accuracy test's token counts; a performance test's are printed with its figures above.
        if mode == "accuracy" and logged.summary is not None:
            from mlharness.records.token_metrics import token_count_lines

            lines.extend(token_count_lines(logged.summary.tokens, mode))
        lines.extend(_network_lines(mode, logged.network))
        for error in logged.errors[:3]:
            lines.append(f"  LoadGen error ({mode}) : {error[:160]}")
    accuracy = record.accuracy_result
    if accuracy is not None:
        values = ", ".join(f"{k}={v:.4f}" for k, v in accuracy.values.items())
        lines.append(f"  accuracy ({accuracy.metric}) : {values}")
        for check in accuracy.checks:
            lines.append(f"    {check.line}")
        if accuracy.verdict:
            lines.append(f"  reference : {accuracy.verdict}")
    lines.append(f"  results : {record.results_path}")
    return "\n".join(lines)


def _latency_text(nanoseconds: float) -> str:
    """A latency with its unit: ms from 1 ms up, else us."""
    value = float(nanoseconds)
    return f"{value / 1e6:.3f} ms" if value >= 1e6 else f"{value / 1e3:.1f} us"


def _network_lines(mode: str, network: Mapping[str, Any] | None) -> list[str]:
    """A run against a server: the client's issue lag, and a loud line when the client fell behind
    (its own delay, not the server's, would then be in the latencies)."""
    if not network:
        return []
    # The network SUT's own facts (mlharness.sut.network): free-form, read as that SUT states them.
    lag, own = network.get("issue_lag_ms") or {}, network.get("client_lag_ms") or {}
    lines = [f"  issue lag ({mode}) : p50 {lag.get('p50', 0):.3f} ms, p99 {lag.get('p99', 0):.3f} ms "
             f"(client's own p99 {own.get('p99', 0):.3f} ms)"]
    if network.get("client_fell_behind"):
        lines.append(f"  WARNING ({mode}) : the client fell behind: its own issue lag p99 {own.get('p99', 0):.3f} ms "
                     f"> issue_lag_limit_ms {network.get('issue_lag_limit_ms')}; latencies include the client's delay")
    return lines


def _cold_start_lines(cold: ColdStart | None) -> list[str]:
    """Load time, first inference, the warm-up and peak memory, for whichever of them the record has."""
    if cold is None:
        return []
    parts = [f"{label} {_duration(value)}" for label, value in (
        ("resolve", cold.resolve_seconds), ("load", cold.load_seconds), ("first inference", cold.first_inference_seconds))
        if value is not None]
    warmup = cold.warmup
    if warmup is not None:
        parts.append(f"warm-up {warmup.queries} queries of {warmup.batch_size} samples in "
                     f"{_duration(warmup.seconds)}" if warmup.queries else "no warm-up")
    memory = []
    if cold.peak_rss_bytes is not None:
        memory.append(f"peak RSS {cold.peak_rss_bytes / 2**20:.0f} MiB")
    device = cold.device_memory
    if device is not None and device.peak_allocated_bytes is not None:
        memory.append(f"peak {device.device} {device.peak_allocated_bytes / 2**20:.0f} MiB allocated")
    return ([f"  cold start : {', '.join(parts)}"] if parts else []) + \
        ([f"  memory : {', '.join(memory)}"] if memory else [])


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a model under LoadGen in one scenario and mode")
    run.add_argument("model", help="model manifest name (under specs/models) or path")
    add_request_arguments(run)  # every run-request flag (mlharness.running.arguments)
    run.set_defaults(func=cmd_run)

