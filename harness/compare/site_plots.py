"""The results site's plots and figure units: the accuracy-against-reference bars and a sweep's heat maps
(matplotlib, Agg, through mlharness.compare.report)."""
from __future__ import annotations

import math
import re
import statistics
from typing import Any

from mlharness.compare.report_plots import Plot, _png, _pyplot
from mlharness.compare.site_html import slug
from mlharness.records import record_metrics
from mlharness.records.run_record import RunRecord
from mlharness.sweeps.sweep import SweepRow


def figure_unit(name: str) -> tuple[str, float]:
    """(unit, factor) to show a figure in: nanoseconds as ms, bytes as MiB, the rest as stored."""
    key = name.partition(".")[2]
    if key.endswith("_ns"):
        return "ms", 1e-6
    if key.endswith("_bytes"):
        return "MiB", 2**-20
    if key.endswith("_seconds") or key.endswith("seconds"):
        return "s", 1.0
    if key.endswith("_ms"):
        return "ms", 1.0
    if "per_second" in key:
        return "samples/s", 1.0
    if key.endswith("qps"):
        return "queries/s", 1.0
    return "", 1.0


def shown_name(name: str) -> str:
    unit, _ = figure_unit(name)
    base = re.sub(r"_(ns|bytes|ms)$", "", name)
    return f"{base} ({unit})" if unit else base


def accuracy_reference_plot(record: RunRecord) -> list[Plot]:
    """Measured accuracy against the reference log's expected value and tolerance, per metric."""
    accuracy = record.accuracy_result
    # The value checks (a sample's output check expects a list, not one value: not plotted).
    checks = [c for c in (accuracy.checks if accuracy else ())
              if c.measured is not None and isinstance(c.expected, (int, float))]
    if not checks:
        return []
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = range(len(checks))
    ax.bar([x - 0.2 for x in xs], [c.expected for c in checks], 0.4, label="reference (expected)",
           yerr=[float(c.tolerance or 0) for c in checks], capsize=4, color="#9db4d8")
    ax.bar([x + 0.2 for x in xs], [c.measured for c in checks], 0.4, label="measured",
           color=["#3a8d4f" if c.passed else "#c0392b" for c in checks])
    ax.set_xticks(list(xs), [str(c.name) for c in checks])
    ax.set_ylabel("accuracy (fraction of samples)")
    ax.set_xlabel("metric (error bar: the reference's tolerance)")
    ax.set_title(f"{record.model_name}/{record.backend}: accuracy vs reference ({record.accuracy_verdict})")
    ax.legend(fontsize=8)
    return [Plot("accuracy-vs-reference.png", "Accuracy vs reference",
                 "Measured accuracy beside the reference log's expected value (tolerance as error bars); "
                 "green passed, red failed.", _png(fig))]


def _heat_value(name: str, value: float) -> float:
    return value * figure_unit(name)[1]


def _cell_text(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _ticker():  # noqa: ANN202 - matplotlib.ticker, loaded with pyplot
    _pyplot()
    import matplotlib.ticker

    return matplotlib.ticker


HeatCells = dict[tuple[str, str], dict[str, Any]]  # (batch, threads) -> {"values", "failed", "metric"}


def _heat_groups(rows: list[SweepRow]) -> dict[tuple, HeatCells]:
    """A sweep's rows by (scenario, model, backend, other settings), then by (max_batch_size,
    intra_op_threads) cell: each cell's headline values over its ok runs and how many runs failed."""
    groups: dict[tuple, HeatCells] = {}
    for row in rows:
        cell, record = row.cell, row.record
        other = " ".join([f"{k}={v}" for k, v in cell.manifests().items()]
                         + [o for o in cell.overrides if not o.startswith(("max_batch_size=", "intra_op_threads="))])
        backend = (record.backend if record else None) or cell.backend or "default"
        key = (cell.scenario, cell.model, backend, other)
        at = (cell.setting("max_batch_size") or "default", cell.setting("intra_op_threads") or "default")
        entry = groups.setdefault(key, {}).setdefault(at, {"values": [], "failed": 0})
        name, value = record_metrics.headline(record) if record and row.status == "ok" else ("", None)
        if value is None:
            entry["failed"] += 1
        else:
            entry["values"].append(value)
            entry["metric"] = name
    return groups


def _axis_order(value: str) -> tuple:
    """Sizes in numeric order, then names such as 'default'."""
    return (0, int(value), "") if value.isdigit() else (1, 0, value)


def _heat_grid(cells: HeatCells, metric: str) -> tuple[list[str], list[str], list[list[float]], list[list[str]]]:
    """(batch sizes, thread counts, each cell's median in the figure's unit (nan: no ok run), each
    cell's text)."""
    batches = sorted({b for b, _ in cells}, key=_axis_order)
    threads = sorted({t for _, t in cells}, key=_axis_order)
    grid = [[math.nan] * len(threads) for _ in batches]
    notes = [[""] * len(threads) for _ in batches]
    for (b, t), c in cells.items():
        i, j = batches.index(b), threads.index(t)
        if c["values"]:
            grid[i][j] = _heat_value(metric, statistics.median(c["values"]))
            notes[i][j] = _cell_text(grid[i][j]) + (f"\n({len(c['values'])} runs)" if len(c["values"]) > 1 else "")
        else:
            notes[i][j] = "failed"
    return batches, threads, grid, notes


def _draw_heat_grid(batches: list[str], threads: list[str], grid: list[list[float]], notes: list[list[str]],
                    higher: bool) -> tuple[Any, Any, Any]:
    """(figure, axes, image) of the grid, each cell's text in a colour that reads on its shade (failed: red)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.6 * len(threads) + 3.2, 0.9 * len(batches) + 2.2))
    image = ax.imshow(grid, cmap="viridis" if higher else "viridis_r", aspect="auto")
    ax.set_xticks(range(len(threads)), threads)
    ax.set_yticks(range(len(batches)), batches)
    ax.set_xlabel("intra_op_threads (threads per session; 0 = framework default)")
    ax.set_ylabel("max_batch_size (samples)")
    finite = [v for line in grid for v in line if not math.isnan(v)]
    middle = (min(finite) + max(finite)) / 2 if finite else 0
    for i in range(len(batches)):
        for j in range(len(threads)):
            value = grid[i][j]
            light = not math.isnan(value) and ((value < middle) == higher)
            ax.text(j, i, notes[i][j], ha="center", va="center", fontsize=9,
                    color="white" if light else ("#b3261e" if math.isnan(value) else "black"))
    return fig, ax, image


def _heatmap(index: int, group: tuple, cells: HeatCells, metric: str, sweep_id: str) -> Plot:
    """One group's heat map of its median `metric`, with a colour bar in the figure's unit."""
    scenario, model, backend, other = group
    batches, threads, grid, notes = _heat_grid(cells, metric)
    unit, _ = figure_unit(metric)
    higher = record_metrics.higher_is_better(metric)
    fig, ax, image = _draw_heat_grid(batches, threads, grid, notes, higher)
    key = metric.partition(".")[2]
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"{key} ({unit})" if unit else key)
    bar.ax.yaxis.set_major_formatter(_ticker().FuncFormatter(lambda v, _pos: _cell_text(v)))
    ax.set_title(f"{scenario} {model}/{backend}: median {key}" + (f"\n{other}" if other else ""), fontsize=10)
    better = "brighter is better" + ("" if higher else " (lower latency)")
    return Plot(f"heatmap-{index}-{slug(scenario)}-{slug(model)}.png",
                f"{scenario} {model}/{backend}: {key} by batch size and threads",
                f"Median {key} ({unit}) over each cell's ok runs of sweep {sweep_id}; {better}.", _png(fig))


def sweep_heatmaps(rows: list[SweepRow], sweep_id: str) -> list[Plot]:
    """Per scenario, model, backend and other settings: the median headline figure of each cell on a
    max_batch_size x intra_op_threads grid (failed cells marked). A group of one cell, or with no
    headline figure at all, has none; its index is still counted, so file names stay put."""
    plots = []
    for index, (group, cells) in enumerate(sorted(_heat_groups(rows).items())):
        metric = next((c["metric"] for c in cells.values() if "metric" in c), None)
        if len(cells) >= 2 and metric is not None:
            plots.append(_heatmap(index, group, cells, metric, sweep_id))
    return plots
