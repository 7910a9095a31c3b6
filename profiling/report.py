"""The terminal view of a profile's summary.json (`mlharness profile show`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mlharness.errors import UserError
from mlharness.tables import format_table
from mlharness.profiling.session import SUMMARY_SCHEMA_VERSION

STAGE_ORDER = ("load", "preprocess", "query", "queue_wait", "batch_formation", "predict", "framework_run",
               "postprocess", "complete", "sample", "sut_queue", "engine_queue", "prefill", "decode", "response",
               "harness")


def find_summary(path: Path) -> Path:
    """A scenario result folder, its profile/ folder, or summary.json itself."""
    for candidate in (path / "profile" / "summary.json", path / "summary.json", path):
        if candidate.is_file():
            return candidate
    raise UserError(f"{path}: no profile here (expected profile/summary.json; run with --profile LEVELS)")


def load_summary(path: Path) -> tuple[dict[str, Any], Path]:
    """The summary.json of a result folder (find_summary) and its path, with the sections every
    profile has checked: a summary without them is one line naming the file and the section."""
    found = find_summary(path)
    try:
        summary = json.loads(found.read_text())
    except ValueError as exc:
        raise UserError(f"{found}: not valid JSON: {exc}") from None
    except OSError as exc:
        raise UserError(f"{found}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(summary, dict):
        raise UserError(f"{found}: expected a profile summary (a JSON object), got {type(summary).__name__}")
    version = summary.get("schema_version")
    if not isinstance(version, int) or version > SUMMARY_SCHEMA_VERSION:
        raise UserError(f"{found}: schema_version: expected <= {SUMMARY_SCHEMA_VERSION}, got {version!r}")
    _require(found, "window", summary.get("window"), dict, "a mapping {start_ns, end_ns, seconds}")
    _require(found, "window.seconds", summary["window"].get("seconds"), (int, float), "a number of seconds")
    _require(found, "clock", summary.get("clock"), dict, "a mapping {name, ...}")
    _require(found, "clock.name", summary["clock"].get("name"), str, "the clock's name")
    _require(found, "levels", summary.get("levels"), dict, "a mapping level -> {status, reason}")
    for level, info in summary["levels"].items():
        _require(found, f"levels.{level}", info, dict, "a mapping {status, reason}")
        _require(found, f"levels.{level}.status", info.get("status"), str, "a status such as ok")
    return summary, found


def _require(found: Path, field: str, value: Any, kind: type | tuple[type, ...], expected: str) -> None:
    if value is None:
        raise UserError(f"{found}: {field}: expected {expected} (missing)")
    if isinstance(value, bool) or not isinstance(value, kind):
        raise UserError(f"{found}: {field}: expected {expected}, got {json.dumps(value)[:60]}")


def show(path: Path, top: int = 10) -> str:
    """`mlharness profile show`: the summary of a result folder, rendered; a damaged optional section
    (operators without their framework, say) is one line naming the file and the section."""
    summary, found = load_summary(path)
    parts = []
    for section, part in _SECTIONS:
        try:
            text = part(summary, top)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise UserError(f"{found}: {section}: missing or malformed ({what})") from None
        if text:
            parts.append(text)
    return "\n\n".join(parts)


def _levels(summary: dict[str, Any], top: int) -> str:
    head = (f"profile of a {summary.get('scenario') or '?'} test, {summary['window']['seconds']} s "
            f"on {summary['clock']['name']}")
    return head + "\n\n" + format_table(["level", "status", "overhead %", "noise %", "note"], [
        [level, info["status"], *_overhead(summary, level), info.get("reason", "")]
        for level, info in summary["levels"].items()])


def _stages(summary: dict[str, Any], top: int) -> str:
    stages = summary.get("stages", {})
    names = [n for n in STAGE_ORDER if n in stages] + sorted(n for n in stages if n not in STAGE_ORDER)
    rows = [[n, stages[n].get("count"), stages[n].get("mean_ms"), stages[n].get("p50_ms"), stages[n].get("p90_ms"),
             stages[n].get("p99_ms"), stages[n].get("max_ms")] for n in names if stages[n].get("count")]
    return "stages (ms)\n" + format_table(["stage", "count", "mean", "p50", "p90", "p99", "max"], rows) if rows else ""


def _tokens(summary: dict[str, Any], top: int) -> str:
    tokens = summary.get("harness", {})
    return _token_lines(tokens) if "time_split" in tokens else ""


def _operators(summary: dict[str, Any], top: int) -> str:
    operators = summary.get("operators")
    if not operators:
        return ""
    rows = [[o["op"], o["calls"], o["self_ms"], _pct(o["share_of_predict"])] for o in operators["top"][:top]]
    return (f"top {operators['framework']} operators by self time (predict total "
            f"{operators['predict_total_ms']} ms, from {operators['predict_basis']})\n"
            + format_table(["operator", "calls", "self ms", "% of predict"], rows))


def _python(summary: dict[str, Any], top: int) -> str:
    python = summary.get("python")
    if not (python and python.get("top_functions")):
        return ""
    rows = [[f["function"], _short(f["where"]), f["self_ms"], _pct(f["share"])] for f in python["top_functions"][:top]]
    return (f"python: {python['samples']} samples on {python['threads']} thread(s), "
            f"see {python.get('html')}\n" + format_table(["function", "where", "self ms", "% of samples"], rows))


def _system(summary: dict[str, Any], top: int) -> str:
    system = summary.get("system")
    if not system:
        return ""
    rows = [[k, v["mean"], v["max"]] for k, v in system.get("series", {}).items()]
    rows += [[f"perf {k}", v["value"], ""] for k, v in system.get("perf_stat", {}).items()]
    text = "system\n" + format_table(["measure", "mean / value", "max"], rows)
    if system.get("unavailable"):
        text += "\n\nunavailable: " + "; ".join(f"{k}: {v}" for k, v in system["unavailable"].items())
    return text


# The view's sections in order, each named by the summary's key a problem in it is reported under.
_SECTIONS: tuple[tuple[str, Callable[[dict[str, Any], int], str]], ...] = (
    ("levels", _levels), ("stages", _stages), ("harness", _tokens), ("operators", _operators),
    ("python", _python), ("system", _system))


def _token_lines(harness: dict[str, Any]) -> str:
    """A generative test: where the samples' time went, and the engine's batch size per step."""
    split, steps = harness["time_split"], harness.get("engine_steps", {})
    shares = ", ".join(f"{part} {_pct(split[part]['share'])}%" for part in ("prefill", "decode", "harness"))
    scheduling = "one sequence at a time" if harness["batching"] == "sequential" else \
        f"{harness['batching']} batching, {harness['slots']} of {harness['max_batch_size']} batch slots used"
    lines = [f"time per sample: {shares} of {split['sample_total_ms']} ms over {split['samples']} samples ({scheduling})"]
    if steps.get("decode_steps"):
        lines.append(f"decode steps: {steps['decode_steps']}, batch size mean {steps['decode_batch_size_mean']}, "
                     f"max {steps['decode_batch_size_max']} ({steps['source']})")
    return "\n".join(lines)


def _overhead(summary: dict[str, Any], level: str) -> list[Any]:
    figure = summary.get("overhead", {}).get("per_level", {}).get(level)
    return [figure["overhead_pct"], figure["noise_pct"]] if figure else [None, None]


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}"


def _short(where: str) -> str:
    """The last two parts of a path (package/module.py:line) keep the table narrow."""
    return "/".join(where.split("/")[-2:])
