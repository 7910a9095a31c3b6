"""A bricks run's model made ready to measure: the graph as ONNX Runtime executes it, decomposed into bricks
(mlharness.sut.bricks) on the run's first samples, and what every measurement of the run shares: the
sessions' options, the fingerprint bricks are stored under, the variant the estimate is composed of,
and the measurements the results database already holds for them."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlharness.bricks.rows import EMPTY_CALL_KEY, Row, fingerprint, known_measurements, parse_variant, variant_name
from mlharness.records import results
from mlharness.records.run_record import RunRecord
from mlharness.running.progress import quiet_from_env
from mlharness.running.request import RunRequest
from mlharness.sut import bricks as sb
from mlharness.sut.brick_timing import (
    ConfidenceRule,
    Measurement,
    Sampler,
    bound_call,
    empty_session_model,
    evicting,
    fresh_bound_call,
    measure,
    new_session,
)
from mlharness.sut.runtime import Runtime
from mlharness.sut.warmup import prepare_batch

EMPTY_CALL_CAP_SECONDS = 0.5  # the empty call's time cap: a microsecond call reaches its rule long before


@dataclass(frozen=True)
class Prepared:
    """The decomposed model and the run's shared facts; `started` is when decomposing began (the run's
    bricks clock, which the summary's seconds count from)."""
    runtime: Runtime
    request: RunRequest
    record: RunRecord
    staged_dir: Path
    decomposition: sb.Decomposition
    feeds: dict[str, np.ndarray]  # the batch the bricks' inputs were captured from
    providers: list[str]
    level: str  # the model session's optimization level, by name
    threads: int  # its intra-op threads
    fingerprint: str
    main_variant: str  # as executed: the model session's threads and level, its first provider
    model_weights: int
    empty_model: bytes  # a model that does nothing: what a session call costs by itself
    known: dict[tuple[str, str], Row]  # (brick key, variant) -> stored measurement
    started: float
    decompose_seconds: float

    @property
    def model_name(self) -> str:
        return self.runtime.model.name

    def session_options(self, threads: int, opt_level: str) -> Any:
        """The model session's options at another thread count and optimization level."""
        options = self.runtime.backend.new_session_options()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = sb.ort_level(opt_level)
        return options

    def open_sampler(self, brick: sb.Brick, variant: str, rule: ConfidenceRule) -> Sampler:
        """A session of `brick` in `variant`, warmed up and with a first sample (rule.min_repeats calls);
        the estimate's rule (or the lower bound's) decides how many more it takes."""
        threads, opt_level, provider = parse_variant(variant)
        setup_started = time.perf_counter()
        session = new_session(brick.model_bytes, self.session_options(threads, opt_level), [provider])
        setup = time.perf_counter() - setup_started
        call, fresh = fresh_bound_call(session, brick.feed)
        sampler = Sampler.by_rule(call, rule, evicting(fresh, brick, self.model_weights), setup)
        sampler.extend(rule.min_repeats)
        return sampler

    def measure_empty_call(self, threads: int) -> Measurement:
        """The cost of a session call that does nothing at `threads`, called as a brick is."""
        session = new_session(self.empty_model, self.session_options(threads, sb.AS_EXECUTED), self.providers[:1])
        empty_call, _, _ = bound_call(session, {"x": np.zeros(1, np.float32)})
        return measure(empty_call, ConfidenceRule(time_cap=EMPTY_CALL_CAP_SECONDS))


def prepare(runtime: Runtime, request: RunRequest, record: RunRecord, where: results.ScenarioDir) -> Prepared:
    """Optimize the model's graph as its session does, decompose it on the first `batch` samples (and
    check its shapes on the next ones), and read what is already stored for its bricks."""
    backend, batch = runtime.backend, request.batch
    count = len(runtime.staged)
    first = [i % count for i in range(batch)]
    second = [(batch + i) % count for i in range(batch)]
    feeds = prepare_batch(runtime.staged, first)
    check_feeds = prepare_batch(runtime.staged, second) if second != first else None
    providers = list(backend.providers)
    level = level_name(backend.session_options.graph_optimization_level)
    staged_dir = where.stage()
    started = time.perf_counter()
    optimized = sb.optimized_graph(Path(backend.graph_path), backend.new_session_options(), providers,
                                   staged_dir / "optimized.onnx")
    decomposition = sb.decompose(optimized, feeds, check_feeds, backend.new_session_options, providers, level,
                                 str(runtime.model.path))
    decompose_seconds = time.perf_counter() - started
    say(f"{runtime.model.name}: {decomposition.node_count} nodes of the graph as executed "
        f"({level}), {len(decomposition.bricks)} unique bricks", request)
    fp = fingerprint(record.system, record.hardware, record.software.get("versions", {}), providers)
    return Prepared(
        runtime=runtime, request=request, record=record, staged_dir=staged_dir, decomposition=decomposition,
        feeds=feeds, providers=providers, level=level, threads=int(backend.intra_op_threads), fingerprint=fp,
        main_variant=variant_name(int(backend.intra_op_threads), sb.AS_EXECUTED, providers[0]),
        model_weights=sb.model_weight_bytes(decomposition),
        empty_model=empty_session_model(optimized.opset_import, optimized.ir_version),
        known=known_measurements(request, fp, [b.key for b in decomposition.bricks] + [EMPTY_CALL_KEY]),
        started=started, decompose_seconds=decompose_seconds)


def level_name(level: Any) -> str:
    """ONNX Runtime's GraphOptimizationLevel by name: ORT_ENABLE_ALL -> enable_all."""
    return str(level).rsplit(".", 1)[-1].removeprefix("ORT_").lower()


def say(text: str, request: RunRequest) -> None:
    """A line on stderr about the run's progress, unless it is quiet."""
    if not (request.quiet or quiet_from_env()):
        print(f"[bricks] {text}", file=sys.stderr, flush=True)
