"""LoadGen's token-latency figures (issue 19): with `use_token_latencies`, LoadGen's summary adds the
time to first token (TTFT: from the query's issue to the SUT's FirstTokenComplete), the time per output
token (TPOT: the rest of the sample's latency over its remaining n_tokens - 1) and tokens per second.
They become performance figures `ttft_<stat>_ns`, `tpot_<stat>_ns` (stat: min, max, mean, p50, p90,
p95, p97, p99, p99_9) and `tokens_per_second` (Offline) / `completed_tokens_per_second` (Server), so
the database names them `<scenario>.ttft_p90_ns` and so on (record_metrics: lower is better for
`_ns`, higher for `per_second`)."""
from __future__ import annotations

import re
from typing import Any, Mapping

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


def summary_lines(performance: Mapping[str, Any]) -> list[str]:
    """What a run's summary prints of its token figures: TTFT and TPOT p50/p90/p99 in ms, tokens/s."""
    lines = []
    for kind, label in (("ttft", "time to first token (TTFT)"), ("tpot", "time per output token (TPOT)")):
        parts = [f"{p} {performance[f'{kind}_{p}_ns'] / 1e6:.2f} ms" for p in ("p50", "p90", "p99")
                 if isinstance(performance.get(f"{kind}_{p}_ns"), (int, float))]
        if parts:
            lines.append(f"  {label} : {', '.join(parts)}")
    for key, label in (("tokens_per_second", "output tokens per second"),
                       ("completed_tokens_per_second", "completed output tokens per second")):
        if isinstance(performance.get(key), (int, float)):
            lines.append(f"  {label} : {performance[key]:.2f}")
    return lines
