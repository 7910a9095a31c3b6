"""Typed views of a run record's payloads (issue 34 step 2): LoadGen's performance summary (with a
generative run's token figures, mlharness.records.token_metrics.TokenMetrics, as Performance.tokens),
accuracy, cold start, LoadGen's logs per mode and the manifests a run named (a layer benchmark's figures:
mlharness.records.bricks_payload).

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

import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from mlharness.records.loadgen_logs import LATENCY_PERCENTILES, SUMMARY_FIGURES
from mlharness.records.payload_fields import (PayloadView, empty_mapping, finite_figures, int_or_none, number_or_none,
                                              read_only, text_or_none, texts_or_empty)
from mlharness.records.token_metrics import TokenMetrics, is_token_key


# ---- manifests ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ManifestRef(PayloadView):
    """A manifest a run named, as its identity was recorded (model, dataset, hardware, software, reference)."""
    name: str | None = None
    version: str | None = None
    sha256: str | None = None
    path: str | None = None  # the manifest file as the run read it
    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "version", "sha256", "path"})

    @classmethod
    def from_dict(cls, data: Any) -> "ManifestRef":
        s = read_only(data)
        return cls(stored=s, name=text_or_none(s.get("name")), version=text_or_none(s.get("version")),
                   sha256=text_or_none(s.get("sha256")), path=text_or_none(s.get("path")))

    @property
    def label(self) -> str:
        """name@version, as a submission's system description lists hardware."""
        return f"{self.name}@{self.version}"


# ---- performance --------------------------------------------------------------------------------

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
        return cls(text_or_none(data.get("name")), text_or_none(data.get("label")), number_or_none(data.get("value")))


@dataclass(frozen=True)
class Performance(PayloadView):
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
    raw: Mapping[str, Any] = field(default_factory=empty_mapping, repr=False)
    tokens: TokenMetrics = field(default_factory=TokenMetrics)
    KEYS: ClassVar[frozenset[str]] = frozenset({
        "result", "valid", "scenario", "mode", "metric", "raw", "wall_seconds",
        *SUMMARY_FIGURES})

    @classmethod
    def _knows(cls, key: str) -> bool:
        return key in cls.KEYS or is_token_key(key)

    @classmethod
    def from_dict(cls, data: Any) -> "Performance":
        s = read_only(data)
        figures: dict[str, Any] = {key: number_or_none(s.get(key)) for key in SUMMARY_FIGURES}
        for key in ("samples_per_query", "min_query_count", "performance_sample_count"):
            figures[key] = int_or_none(s.get(key))
        return cls(stored=s, result=text_or_none(s.get("result")), valid=s.get("valid") is True,
                   scenario=text_or_none(s.get("scenario")), mode=text_or_none(s.get("mode")),
                   metric=HeadlineMetric.from_dict(s.get("metric")), wall_seconds=number_or_none(s.get("wall_seconds")),
                   raw=read_only(s.get("raw")), tokens=TokenMetrics.from_dict(s), **figures)

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (LoadGen's, the wall time, token figures, keys of a newer
        mlharness), the raw summary and the headline's copy left out: the record's `<scenario>.<key>`."""
        return finite_figures(self.stored, leave_out=("raw", "metric"))

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
class AccuracyCheck(PayloadView):
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
        s = read_only(data)
        expected = s.get("expected")
        return cls(stored=s, name=None if s.get("name") is None else str(s.get("name")),
                   expected=expected if isinstance(expected, list) else number_or_none(expected),
                   tolerance=number_or_none(s.get("tolerance")), min_fraction=number_or_none(s.get("min_fraction")),
                   measured=number_or_none(s.get("measured")), passed=s.get("pass") is True,
                   line=text_or_none(s.get("line")))

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass(frozen=True)
class AccuracyResult(PayloadView):
    """An accuracy test's score (mlharness.running.accuracy.AccuracyReport.as_record)."""
    metric: str | None = None
    # The metric's numeric values: top1, top5, rouge1, ...
    values: Mapping[str, float] = field(default_factory=empty_mapping)
    headline: str | None = None  # the result as one line
    verdict: str | None = None  # PASS/FAIL against the reference log, None without one
    reference: str | None = None  # the reference log checked against
    checks: tuple[AccuracyCheck, ...] = ()
    notes: tuple[str, ...] = ()
    KEYS: ClassVar[frozenset[str]] = frozenset({"metric", "values", "headline", "verdict", "reference", "checks",
                                                "notes"})

    @classmethod
    def from_dict(cls, data: Any) -> "AccuracyResult":
        s = read_only(data)
        values = {str(k): v for k, v in read_only(s.get("values")).items() if number_or_none(v) is not None}
        checks = s.get("checks") if isinstance(s.get("checks"), list) else []
        return cls(stored=s, metric=text_or_none(s.get("metric")), values=types.MappingProxyType(values),
                   headline=text_or_none(s.get("headline")), verdict=text_or_none(s.get("verdict")),
                   reference=text_or_none(s.get("reference")),
                   checks=tuple(AccuracyCheck.from_dict(c) for c in checks if isinstance(c, Mapping)),
                   notes=texts_or_empty(s.get("notes")))


# ---- cold start ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Warmup(PayloadView):
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
        s = read_only(data)
        return cls(stored=s, queries=int_or_none(s.get("queries")), samples=int_or_none(s.get("samples")),
                   batch_size=int_or_none(s.get("batch_size")), seconds=number_or_none(s.get("seconds")),
                   fastest_query_seconds=number_or_none(s.get("fastest_query_seconds")))


@dataclass(frozen=True)
class DeviceMemory(PayloadView):
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
        s = read_only(data)
        return cls(stored=s, device=text_or_none(s.get("device")), source=text_or_none(s.get("source")),
                   peak_allocated_bytes=int_or_none(s.get("peak_allocated_bytes")),
                   peak_reserved_bytes=int_or_none(s.get("peak_reserved_bytes")),
                   used_bytes=int_or_none(s.get("used_bytes")))

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (the record's `coldstart.device_<key>`)."""
        return finite_figures(self.stored)


@dataclass(frozen=True)
class ColdStart(PayloadView):
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
        s = read_only(data)
        return cls(stored=s, **{key: number_or_none(s.get(key)) for key in (
            "resolve_seconds", "enumerate_seconds", "compile_seconds", "load_seconds", "first_inference_seconds")},
                   peak_rss_bytes=int_or_none(s.get("peak_rss_bytes")), warmup=Warmup.from_dict(s.get("warmup")),
                   device_memory=DeviceMemory.from_dict(s.get("device_memory")))

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (the record's `coldstart.<key>`); the warm-up is a setting, not
        a figure, and the device's memory is `device_memory.figures()`."""
        return finite_figures(self.stored)


# ---- LoadGen's logs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadGenLog(PayloadView):
    """One LoadGen test of the run (a mode): the logs kept, the errors and warnings LoadGen logged, how
    the SUT served it, and (an accuracy test) its summary; a performance test's is RunRecord.perf."""
    logs: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    summary: Performance | None = None
    # How the SUT served the test (mlharness.running.loadgen_test.build_sut's facts): free-form, each kind
    # of SUT states its own (batching, the issue path, a server's network figures).
    sut: Mapping[str, Any] = field(default_factory=empty_mapping, repr=False)
    KEYS: ClassVar[frozenset[str]] = frozenset({"logs", "errors", "warnings", "summary", "sut"})

    @classmethod
    def from_dict(cls, data: Any) -> "LoadGenLog":
        s = read_only(data)
        return cls(stored=s, logs=texts_or_empty(s.get("logs")), errors=texts_or_empty(s.get("errors")),
                   warnings=texts_or_empty(s.get("warnings")),
                   summary=Performance.from_dict(s["summary"]) if isinstance(s.get("summary"), Mapping) else None,
                   sut=read_only(s.get("sut")))

    @property
    def network(self) -> Mapping[str, Any] | None:
        """A run against a server: the client's issue lag and whether it fell behind
        (mlharness.sut.network), free-form as the network SUT states it; None otherwise."""
        network = self.sut.get("network")
        return network if isinstance(network, Mapping) and network else None
