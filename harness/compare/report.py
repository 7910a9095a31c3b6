"""HTML reports for one run, a sweep, the layer benchmarks or the tuned configurations: the runs' table,
cold start, token latencies and the plots of mlharness.compare.report_plots."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Iterable

from mlharness.atomic_io import write_bytes, write_text
from mlharness.compare.report_plots import PLOTS, _bricks_records, _png, _pyplot
from mlharness.records.payloads import DeviceMemory, Warmup
from mlharness.records.run_record import BRICKS, RunRecord
from mlharness.tables import format_value


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(format_value(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _runs_table(records: list[RunRecord]) -> str:
    rows = []
    for r in records:
        name, value = r.headline()
        rows.append((r.run_id, r.model_name, r.backend, r.scenario, r.mode, r.batch_size, r.threads, r.status,
                     name.partition(".")[2], value, r.loadgen_result, r.error))
    return _table(("run id", "model", "backend", "scenario", "mode", "batch", "threads", "status", "metric", "value",
                   "LoadGen", "error"), rows)


def _cold_start_table(records: list[RunRecord]) -> str | None:
    """Per run: artifact resolution, model load, first inference, the warm-up and peak memory; None when
    no run recorded them (records from before cold start was measured)."""
    rows = []
    for r in records:
        cold = r.cold
        if cold is None:
            continue
        warmup, device = cold.warmup or Warmup(), cold.device_memory or DeviceMemory()
        rows.append((r.run_id, cold.resolve_seconds, cold.enumerate_seconds, cold.compile_seconds, cold.load_seconds,
                     _scaled(cold.first_inference_seconds, 1e3), warmup.queries, warmup.batch_size, warmup.seconds,
                     _scaled(cold.peak_rss_bytes, 2**-20), _scaled(device.peak_allocated_bytes, 2**-20)))
    if not rows:
        return None
    return _table(("run id", "resolve (s)", "enumerate (s)", "compile (s)", "load (s)", "first inference (ms)",
                   "warm-up queries", "warm-up batch", "warm-up (s)", "peak RSS (MiB)", "peak device (MiB)"), rows)


def _token_table(records: list[RunRecord]) -> str | None:
    """Per generative run: TTFT, TPOT, inter-token latency, tokens/s, goodput (mlharness.records.token_metrics)."""
    from mlharness.records.token_metrics import REPORT_COLUMNS, report_row

    rows = [(r.run_id, *row) for r in records if r.perf is not None and (row := report_row(r.perf.tokens)) is not None]
    return _table(("run id", *REPORT_COLUMNS), rows) if rows else None


def _scaled(value: Any, factor: float) -> float | None:
    return float(value) * factor if isinstance(value, (int, float)) else None


_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
          "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px}"
          "th{background:#f0f0f0}img{max-width:100%;border:1px solid #ddd}figure{margin:1.5em 0}")


def write_report(records: list[RunRecord], out_dir: Path, title: str,
                 extra_sections: list[tuple[str, str]] = ()) -> Path:
    """Write index.html and its PNGs to out_dir; returns the HTML path."""
    out_dir = Path(out_dir)
    plots = [plot for make in PLOTS for plot in make(records)]
    for plot in plots:
        write_bytes(out_dir / plot.filename, plot.png)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<h2>Runs</h2>{_runs_table(records)}"]
    cold_start = _cold_start_table(records)
    if cold_start:
        parts.append(f"<h2>Cold start and memory</h2>{cold_start}")
    tokens = _token_table(records)
    if tokens:
        parts.append(f"<h2>Token latencies (generative models)</h2>{tokens}")
    for heading, body in extra_sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
    parts.append("<h2>Plots</h2>" if plots else "<p>No plots: the runs have no figures to plot.</p>")
    for plot in plots:
        parts.append(f"<figure><img src='{html.escape(plot.filename)}' alt='{html.escape(plot.title)}'>"
                     f"<figcaption><b>{html.escape(plot.title)}</b>: {html.escape(plot.caption)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return write_text(out_dir / "index.html", "\n".join(parts))


def bricks_table(records: Iterable[RunRecord]) -> str:
    rows = []
    for r in _bricks_records(records):
        s = r.bricks_summary
        rows.append((r.model_name, r.run_id, s.batch, s.nodes, s.unique_bricks, s.reused_bricks, s.estimate_ms,
                     s.lower_bound_ms, s.measured_ms, s.error_pct, s.brick_seconds, s.whole_model_seconds, s.speedup))
    return _table(("model", "run id", "batch", "nodes", "unique bricks", "reused", "estimate (ms)", "lower bound (ms)",
                   "measured (ms)", "error (%)", "bricks (s)", "whole model (s)", "speedup"), rows)


def run_report(store: Any, run_id: str, out_dir: Path) -> Path:
    record = store.get_record(run_id)
    sections = [("Bricks", bricks_table([record]))] if _bricks_records([record]) else []
    return write_report([record], out_dir, f"mlharness run {record.run_id}", sections)


def bricks_report(store: Any, out_dir: Path) -> Path:
    """Every model's latest layer benchmark in the database, side by side."""
    from mlharness.errors import UserError
    from mlharness.store.result_store import RunFilter

    records = latest_bricks(store.run_records(RunFilter(scenario="bricks", status="ok")))
    if not records:
        raise UserError(f"{store.path}: no layer benchmarks (run `mlharness bricks MODEL` first)")
    return write_report(records, out_dir, "mlharness bricks", [("Bricks", bricks_table(records))])


def tuning_report(store: Any, out_dir: Path) -> Path:
    """Every tuned configuration (`mlharness tune`): its search as a table and a chart of each trial's
    figure, the trials' runs below."""
    from mlharness.errors import UserError
    from mlharness.running.tuned import settings_text, trial_status

    tuned = store.list_tuned()
    if not tuned:
        raise UserError(f"{store.path}: no tuned configurations (run `mlharness tune MODEL --scenario S` first)")
    out_dir = Path(out_dir)
    sections, records = [], []
    for index, entry in enumerate(tuned):
        trials = json.loads(entry.get("trials_json") or "[]")
        rows = [(i, settings_text(t["settings"]), t["value"],
                 trial_status(t), t["run_id"])
                for i, t in enumerate(trials, 1)]
        best = settings_text(entry["settings"])
        body = (f"<p>{html.escape(entry['system_name'])}, {html.escape(entry['backend'])}: best {html.escape(best)} "
                f"({html.escape(str(entry['figure_name']))} {format_value(entry['figure_value'])}), "
                f"tuning {html.escape(str(entry['tuning_id']))}</p>"
                + _table(("trial", "settings", str(entry["figure_name"]), "status", "run id"), rows))
        values = [(i, t["value"]) for i, t in enumerate(trials, 1) if t["value"] is not None]
        if values:
            plt = _pyplot()
            fig, ax = plt.subplots(figsize=(7, 3.2))
            ax.plot([i for i, _ in values], [v for _, v in values], "o-", color="#888")
            chosen = [(i, t["value"]) for i, t in enumerate(trials, 1) if t["settings"] == entry["settings"]]
            if chosen:
                ax.plot([i for i, _ in chosen], [v for _, v in chosen], "o", color="#d62728", label="chosen")
                ax.legend()
            ax.set_xlabel("trial")
            ax.set_ylabel(str(entry["figure_name"]))
            ax.set_title(f"{entry['model']} {entry['scenario']}: tuning search")
            name = f"tuning_{index}.png"
            write_bytes(out_dir / name, _png(fig))
            body += f"<figure><img src='{name}' alt='tuning search'></figure>"
        sections.append((f"{entry['model']} {entry['scenario']}", body))
        for trial in trials:
            if trial.get("run_id"):
                try:
                    records.append(store.get_record(trial["run_id"]))
                except UserError:
                    pass  # a trial whose run is gone from the database: its row above stays
    return write_report(records, out_dir, "mlharness tuning", sections)


def latest_bricks(records: Iterable[RunRecord]) -> list[RunRecord]:
    """Each model's newest ok layer benchmark among records given newest first, oldest model first."""
    latest: dict[str, RunRecord] = {}
    for record in records:
        if record.kind == BRICKS and record.is_ok:
            latest.setdefault(record.model_name or record.run_id, record)
    return list(latest.values())[::-1]


def sweep_report(store: Any, sweep_id: str, out_dir: Path) -> Path:
    from mlharness.sweeps.sweep import best_configurations, sweep_rows

    rows = sweep_rows(store, sweep_id)
    records = [row.record for row in rows if row.record is not None]
    best = [(e["cell"].scenario, e["cell"].model, e["backend"], e["cell"].setting("max_batch_size"),
             e["cell"].setting("intra_op_threads"), e["metric"].partition(".")[2], e["median"], len(e["values"]))
            for e in best_configurations(rows)]
    failed = [(row.cell.label(), row.repeat_index, row.error) for row in rows if row.status != "ok"]
    sections = [("Best configuration per scenario and model",
                 _table(("scenario", "model", "backend", "batch", "threads", "metric", "median", "runs"), best))]
    if failed:
        sections.append(("Failed cells", _table(("cell", "repeat", "error"), failed)))
    return write_report(records, out_dir, f"mlharness sweep {sweep_id}", sections)
