"""Timing a brick (mlharness.sut.bricks) or anything else that is one call: warm-up, then repeat until the
95% confidence interval of the median is within ±`tolerance` of it, or the time cap (`measure`,
`Sampler`). A brick's calls are made as the model makes them: through an IOBinding over memory allocated
once, its inputs written again before every call (`fresh_bound_call`), and for a brick with large
weights the rest of the model's weights passed through the caches first (`evicting`). The cost of an
empty session call is measured the same way so the composition can subtract it
(mlharness.bricks.compose)."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from mlharness.sut.backends.onnx_types import NUMPY_OF_ORT
from mlharness.sut.bricks import Brick, weight_bytes

@dataclass(frozen=True)
class ConfidenceRule:
    """Repeat until the 95% CI of the median is within ±tolerance of it (at least min_repeats), or cap."""
    tolerance: float = 0.02
    min_repeats: int = 10
    warmup_repeats: int = 3
    time_cap: float = 2.0  # seconds of timed calls per measurement
    # Warm-up also lasts at least this long: a fresh session's first calls of a microsecond kernel are
    # slower (caches, the thread pool waking), and three of them are not enough to pass that.
    warmup_seconds: float = 0.02
    # ...or until this many calls, whichever comes first (never fewer than warmup_repeats): a kernel of a
    # few microseconds settles within its first ten calls, and 20 ms of it was thousands of calls, most of
    # a zoo's bricks time (docs/notes/bricks-2026-11-28.md).
    warmup_max_calls: int = 100

    def describe(self) -> dict[str, Any]:
        return {"confidence": 0.95, "tolerance": self.tolerance, "min_repeats": self.min_repeats,
                "warmup_repeats": self.warmup_repeats, "warmup_seconds": self.warmup_seconds,
                "warmup_max_calls": self.warmup_max_calls, "time_cap_seconds": self.time_cap}


@dataclass(frozen=True)
class Measurement:
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    repeats: int
    stable: bool  # the CI met the tolerance before the cap
    seconds: float  # wall time spent, warm-up and set-up included

    def describe(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "ci_low_ms": self.ci_low_ms, "ci_high_ms": self.ci_high_ms,
                "repeats": self.repeats, "stable": self.stable, "seconds": self.seconds}


def median_ci(sorted_values: Sequence[float], z: float = 1.959964) -> tuple[float, float, float]:
    """(median, low, high): the distribution-free confidence interval of the median by order statistics
    (normal approximation of the binomial ranks; the whole range below 6 values)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no values")
    median = float(np.median(sorted_values))
    half = z * math.sqrt(n) / 2
    low_rank = max(int(math.floor(n / 2 - half)), 1)  # 1-based ranks
    high_rank = min(int(math.ceil(n / 2 + 1 + half)), n)
    return median, float(sorted_values[low_rank - 1]), float(sorted_values[high_rank - 1])


class Sampler:
    """Timed calls of one thing, kept so more can be added later (the suite's estimate-level rule asks
    the bricks that matter most for more calls). Milliseconds.

    `phases` says where its wall seconds went: `setup` (the session, weight prepacking included),
    `warmup`, `prepare` (`before_each`: rewriting inputs, evicting), `timed` (inside the timed calls)
    and `loop` (the rest: the clock, bookkeeping)."""

    def __init__(self, call: Callable[[], Any], before_each: Callable[[], Any] | None = None,
                 setup_seconds: float = 0.0, warmup_repeats: int = 3, warmup_seconds: float = 0.0,
                 warmup_max_calls: int | None = None):
        self.call, self.before_each = call, before_each
        self.times: list[float] = []
        self.timed = 0.0  # seconds inside the timed calls
        self.seconds = setup_seconds  # wall seconds spent, set-up and warm-up included
        self.phases = {"setup": setup_seconds, "warmup": 0.0, "prepare": 0.0, "timed": 0.0, "loop": 0.0}
        started = time.perf_counter()
        calls = 0
        most = math.inf if warmup_max_calls is None else warmup_max_calls  # None: the seconds alone end it
        while calls < warmup_repeats or (calls < most and time.perf_counter() - started < warmup_seconds):
            if before_each is not None:
                before_each()
            call()
            calls += 1
        self.phases["warmup"] = time.perf_counter() - started
        self.seconds += self.phases["warmup"]

    @classmethod
    def by_rule(cls, call: Callable[[], Any], rule: ConfidenceRule, before_each: Callable[[], Any] | None = None,
                setup_seconds: float = 0.0) -> "Sampler":
        """A sampler warmed up as `rule` says (its repeats, then its seconds or its call cap)."""
        return cls(call, before_each, setup_seconds, rule.warmup_repeats, rule.warmup_seconds, rule.warmup_max_calls)

    def extend(self, count: int) -> None:
        started = time.perf_counter()
        clock, call, before_each = time.perf_counter_ns, self.call, self.before_each
        preparing = 0
        for _ in range(count):
            if before_each is not None:
                ready = clock()
                before_each()
                preparing += clock() - ready
            before = clock()
            call()
            elapsed = clock() - before
            self.times.append(elapsed / 1e6)
            self.timed += elapsed / 1e9
            self.phases["timed"] += elapsed / 1e9
        spent = time.perf_counter() - started
        self.phases["prepare"] += preparing / 1e9
        self.phases["loop"] = self.seconds + spent - sum(v for k, v in self.phases.items() if k != "loop")
        self.seconds += spent

    def release(self) -> None:
        """Let go of the call and what it holds (a session, its weights, buffers); the times stay."""
        self.call = self.before_each = None

    def stable(self, tolerance: float) -> bool:
        median, low, high = median_ci(sorted(self.times))
        return median > 0 and low >= median * (1 - tolerance) and high <= median * (1 + tolerance)

    def measurement(self, tolerance: float) -> Measurement:
        median, low, high = median_ci(sorted(self.times))
        return Measurement(median, low, high, len(self.times), self.stable(tolerance), self.seconds)


def measure(call: Callable[[], Any], rule: ConfidenceRule, setup_seconds: float = 0.0,
            before_each: Callable[[], Any] | None = None) -> Measurement:
    """Time `call` until the rule is met (see ConfidenceRule); milliseconds. `before_each` runs before
    every call, untimed."""
    sampler = Sampler.by_rule(call, rule, before_each, setup_seconds)
    sampler.extend(rule.min_repeats)
    while not sampler.stable(rule.tolerance) and sampler.timed < rule.time_cap:
        # Check every max(min_repeats, n / 10) calls, and never run far past the cap.
        sampler.extend(max(1, min(max(rule.min_repeats, len(sampler.times) // 10), calls_left(sampler, rule.time_cap))))
    return sampler.measurement(rule.tolerance)


def calls_left(sampler: Any, cap: float) -> int:
    """About how many more calls of `sampler` (its `times` and `timed` so far) fit before its timed
    calls reach `cap` seconds; at least 1."""
    per_call = sampler.timed / max(len(sampler.times), 1)
    return int((cap - sampler.timed) / per_call) + 1 if per_call > 0 else 10**6


def session_call(session: Any, feed: dict[str, np.ndarray]) -> Callable[[], Any]:
    """One run of `session` on `feed` (contiguous arrays, wrapped by ONNX Runtime without a copy). Plain
    `run`, as the harness's backend calls it: `run_with_ort_values` costs about 30 us more a call here."""
    values = {name: np.ascontiguousarray(array) for name, array in feed.items()}
    outputs = [o.name for o in session.get_outputs()]
    run = session.run
    return lambda: run(outputs, values)


def fresh_inputs_call(session: Any, feed: dict[str, np.ndarray]) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(call, before_each) for `measure`: before every timed call the inputs are written again (same
    values, same memory), as the node that produces them in the model has just written them. Without
    it a brick reads inputs every core holds cached read-only from the previous call, which on this
    2-core machine made the composed estimate of light_resnet50 7% and of light_squeezenet 14% too low
    with 2 threads (docs/notes/bricks-2026-11-27.md)."""
    arrays = {name: np.array(array, copy=True, order="C") for name, array in feed.items()}
    originals = {name: array.copy() for name, array in arrays.items()}

    def rewrite() -> None:
        for name, array in arrays.items():
            np.copyto(array, originals[name])

    return session_call(session, arrays), rewrite


def bound_call(session: Any, feed: dict[str, np.ndarray]) -> tuple[Callable[[], Any], dict[str, np.ndarray],
                                                                   dict[str, np.ndarray]]:
    """(call, inputs, outputs): one run of `session` through an IOBinding made once. The inputs are
    bound over the returned arrays (a copy of `feed`; write them in place to give the kernel fresh
    inputs), the outputs over arrays allocated once, so a call allocates nothing. With `session.run`
    each call allocated its outputs (fresh pages for a large one), which the model's arena does not:
    that overhead, unlike the call's own, is not in the empty call and inflated small kernels
    (docs/notes/bricks-2026-11-27.md). The binding is run through the session's native object: the Python wrapper's
    checks cost about 35 us a call with onnxruntime 1.31, the native call about 1 us."""
    import onnxruntime as ort

    inputs = {name: np.array(array, copy=True, order="C") for name, array in feed.items()}
    binding = session.io_binding()
    for name, array in inputs.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
    outputs = {}
    for info in session.get_outputs():
        shape, dtype = tuple(info.shape), NUMPY_OF_ORT.get(info.type)
        if dtype is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            binding.bind_output(info.name)  # a type or shape not known ahead: ONNX Runtime allocates it per call
            continue
        outputs[info.name] = np.empty(shape, dtype)
        binding.bind_ortvalue_output(info.name, ort.OrtValue.ortvalue_from_numpy(outputs[info.name]))
    options = ort.RunOptions()
    native_session, native_binding = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
    # The call holds everything the binding points into: the session, the binding and both sets of
    # arrays (ONNX Runtime writes the outputs into their memory; freed, it would write into anything).
    held = (session, binding, inputs, outputs)
    if native_session is not None and native_binding is not None and hasattr(native_session, "run_with_iobinding"):
        run = native_session.run_with_iobinding
        return (lambda held=held: run(native_binding, options)), inputs, outputs
    return (lambda held=held: session.run_with_iobinding(binding, options)), inputs, outputs



def fresh_bound_call(session: Any, feed: dict[str, np.ndarray]) -> tuple[Callable[[], Any], Callable[[], None]]:
    """`fresh_inputs_call` through `bound_call`: outputs written into memory allocated once, inputs
    written again (untimed) before every call. What a brick's timed calls are."""
    call, inputs, outputs = bound_call(session, feed)
    # The whole input is copied back from a saved copy. Writing one element per cache line instead (the
    # line is as dirty, at a third of the cost) made the estimates worse: shufflenet-v2-x0.5 -15% and
    # -21% of a plain session against -10% and -4%, squeezenet-1.1 -7% against -4% and -3%
    # (docs/notes/bricks-2026-11-27.md). Reading the saved copy passes as many bytes again through the caches, as the
    # model's other nodes do between two calls of this one.
    originals = {name: array.copy() for name, array in inputs.items()}

    def rewrite() -> None:
        for name, array in inputs.items():
            np.copyto(array, originals[name])

    rewrite.inputs, rewrite.outputs = inputs, outputs  # type: ignore[attr-defined]  # the bound arrays, for tests
    return call, rewrite


# A brick whose weights are larger than this is measured with the rest of the model's weights passed
# through the caches before each call (`evicting`): in the model they are, and a large Gemm whose
# weights stay cached between isolated calls ran 1.5-2.5x faster than in the model (light_alexnet's
# 144 MiB fc6 here: estimate -22.5% of a plain session without, -3.1% with).
LARGE_WEIGHTS_BYTES = 8 << 20
EVICT_CAP_BYTES = 1 << 30


def evicting(before_each: Callable[[], None], brick: Brick, model_weights: int) -> Callable[[], None]:
    """`before_each` preceded, for a brick with large weights, by writing as many bytes as the rest of
    the model's weights (capped at EVICT_CAP_BYTES): what passes through the caches between two calls
    of this node in the model. Other bricks get `before_each` as it is."""
    own = weight_bytes(brick)
    if own <= LARGE_WEIGHTS_BYTES:
        return before_each
    buffer = np.zeros(min(max(model_weights - own, 0), EVICT_CAP_BYTES), np.uint8)

    def evict_then() -> None:
        buffer.fill(1)
        before_each()

    return evict_then


def empty_session_model(opset: Any, ir_version: int) -> bytes:
    """A model that does nothing (no node: its output is its input): what a session call costs by
    itself. With no node, what the executor spends on a node stays in each brick's net time, as it does
    in the model; an Identity node here took it out of every brick (0.1-0.3 us a node here: 3-6% of a
    model of 400 small nodes, such as shufflenet-v2-x0.5's 427)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([], "empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=opset, ir_version=ir_version).SerializeToString()


def new_session(model: bytes | str, session_options: Any, providers: Sequence[str]) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(model, session_options, providers=list(providers))


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
