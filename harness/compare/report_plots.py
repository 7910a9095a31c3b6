"""The plots of an HTML report (matplotlib, Agg), one PNG each, for one run or several.

Each plot is a function in PLOTS that takes the runs and returns zero or more figures; a plot
that does not apply (one batch size, no accuracy, no profile) returns nothing, so a report only
shows what the runs can say. mlharness.compare.report writes the pages around them."""
from __future__ import annotations

import io
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from mlharness.records.bricks_payload import BricksSummary
from mlharness.records.run_record import BRICKS, RunRecord

@dataclass
class Plot:
    filename: str
    title: str
    caption: str
    png: bytes


def _pyplot():  # noqa: ANN202 - matplotlib.pyplot, loaded only when a report is written
    from mlharness.errors import require

    matplotlib = require("matplotlib", "reports", "report plots")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    _pyplot().close(fig)
    return buffer.getvalue()


def _label(record: RunRecord) -> str:
    extra = " ".join(f"{k}={v}" for k, v in sorted(record.harness_settings.items()))
    return f"{record.model_name}/{record.backend} {extra}".strip()


def _batch(record: RunRecord) -> int | None:
    return record.batch_size


def _threads(record: RunRecord) -> int | None:
    return record.threads


def _throughput(record: RunRecord) -> float | None:
    perf = record.perf
    return perf.throughput if perf is not None else None


def _by_scenario(records: Iterable[RunRecord]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(str(record.scenario), []).append(record)
    return groups


# ---- plots -------------------------------------------------------------------------------------


def latency_plots(records: list[RunRecord]) -> list[Plot]:
    """Per scenario: each configuration's latency percentile curve (LoadGen's summary percentiles)."""
    plots = []
    for scenario, runs in sorted(_by_scenario(records).items()):
        curves: dict[str, list[tuple[float, float]]] = {}
        for record in runs:
            perf = record.perf
            points = [(ns / 1e6, pct) for pct, ns in perf.latency_percentiles()] if perf is not None else []
            if points:
                curves.setdefault(_label(record), points)  # one curve per configuration: the first (newest) run
        if not curves:
            continue
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, points in sorted(curves.items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("percentile")
        ax.set_title(f"{scenario}: latency percentiles")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        plots.append(Plot(f"latency-{scenario}.png", f"{scenario} latency percentiles",
                          "p50 to p99.9 of query latency from LoadGen's summary, one curve per configuration.",
                          _png(fig)))
    return plots


def _axis_plot(records: list[RunRecord], axis: str, getter: Callable[[RunRecord], int | None],
               other: Callable[[RunRecord], Any], other_name: str) -> list[Plot]:
    plots = []
    for scenario, runs in sorted(_by_scenario(records).items()):
        series: dict[str, dict[int, list[float]]] = {}
        for record in runs:
            x, y = getter(record), _throughput(record)
            if x is None or y is None:
                continue
            key = f"{record.model_name}/{record.backend} {other_name}={other(record)}"
            series.setdefault(key, {}).setdefault(x, []).append(y)
        if not any(len(points) >= 2 for points in series.values()):
            continue
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, points in sorted(series.items()):
            xs = sorted(points)
            ax.plot(xs, [statistics.median(points[x]) for x in xs], marker="o", label=key)
        xs_all = [x for points in series.values() for x in points]
        if min(xs_all) > 0 and max(xs_all) >= 4 * min(xs_all):
            ax.set_xscale("log", base=2)  # batch sizes are usually powers of two
        ax.set_xlabel(axis)
        ax.set_ylabel("samples per second (median of runs)")
        ax.set_yscale("log")
        ax.set_title(f"{scenario}: throughput vs {axis}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        slug = axis.replace(" ", "-")
        plots.append(Plot(f"throughput-vs-{slug}-{scenario}.png", f"{scenario} throughput vs {axis}",
                          f"Median samples per second at each {axis}.", _png(fig)))
    return plots


def throughput_plots(records: list[RunRecord]) -> list[Plot]:
    return (_axis_plot(records, "batch size", _batch, _threads, "threads")
            + _axis_plot(records, "threads", _threads, _batch, "batch"))


def accuracy_plots(records: list[RunRecord]) -> list[Plot]:
    """Accuracy figures per model and backend (the newest run of each)."""
    values: dict[str, dict[str, float]] = {}
    for record in records:
        figures = {k: v for k, v in record.figures().items() if k.startswith("accuracy.")}
        if figures:
            values.setdefault(f"{record.model_name}/{record.backend}", figures)
    if not values:
        return []
    names = sorted({name for figures in values.values() for name in figures})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(names)
    groups = sorted(values)
    for i, name in enumerate(names):
        ax.bar([g + i * width for g in range(len(groups))], [values[k].get(name, 0.0) for k in groups], width,
               label=name.partition(".")[2])
    ax.set_xticks([g + width * (len(names) - 1) / 2 for g in range(len(groups))], groups, rotation=15, fontsize=8)
    ax.set_ylabel("accuracy")
    ax.set_title("accuracy per model and backend")
    ax.legend(fontsize=7)
    return [Plot("accuracy.png", "Accuracy per backend", "Accuracy figures of each model on each backend.", _png(fig))]


def _stage_times(profile: dict[str, Any]) -> dict[str, float]:
    """Median time per stage (ms) from a profile summary; shapes vary by version, so read loosely."""
    found = {}
    for name, stats in (profile.get("stages") or {}).items():
        if isinstance(stats, dict):
            for key in ("p50_ms", "mean_ms", "p90_ms"):
                if isinstance(stats.get(key), (int, float)):
                    found[str(name)] = float(stats[key])
                    break
        elif isinstance(stats, (int, float)):
            found[str(name)] = float(stats)
    return found


def _operator_times(record: RunRecord) -> list[tuple[str, float]]:
    """Top operators by self time (ms): from profile/summary.json when it is still there, else run.json."""
    profile = record.profile or {}
    top: Any = profile.get("top_operators") or []
    summary_file = Path(str(record.results_path or "")) / str(profile.get("dir") or "profile") / "summary.json"
    try:
        top = json.loads(summary_file.read_text()).get("operators", {}).get("top") or top
    except (OSError, ValueError, AttributeError):
        pass
    rows = []
    for entry in top if isinstance(top, list) else []:
        if isinstance(entry, dict):
            name = entry.get("op") or entry.get("name")
            value = next((entry[k] for k in ("self_ms", "total_ms", "ms") if isinstance(entry.get(k), (int, float))), None)
            if name is not None and value is not None:
                rows.append((str(name), float(value)))
    return rows[:15]


def profile_plots(records: list[RunRecord]) -> list[Plot]:
    """Per profiled run: median time per stage, and the top operators by self time."""
    plots = []
    for record in records:
        profile = record.profile
        if not isinstance(profile, dict):
            continue
        stages, operators = _stage_times(profile), _operator_times(record)
        if not stages and not operators:
            continue
        plt = _pyplot()
        panels = [p for p in (("stage p50 (ms)", sorted(stages.items(), key=lambda kv: -kv[1])),
                              ("operator self time (ms)", operators)) if p[1]]
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
        for ax, (xlabel, rows) in zip(axes[0], panels):
            ax.barh([r[0] for r in rows][::-1], [r[1] for r in rows][::-1])
            positive = [r[1] for r in rows if r[1] > 0]
            if positive and max(positive) > 100 * min(positive):
                ax.set_xscale("log")  # predict dwarfs the other stages; a log axis keeps them visible
                xlabel += ", log scale"
            ax.set_xlabel(xlabel)
            ax.tick_params(axis="y", labelsize=7)
        fig.suptitle(f"{_label(record)} {record.scenario}: profile")
        plots.append(Plot(f"profile-{record.run_id}.png", f"Profile of {record.run_id}",
                          "Per-stage median latency and the operators with the most self time.", _png(fig)))
    return plots


def _bricks_records(records: Iterable[RunRecord]) -> list[RunRecord]:
    return [r for r in records if r.kind == BRICKS and r.is_ok and r.bricks_summary is not None]


def bricks_plots(records: list[RunRecord]) -> list[Plot]:
    """Layer benchmarks (mlharness.bricks): estimate vs measured vs lower bound per model, and each
    model's time per op type as measured through its bricks and at its lower bound."""
    bricks = _bricks_records(records)
    if not bricks:
        return []
    plt = _pyplot()
    names = [r.model_name or r.run_id for r in bricks]
    series: tuple[tuple[str, Callable[[BricksSummary], float | None]], ...] = (
        ("estimate", lambda s: s.estimate_ms), ("measured (LoadGen p50)", lambda s: s.measured_ms),
        ("lower bound", lambda s: s.lower_bound_ms))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(bricks) + 2), 4))
    width = 0.8 / len(series)
    for i, (label, figure) in enumerate(series):
        values = [float(figure(r.bricks_summary) or 0.0) for r in bricks]
        ax.bar([x + (i - 1) * width for x in range(len(bricks))], values, width, label=label)
    ax.set_xticks(range(len(bricks)), names, rotation=30, ha="right")
    ax.set_ylabel("latency of one call (ms)")
    ax.legend()
    plots = [Plot("bricks_estimate.png", "Composed estimate, measured latency and lower bound",
                  "Per model: the sum of its bricks' medians (estimate), LoadGen's p50 of the whole model, and "
                  "the sum of each brick's best variant (Benanza's lower bound).", _png(fig))]
    for index, record in enumerate(bricks):
        rows = record.bricks_result.by_op_type
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.5))
        ops = [row.op_type for row in rows][::-1]
        ax.barh([y + 0.2 for y in range(len(ops))], [row.measured_ms for row in rows][::-1], 0.4, label="as executed")
        ax.barh([y - 0.2 for y in range(len(ops))], [row.lower_bound_ms for row in rows][::-1], 0.4, label="lower bound")
        ax.set_yticks(range(len(ops)), ops)
        ax.set_xlabel("ms per call (brick medians x multiplicity)")
        ax.legend()
        plots.append(Plot(f"bricks_ops_{index}.png", f"{record.model_name}: time per op type",
                          "Measured through its bricks and at each brick's best variant; the gap is where the "
                          "framework's configuration loses time.", _png(fig)))
    return plots


PLOTS: list[Callable[[list[RunRecord]], list[Plot]]] = [latency_plots, throughput_plots, accuracy_plots,
                                                             profile_plots, bricks_plots]
