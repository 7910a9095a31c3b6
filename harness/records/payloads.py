"""Typed views of a run record's payloads (issue 34 step 2): LoadGen's performance summary (with a
generative run's token figures, mlharness.records.token_metrics.TokenMetrics, as Performance.tokens),
accuracy, cold start, a layer benchmark's figures, LoadGen's logs per mode and the manifests a run named.

A record keeps each payload as the dict run.json holds (RunRecord.performance, .accuracy, .cold_start,
.bricks, .loadgen, .model, ...): that dict is what is written, so run.json and the database keep their
shape. Readers take the typed view instead (RunRecord.perf, .accuracy_result, .cold, .bricks_result,
.loadgen_logs, .model_ref, ...), built by the class's `from_dict`:

- a key the dict lacks (an older record) reads as None (or empty), and so does a value of another type
  (a number that is text): a reader never meets a wrong type;
- `stored` is the dict as read (read-only), so every key stays reachable, and `extra` names the keys the
  view does not type (a newer mlharness's, or one added by hand);
- the views are frozen: a reader cannot change the record through them.

Only what readers read is typed; a figure looked up by a name the user gave (`tune --figure`) or every
numeric key at once (record_metrics.flatten, the site's tables) goes through `figures()`."""
from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from mlharness.records.token_metrics import TokenMetrics, is_token_key

_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


def _frozen(value: Any) -> Mapping[str, Any]:
    """A read-only copy of a mapping; anything else reads as an empty one."""
    return types.MappingProxyType(dict(value)) if isinstance(value, Mapping) else _EMPTY


def _number(value: Any) -> float | int | None:
    """A number as stored (int or float), None for anything else (bool, text, null)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in value) if isinstance(value, (list, tuple)) else ()


def _figures(stored: Mapping[str, Any], leave_out: tuple[str, ...] = ()) -> dict[str, float]:
    """Every finite number among a payload's keys, as a float, in the stored order."""
    found = {}
    for key, value in stored.items():
        number = _number(value)
        if key not in leave_out and number is not None and math.isfinite(number):
            found[key] = float(number)
    return found


@dataclass(frozen=True)
class _View:
    """What every payload view has: the dict it was read from, and the keys it does not type."""
    stored: Mapping[str, Any] = field(default_factory=_empty, repr=False, compare=False)
    KEYS: ClassVar[frozenset[str]] = frozenset()  # the stored keys the typed fields read

    @property
    def extra(self) -> dict[str, Any]:
        """The stored keys this view does not type, with their values."""
        return {k: v for k, v in self.stored.items() if not self._knows(k)}

    @classmethod
    def _knows(cls, key: str) -> bool:
        return key in cls.KEYS


# ---- manifests ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ManifestRef(_View):
    """A manifest a run named, as its identity was recorded (model, dataset, hardware, software, reference)."""
    name: str | None = None
    version: str | None = None
    sha256: str | None = None
    path: str | None = None  # the manifest file as the run read it
    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "version", "sha256", "path"})

    @classmethod
    def from_dict(cls, data: Any) -> "ManifestRef":
        s = _frozen(data)
        return cls(stored=s, name=_text(s.get("name")), version=_text(s.get("version")),
                   sha256=_text(s.get("sha256")), path=_text(s.get("path")))

    @property
    def label(self) -> str:
        """name@version, as a submission's system description lists hardware."""
        return f"{self.name}@{self.version}"


# ---- performance --------------------------------------------------------------------------------

# The latency percentiles LoadGen's summary reports: (key, percentile).
LATENCY_PERCENTILES = (("p50_latency_ns", 50), ("p90_latency_ns", 90), ("p95_latency_ns", 95),
                       ("p97_latency_ns", 97), ("p99_latency_ns", 99), ("p99_9_latency_ns", 99.9))
# Figures LoadGen's summary states besides the percentiles (mlharness.records.loadgen_logs.parse_summary).
_SUMMARY_FIGURES = ("samples_per_second", "completed_samples_per_second", "scheduled_samples_per_second",
                    "min_latency_ns", "max_latency_ns", "mean_latency_ns", "target_qps", "min_duration_ms",
                    "samples_per_query", "min_query_count", "performance_sample_count",
                    "early_stopping_90th_percentile_estimate", "early_stopping_99th_percentile_estimate")


@dataclass(frozen=True)
class HeadlineMetric:
    """The scenario's headline figure as LoadGen's summary names it (loadgen_logs.SCENARIO_METRIC)."""
    name: str | None = None  # samples_per_second, p90_latency_ns, ...
    label: str | None = None  # LoadGen's own label: "Samples per second"
    value: float | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "HeadlineMetric | None":
        if not isinstance(data, Mapping):
            return None
        return cls(_text(data.get("name")), _text(data.get("label")), _number(data.get("value")))


@dataclass(frozen=True)
class Performance(_View):
    """A LoadGen test's summary (mlharness.records.loadgen_logs.parse_summary) with what the run added: its
    wall time, and a generative run's token figures (`tokens`)."""
    result: str | None = None  # LoadGen's verdict: VALID, INVALID
    valid: bool = False
    scenario: str | None = None
    mode: str | None = None
    metric: HeadlineMetric | None = None
    samples_per_second: float | None = None  # Offline
    completed_samples_per_second: float | None = None  # Server
    scheduled_samples_per_second: float | None = None
    min_latency_ns: float | None = None
    max_latency_ns: float | None = None
    mean_latency_ns: float | None = None
    p50_latency_ns: float | None = None
    p90_latency_ns: float | None = None
    p95_latency_ns: float | None = None
    p97_latency_ns: float | None = None
    p99_latency_ns: float | None = None
    p99_9_latency_ns: float | None = None
    early_stopping_90th_percentile_estimate: float | None = None  # ns
    early_stopping_99th_percentile_estimate: float | None = None  # ns
    target_qps: float | None = None
    min_duration_ms: float | None = None
    samples_per_query: int | None = None
    min_query_count: int | None = None
    performance_sample_count: int | None = None
    wall_seconds: float | None = None  # the test's wall time, as the harness measured it
    # Every `label: value` line of mlperf_log_summary.txt, by LoadGen's own labels: free-form (LoadGen's
    # version decides the labels), shown whole by the site and compared whole by the submission packager.
    raw: Mapping[str, Any] = field(default_factory=_empty, repr=False)
    tokens: TokenMetrics = field(default_factory=TokenMetrics)
    KEYS: ClassVar[frozenset[str]] = frozenset({
        "result", "valid", "scenario", "mode", "metric", "raw", "wall_seconds",
        *(key for key, _ in LATENCY_PERCENTILES), *_SUMMARY_FIGURES})

    @classmethod
    def _knows(cls, key: str) -> bool:
        return key in cls.KEYS or is_token_key(key)

    @classmethod
    def from_dict(cls, data: Any) -> "Performance":
        s = _frozen(data)
        figures: dict[str, Any] = {key: _number(s.get(key)) for key in
                                   (*(k for k, _ in LATENCY_PERCENTILES), *_SUMMARY_FIGURES)}
        for key in ("samples_per_query", "min_query_count", "performance_sample_count"):
            figures[key] = _int(s.get(key))
        return cls(stored=s, result=_text(s.get("result")), valid=s.get("valid") is True,
                   scenario=_text(s.get("scenario")), mode=_text(s.get("mode")),
                   metric=HeadlineMetric.from_dict(s.get("metric")), wall_seconds=_number(s.get("wall_seconds")),
                   raw=_frozen(s.get("raw")), tokens=TokenMetrics.from_dict(s), **figures)

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (LoadGen's, the wall time, token figures, keys of a newer
        mlharness), the raw summary and the headline's copy left out: the record's `<scenario>.<key>`."""
        return _figures(self.stored, leave_out=("raw", "metric"))

    def figure(self, key: str) -> float | None:
        """One numeric figure by its key (`tune --figure`), None when the summary has none of that name."""
        return self.figures().get(key)

    def latency_percentiles(self) -> list[tuple[float, float]]:
        """(percentile, latency ns) of each percentile the summary states, lowest first."""
        return [(pct, value) for key, pct in LATENCY_PERCENTILES if (value := getattr(self, key)) is not None]

    @property
    def throughput(self) -> float | None:
        """Samples per second (Offline), else completed samples per second (Server); None for the latency scenarios."""
        for value in (self.samples_per_second, self.completed_samples_per_second):
            if value is not None:
                return float(value)
        return None


# ---- accuracy -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AccuracyCheck(_View):
    """One check against the reference log: an accuracy value within its tolerance (or at least
    `min_fraction` of it), or one sample's output against the expected values."""
    name: str | None = None
    expected: float | list[Any] | None = None  # a value, or a sample's expected outputs
    tolerance: float | None = None
    min_fraction: float | None = None
    measured: float | None = None
    passed: bool = False
    line: str | None = None  # the check as one line of text
    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "expected", "tolerance", "min_fraction", "measured", "pass",
                                                "line"})

    @classmethod
    def from_dict(cls, data: Any) -> "AccuracyCheck":
        s = _frozen(data)
        expected = s.get("expected")
        return cls(stored=s, name=None if s.get("name") is None else str(s.get("name")),
                   expected=expected if isinstance(expected, list) else _number(expected),
                   tolerance=_number(s.get("tolerance")), min_fraction=_number(s.get("min_fraction")),
                   measured=_number(s.get("measured")), passed=s.get("pass") is True, line=_text(s.get("line")))

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass(frozen=True)
class AccuracyResult(_View):
    """An accuracy test's score (mlharness.running.accuracy.AccuracyReport.as_record)."""
    metric: str | None = None
    values: Mapping[str, float] = field(default_factory=_empty)  # the metric's numeric values: top1, top5, rouge1, ...
    headline: str | None = None  # the result as one line
    verdict: str | None = None  # PASS/FAIL against the reference log, None without one
    reference: str | None = None  # the reference log checked against
    checks: tuple[AccuracyCheck, ...] = ()
    notes: tuple[str, ...] = ()
    KEYS: ClassVar[frozenset[str]] = frozenset({"metric", "values", "headline", "verdict", "reference", "checks",
                                                "notes"})

    @classmethod
    def from_dict(cls, data: Any) -> "AccuracyResult":
        s = _frozen(data)
        values = {str(k): v for k, v in _frozen(s.get("values")).items() if _number(v) is not None}
        checks = s.get("checks") if isinstance(s.get("checks"), list) else []
        return cls(stored=s, metric=_text(s.get("metric")), values=types.MappingProxyType(values),
                   headline=_text(s.get("headline")), verdict=_text(s.get("verdict")),
                   reference=_text(s.get("reference")),
                   checks=tuple(AccuracyCheck.from_dict(c) for c in checks if isinstance(c, Mapping)),
                   notes=_texts(s.get("notes")))


# ---- cold start ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Warmup(_View):
    """The warm-up before the timed test (mlharness.sut.warmup.timed_warm_up)."""
    queries: int | None = None
    samples: int | None = None
    batch_size: int | None = None
    seconds: float | None = None
    fastest_query_seconds: float | None = None
    KEYS: ClassVar[frozenset[str]] = frozenset({"queries", "samples", "batch_size", "seconds",
                                                "fastest_query_seconds"})

    @classmethod
    def from_dict(cls, data: Any) -> "Warmup | None":
        if not isinstance(data, Mapping):
            return None
        s = _frozen(data)
        return cls(stored=s, queries=_int(s.get("queries")), samples=_int(s.get("samples")),
                   batch_size=_int(s.get("batch_size")), seconds=_number(s.get("seconds")),
                   fastest_query_seconds=_number(s.get("fastest_query_seconds")))


@dataclass(frozen=True)
class DeviceMemory(_View):
    """The device's memory use (mlharness.resources.device_memory): torch's peaks, or NVML's figure."""
    device: str | None = None
    source: str | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    used_bytes: int | None = None
    KEYS: ClassVar[frozenset[str]] = frozenset({"device", "source", "peak_allocated_bytes", "peak_reserved_bytes",
                                                "used_bytes"})

    @classmethod
    def from_dict(cls, data: Any) -> "DeviceMemory | None":
        if not isinstance(data, Mapping):
            return None
        s = _frozen(data)
        return cls(stored=s, device=_text(s.get("device")), source=_text(s.get("source")),
                   peak_allocated_bytes=_int(s.get("peak_allocated_bytes")),
                   peak_reserved_bytes=_int(s.get("peak_reserved_bytes")), used_bytes=_int(s.get("used_bytes")))

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (the record's `coldstart.device_<key>`)."""
        return _figures(self.stored)


@dataclass(frozen=True)
class ColdStart(_View):
    """Cold start and resources: artifact resolution, model load and first inference seconds, the warm-up,
    peak memory. Which phases a run has depends on its runtime (a server's runs connect, an LLM's
    tokenize), so `figures()` gives every one the record holds."""
    resolve_seconds: float | None = None
    enumerate_seconds: float | None = None
    compile_seconds: float | None = None
    load_seconds: float | None = None
    first_inference_seconds: float | None = None
    peak_rss_bytes: int | None = None
    warmup: Warmup | None = None
    device_memory: DeviceMemory | None = None
    KEYS: ClassVar[frozenset[str]] = frozenset({"resolve_seconds", "enumerate_seconds", "compile_seconds",
                                                "load_seconds", "first_inference_seconds", "peak_rss_bytes",
                                                "warmup", "device_memory"})

    @classmethod
    def from_dict(cls, data: Any) -> "ColdStart":
        s = _frozen(data)
        return cls(stored=s, **{key: _number(s.get(key)) for key in (
            "resolve_seconds", "enumerate_seconds", "compile_seconds", "load_seconds", "first_inference_seconds")},
                   peak_rss_bytes=_int(s.get("peak_rss_bytes")), warmup=Warmup.from_dict(s.get("warmup")),
                   device_memory=DeviceMemory.from_dict(s.get("device_memory")))

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (the record's `coldstart.<key>`); the warm-up is a setting, not
        a figure, and the device's memory is `device_memory.figures()`."""
        return _figures(self.stored)


# ---- a layer benchmark --------------------------------------------------------------------------

@dataclass(frozen=True)
class BricksSummary(_View):
    """A layer benchmark's composed figures (mlharness.bricks.measure and .estimate): the estimate from
    the model's bricks, the lower bound, the whole model as LoadGen measured it, and the time spent."""
    batch: int | None = None
    nodes: int | None = None
    unique_bricks: int | None = None
    reused_bricks: int | None = None
    estimate_ms: float | None = None
    lower_bound_ms: float | None = None
    measured_ms: float | None = None  # the whole model's LoadGen p50, when a measuring run was named
    error_pct: float | None = None  # the estimate against measured_ms
    brick_seconds: float | None = None
    whole_model_seconds: float | None = None
    speedup: float | None = None  # time to the same confidence: the whole model over the bricks
    fingerprint: str | None = None  # the system and stack the bricks were measured on (reuse key)
    KEYS: ClassVar[frozenset[str]] = frozenset({
        "batch", "nodes", "unique_bricks", "reused_bricks", "estimate_ms", "lower_bound_ms", "measured_ms",
        "error_pct", "brick_seconds", "whole_model_seconds", "speedup", "fingerprint"})
    _INTS: ClassVar[tuple[str, ...]] = ("batch", "nodes", "unique_bricks", "reused_bricks")

    @classmethod
    def from_dict(cls, data: Any) -> "BricksSummary":
        s = _frozen(data)
        typed = {key: (_int if key in cls._INTS else _number)(s.get(key)) for key in cls.KEYS - {"fingerprint"}}
        return cls(stored=s, fingerprint=_text(s.get("fingerprint")), **typed)

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (the record's `bricks.<key>`)."""
        return _figures(self.stored)


@dataclass(frozen=True)
class OpTypeRow:
    """One op type's time in the model: through its bricks as executed, and at the lower bound."""
    op_type: str | None = None
    nodes: int | None = None
    measured_ms: float | None = None
    lower_bound_ms: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OpTypeRow":
        return cls(None if data.get("op_type") is None else str(data.get("op_type")), _int(data.get("nodes")),
                   _number(data.get("measured_ms")), _number(data.get("lower_bound_ms")))


@dataclass(frozen=True)
class BricksResult(_View):
    """A layer benchmark's record part (kind BRICKS): its summary, time per op type, and the brick
    measurements this run made (the rows the results database keeps for reuse)."""
    summary: BricksSummary | None = None
    by_op_type: tuple[OpTypeRow, ...] = ()
    # The measurements as result_store's brick_measurements table takes them (mlharness.bricks.rows.Row):
    # the table's columns, read by the store that inserts them.
    measured: tuple[Mapping[str, Any], ...] = ()
    bricks_json: str | None = None  # the run's bricks.json, relative to its folder
    KEYS: ClassVar[frozenset[str]] = frozenset({"summary", "by_op_type", "measured", "bricks_json"})

    @classmethod
    def from_dict(cls, data: Any) -> "BricksResult":
        s = _frozen(data)
        rows = [r for r in s.get("by_op_type") or [] if isinstance(r, Mapping)] \
            if isinstance(s.get("by_op_type"), list) else []
        measured = s.get("measured") if isinstance(s.get("measured"), list) else []
        return cls(stored=s, summary=BricksSummary.from_dict(s["summary"]) if isinstance(s.get("summary"), Mapping)
                   and s["summary"] else None, by_op_type=tuple(OpTypeRow.from_dict(r) for r in rows),
                   measured=tuple(_frozen(r) for r in measured if isinstance(r, Mapping)),
                   bricks_json=_text(s.get("bricks_json")))


# ---- LoadGen's logs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadGenLog(_View):
    """One LoadGen test of the run (a mode): the logs kept, the errors and warnings LoadGen logged, how
    the SUT served it, and (an accuracy test) its summary; a performance test's is RunRecord.perf."""
    logs: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    summary: Performance | None = None
    # How the SUT served the test (mlharness.running.loadgen_test.build_sut's facts): free-form, each kind
    # of SUT states its own (batching, the issue path, a server's network figures).
    sut: Mapping[str, Any] = field(default_factory=_empty, repr=False)
    KEYS: ClassVar[frozenset[str]] = frozenset({"logs", "errors", "warnings", "summary", "sut"})

    @classmethod
    def from_dict(cls, data: Any) -> "LoadGenLog":
        s = _frozen(data)
        return cls(stored=s, logs=_texts(s.get("logs")), errors=_texts(s.get("errors")),
                   warnings=_texts(s.get("warnings")),
                   summary=Performance.from_dict(s["summary"]) if isinstance(s.get("summary"), Mapping) else None,
                   sut=_frozen(s.get("sut")))

    @property
    def network(self) -> Mapping[str, Any] | None:
        """A run against a server: the client's issue lag and whether it fell behind
        (mlharness.sut.network), free-form as the network SUT states it; None otherwise."""
        network = self.sut.get("network")
        return network if isinstance(network, Mapping) and network else None
