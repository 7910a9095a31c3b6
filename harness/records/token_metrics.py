"""LoadGen's token-latency figures (issue 19): with `use_token_latencies`, LoadGen's summary adds the
time to first token (TTFT: from the query's issue to the SUT's FirstTokenComplete), the time per output
token (TPOT: the rest of the sample's latency over its remaining n_tokens - 1) and tokens per second.
They become performance figures `ttft_<stat>_ns`, `tpot_<stat>_ns` (stat: min, max, mean, p50, p90,
p95, p97, p99, p99_9) and `tokens_per_second` (Offline) / `completed_tokens_per_second` (Server), so
the database names them `<scenario>.ttft_p90_ns` and so on (record_metrics: lower is better for
`_ns`, higher for `per_second`).

LoadGen does not report the inter-token latency distribution or goodput; the token SUT keeps every
token's time and `sut_token_figures` adds them, measured on the SUT's clock from issue_query (a few
microseconds after LoadGen's issue): `itl_<stat>_ns` (the gaps between consecutive tokens of a
sample, over all samples) and, when the run has TTFT and TPOT limits, `goodput_fraction` (samples
whose TTFT and TPOT both met them), `goodput_samples` and `goodput_samples_per_second` (those samples
over the test's span, first issue to last token), and the limits as text (`goodput_limits`). A sample's
TPOT here is LoadGen's: the time from its first token to its last over n_tokens - 1."""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence

_PERCENTILE = re.compile(r"^(\d+(?:\.\d+)?) percentile (first token latency|time to output token) \(ns\)$")
_STAT = re.compile(r"^(Min|Max|Mean) (First Token latency|Time per Output Token) \(ns\)$")
_KIND = {"first token latency": "ttft", "First Token latency": "ttft",
         "time to output token": "tpot", "Time per Output Token": "tpot"}
_THROUGHPUT = {"Tokens per second": "tokens_per_second", "Completed tokens per second": "completed_tokens_per_second"}


def _pct(text: str) -> str:
    return f"p{float(text):g}".replace(".", "_")


def token_figures(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The token figures among a parsed summary's raw `label: value` pairs (empty without token mode)."""
    found: dict[str, Any] = {}
    for label, value in raw.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if label in _THROUGHPUT:
            found[_THROUGHPUT[label]] = value
        elif match := _PERCENTILE.match(label):
            found[f"{_KIND[match.group(2)]}_{_pct(match.group(1))}_ns"] = value
        elif match := _STAT.match(label):
            found[f"{_KIND[match.group(2)]}_{match.group(1).lower()}_ns"] = value
    return found


def _rank(ordered: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted values (the smallest value with `fraction` of them at or below)."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def sut_token_figures(samples: Sequence[tuple[int, Sequence[int]]], ttft_limit_ms: float | str | None = None,
                      tpot_limit_ms: float | str | None = None) -> dict[str, Any]:
    """`samples`: (issued ns, [each token's time ns]) per completed sample. The inter-token latency
    distribution, and goodput when both limits are given (see the module's doc)."""
    gaps = sorted(b - a for _, times in samples for a, b in zip(times, times[1:]))
    found: dict[str, Any] = {}
    if gaps:
        found.update({f"itl_{name}_ns": int(_rank(gaps, fraction)) for name, fraction in
                      (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))})
        found.update(itl_min_ns=int(gaps[0]), itl_max_ns=int(gaps[-1]), itl_mean_ns=int(sum(gaps) / len(gaps)))
    timed = [(issued, times) for issued, times in samples if times]
    if ttft_limit_ms is None or tpot_limit_ms is None or not timed:
        return found
    ttft_limit_ms, tpot_limit_ms = float(ttft_limit_ms), float(tpot_limit_ms)  # user.conf values are text
    good = 0
    for issued, times in timed:
        ttft = times[0] - issued
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        good += ttft <= ttft_limit_ms * 1e6 and tpot <= tpot_limit_ms * 1e6
    span_s = (max(times[-1] for _, times in timed) - min(issued for issued, _ in timed)) / 1e9
    found.update(goodput_fraction=good / len(timed), goodput_samples=good,
                 goodput_samples_per_second=good / span_s if span_s > 0 else 0.0,
                 goodput_limits=f"TTFT <= {float(ttft_limit_ms):g} ms and TPOT <= {float(tpot_limit_ms):g} ms")
    return found


Step = tuple[int, int, int, int]  # an engine's forward step: (start ns, end ns, sequences, query tokens)


def measured_steps(steps: Sequence[Step] | None, since: int) -> list[Step]:
    """The engine's steps that began once the test had issued its first query (the warm-up's are dropped)."""
    return sorted(step for step in steps or () if step[0] >= since)


def sample_clock(issued: int, admitted: int, tokens: Sequence[int], steps: Sequence[Step],
                 ends: Sequence[int]) -> tuple[int, int, int, int]:
    """(handed to the engine, prefill start, first token, last token) of one sample that made tokens, issued
    at `issued`, handed to the engine at `admitted`, whose tokens the SUT was handed at `tokens`: the one
    split of a sample's time that the run's figures (sut_stage_figures) and its timeline
    (mlharness.profiling.token_timeline) share. A hand-off stamp outside issue..first token (a sample the SUT never
    stamped) is clamped into it. Where the engine records its steps (`steps` sorted, `ends` their end
    times), the rest is on the engine's clock: the start of the step that made the first token (a token
    belongs to the last step that ended before the SUT was handed it) and the ends of the steps that made
    the first and last tokens; the engine may hold a sequence in its own queue, and its dispatcher hands
    tokens over after the step. Otherwise (no steps, or none inside the sample) the SUT's stamps."""
    admitted = min(max(admitted, issued), tokens[0])
    first_step = bisect.bisect_right(ends, tokens[0]) - 1
    if first_step >= 0 and steps[first_step][0] >= admitted:
        return admitted, steps[first_step][0], ends[first_step], ends[bisect.bisect_right(ends, tokens[-1]) - 1]
    return admitted, admitted, tokens[0], tokens[-1]


def sut_stage_figures(samples: Sequence[tuple[int, int, Sequence[int]]], steps: Sequence[Step] = ()) -> dict[str, Any]:
    """`samples`: (issued ns, admitted ns, [each token's time ns]); `steps`: the engine's measured steps,
    where it records them (measured_steps). Where a sample's time went, on the SUT's clock: `queue`
    (issued until the scheduler gave it to the engine: waiting for room in the batch), `prefill` (the
    prompt's forward steps until its first token, shared with the other sequences of the batch) and
    `decode` (first token to last); with the engine's steps, prefill and decode are on its clock
    (sample_clock) and `engine_queue` is the time handed to the engine before its prefill began (without
    them that time is in prefill). Each as `<stage>_p50_ns`, `_p90_ns`, and the stage's share of all
    samples' time (`<stage>_share`)."""
    stages: dict[str, list[int]] = {"queue": [], "engine_queue": [], "prefill": [], "decode": []}
    ends = [end for _, end, _, _ in steps]
    for issued, admitted, times in samples:
        if not times:
            continue
        admitted, started, first, last = sample_clock(issued, admitted, times, steps, ends)
        stages["queue"].append(admitted - issued)
        if steps:
            stages["engine_queue"].append(started - admitted)
        stages["prefill"].append(first - started)
        stages["decode"].append(last - first)
    total = sum(sum(values) for values in stages.values())
    found: dict[str, Any] = {}
    for name, values in stages.items():
        if values:
            ordered = sorted(values)
            found[f"{name}_p50_ns"] = int(_rank(ordered, 0.5))
            found[f"{name}_p90_ns"] = int(_rank(ordered, 0.9))
            found[f"{name}_share"] = round(sum(values) / total, 4) if total else 0.0
    return found


# ---- the typed view of a run's token figures ----------------------------------------------------
# Defined here, beside the figures it names, because this module stays a leaf (the SUT imports it);
# mlharness.records.payloads.Performance.tokens is one of these.

TOKEN_STATS = ("min", "max", "mean", "p50", "p90", "p95", "p97", "p99", "p99_9")
TOKEN_KINDS = ("ttft", "tpot", "itl")
SAMPLE_STAGES = ("queue", "engine_queue", "prefill", "decode")
_TOKEN_KEY = re.compile(rf"^(?:(?:{'|'.join(TOKEN_KINDS)})_(?:{'|'.join(TOKEN_STATS)})_ns"
                        rf"|(?:{'|'.join(SAMPLE_STAGES)})_(?:p50_ns|p90_ns|share))$")
_TOKEN_KEYS = frozenset({"tokens_per_second", "completed_tokens_per_second", "goodput_fraction", "goodput_samples",
                         "goodput_samples_per_second", "goodput_limits", "output_tokens_client", "output_tokens_server",
                         "token_count_mismatch_share", "token_count_source"})


def is_token_key(key: str) -> bool:
    """Whether a performance summary's key is a token figure (TokenMetrics types it)."""
    return key in _TOKEN_KEYS or bool(_TOKEN_KEY.match(key))


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class LatencyStats:
    """One token latency's distribution (ns): TTFT, TPOT (LoadGen's) or inter-token latency (the SUT's)."""
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p97: float | None = None
    p99: float | None = None
    p99_9: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], kind: str) -> "LatencyStats":
        return cls(**{stat: _number(data.get(f"{kind}_{stat}_ns")) for stat in TOKEN_STATS})

    def stat(self, name: str) -> float | None:
        """A statistic by name (p50, p90, p99, ...)."""
        return getattr(self, name)


@dataclass(frozen=True)
class StageShare:
    """Where a sample's time went on the SUT's clock, one stage (sut_stage_figures)."""
    p50_ns: float | None = None
    p90_ns: float | None = None
    share: float | None = None  # the stage's part of all samples' time


@dataclass(frozen=True)
class TokenMetrics:
    """A generative run's token figures, among its performance summary's keys (this module's doc):
    LoadGen's TTFT, TPOT and tokens/s, the SUT's inter-token latency, goodput and time per stage, and the
    output token counts of a run against an LLM server. A key missing (an older record, a run without
    token mode) or of another type reads as None; the summary's other keys are Performance's."""
    ttft: LatencyStats = field(default_factory=LatencyStats)
    tpot: LatencyStats = field(default_factory=LatencyStats)
    itl: LatencyStats = field(default_factory=LatencyStats)
    tokens_per_second: float | None = None  # Offline
    completed_tokens_per_second: float | None = None  # Server
    goodput_fraction: float | None = None
    goodput_samples: int | None = None
    goodput_samples_per_second: float | None = None
    goodput_limits: str | None = None  # the TTFT and TPOT limits, as text
    stages: Mapping[str, StageShare] = field(default_factory=lambda: MappingProxyType({}))  # those measured, in order
    output_tokens_client: int | None = None
    output_tokens_server: int | None = None
    token_count_mismatch_share: float | None = None
    token_count_source: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "TokenMetrics":
        """The token figures among a summary's keys (a performance dict, an accuracy test's summary, or
        the SUT's figures as measured)."""
        s: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        stages = {name: StageShare(_number(s.get(f"{name}_p50_ns")), _number(s.get(f"{name}_p90_ns")),
                                   _number(s.get(f"{name}_share")))
                  for name in SAMPLE_STAGES if _number(s.get(f"{name}_share")) is not None}
        limits, source = s.get("goodput_limits"), s.get("token_count_source")
        return cls(ttft=LatencyStats.from_dict(s, "ttft"), tpot=LatencyStats.from_dict(s, "tpot"),
                   itl=LatencyStats.from_dict(s, "itl"), tokens_per_second=_number(s.get("tokens_per_second")),
                   completed_tokens_per_second=_number(s.get("completed_tokens_per_second")),
                   goodput_fraction=_number(s.get("goodput_fraction")), goodput_samples=_int(s.get("goodput_samples")),
                   goodput_samples_per_second=_number(s.get("goodput_samples_per_second")),
                   goodput_limits=limits if isinstance(limits, str) else None, stages=MappingProxyType(stages),
                   output_tokens_client=_int(s.get("output_tokens_client")),
                   output_tokens_server=_int(s.get("output_tokens_server")),
                   token_count_mismatch_share=_number(s.get("token_count_mismatch_share")),
                   token_count_source=source if isinstance(source, str) else None)

    def latency(self, kind: str) -> LatencyStats:
        """ttft, tpot or itl."""
        return getattr(self, kind)

    @property
    def output_tokens_per_second(self) -> float | None:
        """Offline's tokens/s, else Server's completed tokens/s."""
        return self.tokens_per_second if self.tokens_per_second is not None else self.completed_tokens_per_second

    @property
    def counted_tokens(self) -> bool:
        """A run against an LLM server: the client's and the server's output token counts were kept."""
        return self.output_tokens_client is not None


def _metrics(figures: TokenMetrics | Mapping[str, Any]) -> TokenMetrics:
    """The typed token figures of a performance summary (or of a dict of token figures, as measured)."""
    return figures if isinstance(figures, TokenMetrics) else TokenMetrics.from_dict(figures)


def summary_lines(performance: TokenMetrics | Mapping[str, Any]) -> list[str]:
    """What a run's summary prints of its token figures: TTFT, TPOT and inter-token latency p50/p90/p99
    in ms, tokens/s, goodput."""
    tokens = _metrics(performance)
    lines = []
    for kind, label in (("ttft", "time to first token (TTFT)"), ("tpot", "time per output token (TPOT)"),
                        ("itl", "inter-token latency (SUT)")):
        stats = tokens.latency(kind)
        parts = [f"{p} {value / 1e6:.2f} ms" for p in ("p50", "p90", "p99") if (value := stats.stat(p)) is not None]
        if parts:
            lines.append(f"  {label} : {', '.join(parts)}")
    for value, label in ((tokens.tokens_per_second, "output tokens per second"),
                         (tokens.completed_tokens_per_second, "completed output tokens per second")):
        if value is not None:
            lines.append(f"  {label} : {value:.2f}")
    shares = [f"{name.replace('_', ' ')} {100 * stage.share:.0f}% (p50 {stage.p50_ns / 1e6:.1f} ms)"
              for name, stage in tokens.stages.items()]
    if shares:
        lines.append(f"  time per sample (SUT) : {', '.join(shares)}")
    lines.extend(token_count_lines(tokens))
    if tokens.goodput_fraction is not None:
        lines.append(f"  goodput ({tokens.goodput_limits or 'the limits'}) : "
                     f"{100 * tokens.goodput_fraction:.1f}% of samples, "
                     f"{tokens.goodput_samples_per_second:.2f} samples/s")
    return lines


def token_count_lines(summary: TokenMetrics | Mapping[str, Any], mode: str = "") -> list[str]:
    """A run against an LLM server: the output tokens as the client's tokenizer and the server's `usage`
    counted them, how often the two differ, and which reached LoadGen (mlharness.sut.network.token_exchange)."""
    tokens = _metrics(summary)
    if not tokens.counted_tokens:
        return []
    server, share = tokens.output_tokens_server, tokens.token_count_mismatch_share
    differ = f", the two differ for {100 * share:.1f}% of samples" if share is not None else ""
    return [f"  output tokens{f' ({mode})' if mode else ''} : client {tokens.output_tokens_client}, server "
            f"{server if server is not None else 'not reported'}{differ}; n_tokens from the "
            f"{tokens.token_count_source}"]


REPORT_COLUMNS = ("TTFT p50/p90/p99 (ms)", "TPOT p50/p90/p99 (ms)", "ITL p50/p90/p99 (ms)", "output tokens/s",
                  "goodput", "queue/prefill/decode share")


def report_row(performance: TokenMetrics | Mapping[str, Any]) -> tuple[str, ...] | None:
    """A report's row of a run's token figures (mlharness.compare.report), None for a run without them."""
    tokens = _metrics(performance)

    def trio(kind: str) -> str:
        stats = tokens.latency(kind)
        values = [stats.stat(p) for p in ("p50", "p90", "p99")]
        return " / ".join(f"{v / 1e6:.1f}" for v in values if v is not None) or "-"

    if tokens.ttft.p50 is None and tokens.itl.p50 is None and tokens.tokens_per_second is None:
        return None
    per_second, goodput = tokens.output_tokens_per_second, tokens.goodput_fraction
    shares = [tokens.stages[name].share if name in tokens.stages else None for name in ("queue", "prefill", "decode")]
    return (trio("ttft"), trio("tpot"), trio("itl"), f"{per_second:.2f}" if per_second is not None else "-",
            f"{100 * goodput:.1f}% ({tokens.goodput_limits or ''})" if goodput is not None else "-",
            " / ".join(f"{100 * v:.0f}%" for v in shares) if all(v is not None for v in shares) else "-")
