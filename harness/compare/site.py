"""A static, self-contained results site from the results database (`mlharness report --site DIR`).

    DIR/index.html                every run: filter by model, scenario, system, status; sort by any
                                  column or figure; tick runs and compare them
    DIR/runs/<run>.html (+ <run>/) one run: settings and where each came from, LoadGen summary, latency
                                  percentiles, accuracy vs reference, cold start, profile (and a copy
                                  of its timeline), error and traceback, bricks
    DIR/compare.html#ID,ID,...    two or more runs side by side, with the gates' comparability rules
    DIR/sweeps/<sweep>.html       a sweep: heat maps of the headline figure by batch size x threads,
                                  its cells, the best configuration, throughput and latency plots
    DIR/bricks.html               every model's latest layer benchmark (mlharness.bricks)

Plain HTML with inline CSS and JavaScript, PNG plots (matplotlib, Agg) beside the pages, relative links
only: the folder opens from a file or a CI artifact, and nothing is fetched off the machine."""
from __future__ import annotations

import hashlib
import html
import json
import math
import re
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mlharness.atomic_io import write_bytes, write_text
from mlharness.compare import comparability
from mlharness.compare.report import (
    Plot, _pyplot, _png, _cold_start_table, bricks_plots, bricks_table, latency_plots, latest_bricks, profile_plots,
    throughput_plots, accuracy_plots)
from mlharness.errors import UserError
from mlharness.records import record_metrics
from mlharness.records.run_record import BRICKS, RunRecord, migrate_record
from mlharness.tables import format_value

COPY_LIMIT_BYTES = 64 * 2**20  # a profile timeline or traceback larger than this is named, not copied


def _e(value: Any) -> str:
    return html.escape(format_value(value) if not isinstance(value, str) else value, quote=True)


def slug(text: str) -> str:
    """A file name for a run or sweep id (ids are already safe; imported records may not be)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._")[:100]
    if cleaned != str(text):  # keep two ids that clean to the same text apart
        cleaned += "-" + hashlib.sha256(str(text).encode()).hexdigest()[:8]
    return cleaned or "_"


def _json_script(element_id: str, data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str).replace("</", "<\\/")
    return f"<script type='application/json' id='{element_id}'>{text}</script>"


# ---- page frame ------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2b4a;color:#fff;padding:.6em 1.5em;display:flex;gap:1.5em;align-items:baseline}
header a{color:#cfe0ff;text-decoration:none}header b{font-size:1.1em}
main{padding:.5em 1.5em 2em;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #dde;padding-bottom:.2em}
table{border-collapse:collapse;font-size:13px;margin:.6em 0;background:#fff}
td,th{border:1px solid #d4d8e0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#eef1f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
th[data-col]{cursor:pointer;user-select:none}th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}
.ok{color:#176a2c;font-weight:600}.failed{color:#b3261e;font-weight:600}.running{color:#8a5a00}
.good{background:#e3f5e6}.bad{background:#fbe4e2}.note{color:#555;font-size:13px}
.error{background:#fdecea;border:1px solid #f3b5ae;padding:.6em 1em;white-space:pre-wrap;font-family:monospace}
.controls{display:flex;flex-wrap:wrap;gap:.8em;align-items:center;margin:.8em 0;font-size:14px}
figure{margin:1em 0;display:inline-block;vertical-align:top;max-width:100%}
img{max-width:100%;border:1px solid #dde;background:#fff}figcaption{font-size:13px;color:#444;max-width:720px}
.side{display:flex;flex-wrap:wrap;gap:1em}.side figure{max-width:48%}
#runs{font-size:12.5px}#runs td{white-space:nowrap}
code{background:#eef1f6;padding:0 .25em}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;font-size:14px}
dt{font-weight:600}dd{margin:0}
"""


def _page(title: str, body: str, depth: int, script: str = "") -> str:
    up = "../" * depth
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<header><b>mlharness results</b><a href='{up}index.html'>runs</a>"
            f"<a href='{up}index.html#sweeps'>sweeps</a><a href='{up}bricks.html'>bricks</a>"
            f"<a href='{up}compare.html'>compare</a></header>"
            f"<main><h1>{_e(title)}</h1>{body}</main>{script}</body></html>\n")


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]], raw: bool = False) -> str:
    """A table; cells are escaped text, or HTML already when `raw` (callers escape what they put in)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for value in row:
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            text = value if raw and isinstance(value, str) else _e(value)
            cells.append(f"<td class='n'>{text}</td>" if numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _definitions(pairs: Iterable[tuple[str, Any]]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def _figures_html(plots: list[Plot], folder: str) -> str:
    return "".join(f"<figure><img src='{_e(folder)}/{_e(p.filename)}' alt='{_e(p.title)}'>"
                   f"<figcaption><b>{_e(p.title)}</b>: {_e(p.caption)}</figcaption></figure>" for p in plots)


def _status(status: str | None) -> str:
    return f"<span class='{_e(status or '')}'>{_e(status or 'unknown')}</span>"


# ---- what the site is built from ---------------------------------------------------------------------


@dataclass
class SiteRun:
    record: RunRecord
    sweep_id: str | None
    page: str  # relative to the site root
    folder: str  # for the run's plots and copies, relative to the site root
    figures: dict[str, float] = field(default_factory=dict)


@dataclass
class Site:
    runs: list[SiteRun]  # newest first
    skipped: list[str]  # stored rows this mlharness cannot read, with the reason


def load_site(store: Any) -> Site:
    runs, skipped = [], []
    for row in store.list_runs():
        try:
            record = RunRecord.from_dict(migrate_record(json.loads(row["record_json"]), f"run {row['run_id']}"))
        except (UserError, ValueError) as exc:
            skipped.append(f"{row['run_id']}: {exc}")
            continue
        name = slug(record.run_id)
        runs.append(SiteRun(record, row["sweep_id"], f"runs/{name}.html", f"runs/{name}", record.figures()))
    return Site(runs, skipped)


# ---- units --------------------------------------------------------------------------------------------


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


def _shown(name: str) -> str:
    unit, _ = figure_unit(name)
    base = re.sub(r"_(ns|bytes|ms)$", "", name)
    return f"{base} ({unit})" if unit else base


# ---- plots the report does not have --------------------------------------------------------------------


def accuracy_reference_plot(record: RunRecord) -> list[Plot]:
    """Measured accuracy against the reference log's expected value and tolerance, per metric."""
    checks = [c for c in (record.accuracy or {}).get("checks") or []
              if isinstance(c, dict) and isinstance(c.get("measured"), (int, float))
              and isinstance(c.get("expected"), (int, float))]
    if not checks:
        return []
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = range(len(checks))
    ax.bar([x - 0.2 for x in xs], [c["expected"] for c in checks], 0.4, label="reference (expected)",
           yerr=[float(c.get("tolerance") or 0) for c in checks], capsize=4, color="#9db4d8")
    ax.bar([x + 0.2 for x in xs], [c["measured"] for c in checks], 0.4, label="measured",
           color=["#3a8d4f" if c.get("pass") else "#c0392b" for c in checks])
    ax.set_xticks(list(xs), [str(c.get("name")) for c in checks])
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


def sweep_heatmaps(rows: list[dict[str, Any]], sweep_id: str) -> list[Plot]:
    """Per scenario, model, backend and other settings: the median headline figure of each cell on a
    max_batch_size x intra_op_threads grid (failed cells marked)."""
    groups: dict[tuple, dict[tuple[str, str], dict[str, Any]]] = {}
    for row in rows:
        cell, record = row["cell"], row["record"]
        other = " ".join([f"{k}={v}" for k, v in cell.manifests().items()]
                         + [o for o in cell.overrides if not o.startswith(("max_batch_size=", "intra_op_threads="))])
        backend = (record or {}).get("backend") or cell.backend or "default"
        key = (cell.scenario, cell.model, backend, other)
        at = (cell.setting("max_batch_size") or "default", cell.setting("intra_op_threads") or "default")
        entry = groups.setdefault(key, {}).setdefault(at, {"values": [], "failed": 0})
        name, value = record_metrics.headline(record) if record and row["row"]["status"] == "ok" else ("", None)
        if value is None:
            entry["failed"] += 1
        else:
            entry["values"].append(value)
            entry["metric"] = name
    plots = []
    for index, ((scenario, model, backend, other), cells) in enumerate(sorted(groups.items())):
        if len(cells) < 2:
            continue
        metric = next((c["metric"] for c in cells.values() if "metric" in c), None)
        if metric is None:
            continue

        def order(v: str) -> tuple:
            return (0, int(v), "") if v.isdigit() else (1, 0, v)

        batches = sorted({b for b, _ in cells}, key=order)
        threads = sorted({t for _, t in cells}, key=order)
        grid = [[math.nan] * len(threads) for _ in batches]
        notes = [[""] * len(threads) for _ in batches]
        for (b, t), c in cells.items():
            i, j = batches.index(b), threads.index(t)
            if c["values"]:
                grid[i][j] = _heat_value(metric, statistics.median(c["values"]))
                notes[i][j] = _cell_text(grid[i][j]) + (f"\n({len(c['values'])} runs)" if len(c["values"]) > 1 else "")
            else:
                notes[i][j] = "failed"
        unit, _ = figure_unit(metric)
        higher = record_metrics.higher_is_better(metric)
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
        key = metric.partition(".")[2]
        bar = fig.colorbar(image, ax=ax)
        bar.set_label(f"{key} ({unit})" if unit else key)
        bar.ax.yaxis.set_major_formatter(_ticker().FuncFormatter(lambda v, _pos: _cell_text(v)))
        ax.set_title(f"{scenario} {model}/{backend}: median {key}" + (f"\n{other}" if other else ""), fontsize=10)
        better = "brighter is better" + ("" if higher else " (lower latency)")
        plots.append(Plot(f"heatmap-{index}-{slug(scenario)}-{slug(model)}.png",
                          f"{scenario} {model}/{backend}: {key} by batch size and threads",
                          f"Median {key} ({unit}) over each cell's ok runs of sweep {sweep_id}; {better}.", _png(fig)))
    return plots


# ---- pages ---------------------------------------------------------------------------------------------


def _copy_into(src: Path, dest: Path) -> bool:
    """Copy a file the results tree still holds into the site; False when it is gone or too large."""
    try:
        if not src.is_file() or src.stat().st_size > COPY_LIMIT_BYTES:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        return True
    except OSError:
        return False


def _write_plots(root: Path, folder: str, plots: list[Plot]) -> None:
    for plot in plots:
        write_bytes(root / folder / plot.filename, plot.png)


def _settings_rows(record: RunRecord) -> list[tuple[str, str, Any, str]]:
    origins = record.setting_origins
    rows = [("LoadGen", key, value, origins.get(key, "-")) for key, value in sorted(record.loadgen_settings.items())]
    rows += [("harness", key, value, origins.get(key, "default" if key not in origins else origins[key]))
             for key, value in sorted(record.harness_settings.items())]
    return rows


def _manifest_rows(record: RunRecord) -> list[tuple[str, Any, Any, Any]]:
    return [(kind, (ref or {}).get("name"), (ref or {}).get("version"), str((ref or {}).get("sha256") or "")[:16])
            for kind, ref in record.manifest_refs()]


def _profile_section(root: Path, run: SiteRun) -> str:
    record, profile = run.record, run.record.profile
    if not isinstance(profile, dict) or not profile:
        return ""
    parts = [_definitions([("levels", _e(", ".join(f"{k}: {v}" for k, v in (profile.get("levels") or {}).items()))),
                           ("measured overhead", _e(", ".join(f"{k} {v}%" for k, v in
                                                             (profile.get("overhead_pct") or {}).items()) or "-"))])]
    stages = [(name, s.get("count"), s.get("p50_ms"), s.get("p90_ms"), s.get("p99_ms"))
              for name, s in sorted((profile.get("stages") or {}).items()) if isinstance(s, dict)]
    if stages:
        parts.append(_table(("stage", "count", "p50 (ms)", "p90 (ms)", "p99 (ms)"), stages))
    top = [(o.get("op") or o.get("name"), o.get("self_ms"), o.get("total_ms"), o.get("count"))
           for o in profile.get("top_operators") or [] if isinstance(o, dict)]
    if top:
        parts.append(_table(("operator", "self (ms)", "total (ms)", "calls"), top[:15]))
    source = Path(str(record.results_path or "")) / str(profile.get("dir") or "profile")
    links = []
    for name in ("timeline.json", "summary.json"):
        if name not in (profile.get("files") or [name]):
            continue
        if _copy_into(source / name, root / run.folder / "profile" / name):
            links.append(f"<a href='{_e(Path(run.folder).name)}/profile/{name}'>{name}</a>")
        else:
            links.append(f"{name}: <code>{_e(str(source / name))}</code> (not on disk or too large to copy)")
    if links:
        parts.append("<p>Profile files: " + " · ".join(links)
                     + " <span class='note'>(the timeline opens in chrome://tracing or ui.perfetto.dev)</span></p>")
    return "".join(parts)


def _loadgen_section(record: RunRecord) -> str:
    perf = record.performance or {}
    if not perf:
        return "<p class='note'>No LoadGen performance summary (an accuracy run, a layer benchmark, or a run that " \
               "failed before one was written).</p>"
    raw = perf.get("raw") if isinstance(perf.get("raw"), dict) else {}
    rows = list(raw.items()) or [(k, v) for k, v in perf.items() if k not in ("raw", "metric")]
    parts = [_definitions([("result", _e(record.loadgen_result or "-")),
                           ("headline", _e(f"{_shown(record.headline()[0])}: {format_value(_headline_shown(record))}"))])]
    if record.status == "failed":
        parts.append("<p class='note'>The run failed: this is LoadGen's summary up to the failure, not a result.</p>")
    parts.append(f"<details><summary>all {len(rows)} keys of LoadGen's summary</summary>"
                 + _table(("LoadGen summary key", "value"), rows) + "</details>")
    for mode, logged in sorted((record.loadgen or {}).items()):
        if isinstance(logged, dict):
            for kind in ("errors", "warnings"):
                if logged.get(kind):
                    parts.append(f"<p><b>LoadGen {kind} ({_e(mode)})</b></p><ul>"
                                 + "".join(f"<li><code>{_e(str(x))}</code></li>" for x in logged[kind]) + "</ul>")
    return "".join(parts)


def _headline_shown(record: RunRecord) -> float | None:
    name, value = record.headline()
    return None if value is None else value * figure_unit(name)[1]


def _accuracy_section(record: RunRecord) -> str:
    accuracy = record.accuracy or {}
    if not accuracy:
        return ""
    parts = [_definitions([("metric", _e(accuracy.get("metric") or "-")),
                           ("result", _e(accuracy.get("headline") or "-")),
                           ("reference", _e(accuracy.get("reference") or "none (no reference log for this model, "
                                                                           "dataset and backend)")),
                           ("verdict", _e(accuracy.get("verdict") or "-"))])]
    values = [(k, v) for k, v in sorted(record.accuracy_values.items())]
    if values:
        parts.append(_table(("accuracy figure", "value"), values))
    checks = [(c.get("name"), c.get("expected"), c.get("tolerance"), c.get("measured"),
               "PASS" if c.get("pass") else "FAIL") for c in accuracy.get("checks") or [] if isinstance(c, dict)]
    if checks:
        parts.append(_table(("check", "expected", "tolerance", "measured", "verdict"), checks))
    for note in accuracy.get("notes") or []:
        parts.append(f"<p class='note'>{_e(str(note))}</p>")
    return "".join(parts)


def _cold_start_section(record: RunRecord) -> str:
    cold = record.cold_start or {}
    if not cold:
        return ""
    rows = []
    for key, value in cold.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            unit, factor = figure_unit(f"coldstart.{key}")
            if key.endswith("_seconds") and value < 1:
                unit, factor = "ms", 1e3
            rows.append((key.removesuffix("_seconds").removesuffix("_bytes"), value * factor, unit))
    warmup = cold.get("warmup") or {}
    for key in ("queries", "samples", "batch_size"):
        if key in warmup:
            rows.append((f"warm-up {key}", warmup[key], "count"))
    if isinstance(warmup.get("seconds"), (int, float)):
        rows.append(("warm-up time", warmup["seconds"] * 1e3, "ms"))
    for key, value in (cold.get("device_memory") or {}).items():
        if isinstance(value, (int, float)):
            rows.append((f"device {key}", value * 2**-20, "MiB"))
    return _table(("cold start / memory", "value", "unit"), rows)


def _error_section(root: Path, run: SiteRun) -> str:
    record = run.record
    if not record.error and record.status != "failed":
        return ""
    parts = [f"<div class='error'>{_e(record.error or 'failed without an error message')}</div>"]
    items = [("results folder", f"<code>{_e(record.results_path or '-')}</code>")]
    traceback = record.error_traceback
    if not traceback and record.results_path and (Path(record.results_path) / "traceback.txt").is_file():
        traceback = str(Path(record.results_path) / "traceback.txt")
    if traceback:
        text = f"<code>{_e(traceback)}</code>"
        if _copy_into(Path(traceback), root / run.folder / "traceback.txt"):
            text += f" (<a href='{_e(Path(run.folder).name)}/traceback.txt'>copy</a>)"
        items.append(("traceback", text))
    else:
        items.append(("traceback", "none kept: the error is the user's code or settings, named above"))
    parts.append(_definitions(items))
    return "".join(parts)


def _run_page(root: Path, run: SiteRun, previous: SiteRun | None) -> None:
    record = run.record
    folder = Path(run.folder).name
    sections: list[tuple[str, str]] = []
    links = []
    if run.sweep_id:
        links.append(f"sweep <a href='../sweeps/{_e(slug(run.sweep_id))}.html'>{_e(run.sweep_id)}</a>")
    if previous is not None:
        links.append(f"<a href='../compare.html#{_e(previous.record.run_id)},{_e(record.run_id)}'>compare with the "
                     f"previous run of this configuration</a> ({_e(previous.record.run_id)})")
    summary = [("status", _status(record.status)),
               ("model / backend", _e(f"{record.model_name} / {record.backend}")),
               ("scenario / mode", _e(f"{record.scenario} / {record.mode}")),
               ("kind", _e(record.kind)), ("system", _e(record.system_name)),
               ("started / finished", _e(f"{record.started_at} / {record.finished_at}")),
               ("command", f"<code>{_e(record.command)}</code>"),
               ("results folder", f"<code>{_e(record.results_path)}</code>")]
    if links:
        summary.append(("see also", " · ".join(links)))
    sections.append(("Run", _definitions(summary)))
    error = _error_section(root, run)
    if error:
        sections.append(("Error", error))
    plots_for = []
    if record.is_loadgen:
        sections.append(("LoadGen summary", _loadgen_section(record)))
        latency = latency_plots([record])
        plots_for += latency
        if latency:
            sections.append(("Latency percentiles", _figures_html(latency, folder)))
    accuracy = _accuracy_section(record)
    if accuracy:
        acc_plots = accuracy_reference_plot(record) or accuracy_plots([record])
        plots_for += acc_plots
        sections.append(("Accuracy vs reference", accuracy + _figures_html(acc_plots, folder)))
    if record.kind == BRICKS and record.bricks:
        b_plots = bricks_plots([record])
        plots_for += b_plots
        sections.append(("Bricks (layer benchmark)", bricks_table([record]) + _figures_html(b_plots, folder)))
    settings = _settings_rows(record)
    if settings:
        layers = " < ".join(str(x) for x in (record.settings or {}).get("layers") or [])
        sections.append(("Settings and where each came from",
                         (f"<p class='note'>Layers, lowest first: {_e(layers)}</p>" if layers else "")
                         + _table(("kind", "key", "value", "set by"), settings)))
    cold = _cold_start_section(record)
    if cold:
        sections.append(("Cold start and memory", cold))
    profile = _profile_section(root, run)
    if profile:
        p_plots = profile_plots([record])
        plots_for += p_plots
        sections.append(("Profile", profile + _figures_html(p_plots, folder)))
    if run.figures:
        sections.append(("Figures", _table(("figure", "value", "unit", "better"),
                                           [(_shown(n), v * figure_unit(n)[1], figure_unit(n)[0] or "-",
                                             "higher" if record_metrics.higher_is_better(n) else "lower")
                                            for n, v in sorted(run.figures.items())])))
    sections.append(("Manifests", _table(("manifest", "name", "version", "sha256 (first 16)"), _manifest_rows(record))
                     + _definitions([("software", _e(", ".join(f"{k} {v}" for k, v in
                                                                record.software_versions.items()) or "-")),
                                     ("system", _e(", ".join(f"{k}={v}" for k, v in record.system_description.items()
                                                             if k != "hostname")))])))
    _write_plots(root, run.folder, plots_for)
    body = "".join(f"<h2>{_e(h)}</h2>{b}" for h, b in sections)
    write_text(root / run.page, _page(f"Run {record.run_id}", body, depth=1))


def _config_key(record: RunRecord) -> tuple:
    return (record.model_name, record.backend, record.scenario, record.mode, record.system_name,
            json.dumps(record.harness_settings, sort_keys=True, default=str))


INDEX_JS = r"""
(function () {
  var body = document.querySelector('#runs tbody'), rows = Array.prototype.slice.call(body.rows);
  var filters = Array.prototype.slice.call(document.querySelectorAll('select[data-filter]'));
  var search = document.getElementById('search'), figure = document.getElementById('figure');
  var state = {sort: null, dir: 1};
  function value(row, col) {
    var cell = row.cells[col], v = cell.getAttribute('data-v');
    if (v !== null && v !== '' && !isNaN(Number(v))) return Number(v);
    return v === '' ? null : cell.textContent.trim().toLowerCase();
  }
  function apply() {
    var shown = 0, text = search.value.trim().toLowerCase();
    rows.forEach(function (row) {
      var ok = filters.every(function (f) { return !f.value || row.getAttribute('data-' + f.getAttribute('data-filter')) === f.value; });
      if (ok && text) ok = row.textContent.toLowerCase().indexOf(text) >= 0;
      row.hidden = !ok; if (ok) shown++;
    });
    document.getElementById('count').textContent = shown + ' of ' + rows.length + ' runs shown';
    var hash = filters.filter(function (f) { return f.value; }).map(function (f) {
      return f.getAttribute('data-filter') + '=' + encodeURIComponent(f.value); });
    if (figure.value) hash.push('figure=' + encodeURIComponent(figure.value));
    if (state.sort !== null) hash.push('sort=' + state.sort + (state.dir < 0 ? '-' : ''));
    history.replaceState(null, '', hash.length ? '#' + hash.join('&') : location.pathname);
  }
  function sortBy(col, dir) {
    state.sort = col; state.dir = dir;
    document.querySelectorAll('#runs th[data-col]').forEach(function (th) {
      th.setAttribute('aria-sort', Number(th.getAttribute('data-col')) === col ? (dir > 0 ? 'ascending' : 'descending') : 'none'); });
    rows.sort(function (a, b) {
      var x = value(a, col), y = value(b, col);
      if (x === null && y === null) return 0; if (x === null) return 1; if (y === null) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    apply();
  }
  function showFigure() {
    var name = figure.value, col = rows.length ? rows[0].cells.length - 1 : 0;
    var factor = name ? Number(figure.options[figure.selectedIndex].getAttribute('data-factor')) : 1;
    document.getElementById('figure-head').textContent = name ? figure.options[figure.selectedIndex].text : 'figure';
    rows.forEach(function (row) {
      var figures = JSON.parse(row.getAttribute('data-figures') || '{}'), cell = row.cells[col];
      var v = name in figures ? figures[name] : null;
      if (v !== null) v = v * factor;
      cell.setAttribute('data-v', v === null ? '' : String(v));
      cell.textContent = v === null ? '-' : (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3)
        : Number(v.toPrecision(5)).toLocaleString('en-US', {maximumFractionDigits: 6});
    });
  }
  document.querySelectorAll('#runs th[data-col]').forEach(function (th) {
    th.addEventListener('click', function () {
      var col = Number(th.getAttribute('data-col'));
      sortBy(col, state.sort === col ? -state.dir : 1);
    });
  });
  filters.forEach(function (f) { f.addEventListener('change', apply); });
  search.addEventListener('input', apply);
  figure.addEventListener('change', function () { showFigure(); if (state.sort !== null) sortBy(state.sort, state.dir); else apply(); });
  document.getElementById('compare').addEventListener('click', function () {
    var ids = Array.prototype.slice.call(document.querySelectorAll('#runs input[type=checkbox]:checked'))
      .map(function (box) { return encodeURIComponent(box.value); });
    if (ids.length < 2) { document.getElementById('compare-note').textContent = 'tick two or more runs first'; return; }
    location.href = 'compare.html#' + ids.join(',');
  });
  // A view is kept in the address (#status=failed&figure=offline.samples_per_second&sort=9-) to share or bookmark.
  location.hash.replace(/^#/, '').split('&').forEach(function (part) {
    var kv = part.split('='), key = kv[0], val = decodeURIComponent(kv.slice(1).join('='));
    var f = filters.filter(function (x) { return x.getAttribute('data-filter') === key; })[0];
    if (f) f.value = val;
    if (key === 'figure') { figure.value = val; }
  });
  showFigure();
  var sort = /(?:^#|&)sort=(\d+)(-?)/.exec(location.hash);
  if (sort) sortBy(Number(sort[1]), sort[2] ? -1 : 1); else apply();
})();
"""


def _short_time(stamp: str | None) -> str:
    """2026-11-23T16:04:47+00:00 as 2026-11-23 16:04:47 (the database's times are UTC)."""
    return str(stamp or "-").replace("T", " ").removesuffix("+00:00")


def _index_page(root: Path, site: Site, sweeps: list[Any], has_bricks: bool) -> None:
    runs = site.runs
    columns = ("", "run", "started", "model", "backend", "scenario", "mode", "status", "system", "batch", "threads",
               "headline", "value", "LoadGen", "accuracy", "sweep", "figure")
    rows = []
    for run in runs:
        r = run.record
        name, _ = r.headline()
        headline = _headline_shown(r)
        accuracy = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(r.accuracy_values.items()))
        if r.accuracy_verdict:
            accuracy += f" ({r.accuracy_verdict})"
        sweep = (f"<a href='sweeps/{_e(slug(run.sweep_id))}.html'>{_e(run.sweep_id)}</a>" if run.sweep_id else "-")
        attrs = {"model": r.model_name or "", "scenario": r.scenario or "", "system": r.system_name or "",
                 "status": r.status or "", "backend": r.backend or "", "mode": r.mode or ""}
        data = " ".join(f"data-{k}='{_e(v)}'" for k, v in attrs.items())
        cells = [f"<td><input type='checkbox' value='{_e(r.run_id)}' aria-label='compare {_e(r.run_id)}'></td>",
                 f"<td data-v='{_e(r.run_id)}'><a href='{_e(run.page)}'>{_e(r.run_id)}</a></td>",
                 f"<td>{_e(_short_time(r.started_at))}</td>", f"<td>{_e(r.model_name)}</td>", f"<td>{_e(r.backend)}</td>",
                 f"<td>{_e(r.scenario)}</td>", f"<td>{_e(r.mode)}</td>", f"<td>{_status(r.status)}</td>",
                 f"<td>{_e(r.system_name)}</td>",
                 f"<td class='n' data-v='{_e('' if r.batch_size is None else r.batch_size)}'>{_e(r.batch_size)}</td>",
                 f"<td class='n' data-v='{_e('' if r.threads is None else r.threads)}'>{_e(r.threads)}</td>",
                 f"<td>{_e(_shown(name).partition('.')[2] if headline is not None else '-')}</td>",
                 f"<td class='n' data-v='{_e('' if headline is None else repr(headline))}'>{_e(headline)}</td>",
                 f"<td>{_e(r.loadgen_result)}</td>", f"<td>{_e(accuracy or '-')}</td>", f"<td>{sweep}</td>",
                 "<td class='n' data-v=''>-</td>"]
        figures = _e(json.dumps(run.figures, sort_keys=True))
        rows.append(f"<tr {data} data-figures='{figures}'>{''.join(cells)}</tr>")
    head = "".join(f"<th data-col='{i}'" + (" id='figure-head'" if c == "figure" else "") + f">{_e(c)}</th>"
                   if c else "<th>compare</th>" for i, c in enumerate(columns))

    def select(name: str, label: str, values: Iterable[str]) -> str:
        options = "".join(f"<option value='{_e(v)}'>{_e(v)}</option>" for v in sorted(set(values)) if v)
        return f"<label>{_e(label)} <select data-filter='{name}'><option value=''>all</option>{options}</select></label>"

    figure_names = sorted({n for run in runs for n in run.figures})
    controls = ("<div class='controls'>"
                + select("model", "model", (r.record.model_name or "" for r in runs))
                + select("scenario", "scenario", (r.record.scenario or "" for r in runs))
                + select("system", "system", (r.record.system_name or "" for r in runs))
                + select("status", "status", (r.record.status or "" for r in runs))
                + "<label>search <input id='search' type='search' placeholder='any text'></label>"
                + "<label>figure column <select id='figure'><option value=''>none</option>"
                + "".join(f"<option value='{_e(n)}' data-factor='{figure_unit(n)[1]!r}'>{_e(_shown(n))}</option>"
                          for n in figure_names)
                + "</select></label><button id='compare' type='button'>compare ticked runs</button>"
                  "<span id='compare-note' class='note'></span><span id='count' class='note'></span></div>")
    body = [f"<p class='note'>{len(runs)} runs in the results database. Click a column heading to sort by it "
            "(again to reverse); pick a figure to show and sort by any figure a run has.</p>", controls,
            f"<table id='runs'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"]
    if site.skipped:
        body.append("<h2>Records left out</h2><ul>" + "".join(f"<li>{_e(s)}</li>" for s in site.skipped) + "</ul>")
    body.append("<h2 id='sweeps'>Sweeps</h2>")
    if sweeps:
        body.append(_table(("sweep", "name", "grid", "cells run", "ok", "updated"),
                           [(f"<a href='sweeps/{_e(slug(s['sweep_id']))}.html'>{_e(s['sweep_id'])}</a>", _e(s["name"]),
                             _e(s["grid_path"]), s["cells"], s["ok"], _e(s["updated_at"])) for s in sweeps], raw=True))
    else:
        body.append("<p class='note'>No sweeps (mlharness sweep GRID.yaml).</p>")
    if has_bricks:
        body.append("<p>Layer benchmarks: <a href='bricks.html'>bricks</a></p>")
    write_text(root / "index.html", _page("Runs", "".join(body), depth=0, script=f"<script>{INDEX_JS}</script>"))


COMPARE_JS = r"""
(function () {
  var D = JSON.parse(document.getElementById('site-data').textContent);
  var out = document.getElementById('comparison');
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) { node.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
    return node;
  }
  function table(headers, rows) {
    return el('table', {}, [el('thead', {}, [el('tr', {}, headers.map(function (h) { return el('th', {}, [h]); }))]),
      el('tbody', {}, rows.map(function (r) { return el('tr', {}, r.map(function (c) {
        return c instanceof Node ? c : el('td', typeof c === 'number' ? {class: 'n'} : {}, [c === null || c === undefined ? '-' : String(c)]); })); }))]);
  }
  function fmt(v) {
    if (v === undefined || v === null) return '-';
    if (v !== 0 && Math.abs(v) < 1e-3) return v.toExponential(3);
    return Number(v.toPrecision(5)).toLocaleString('en-US', {maximumFractionDigits: 6});
  }
  function same(a, b) { return JSON.stringify(a === undefined ? null : a) === JSON.stringify(b === undefined ? null : b); }
  var ids = decodeURIComponent(location.hash.replace(/^#/, '')).split(',').filter(Boolean);
  var runs = [], missing = [];
  ids.forEach(function (id) { if (D.runs[id]) runs.push(D.runs[id]); else missing.push(id); });
  if (missing.length) out.appendChild(el('p', {class: 'failed'}, ['not in this site: ' + missing.join(', ')]));
  if (runs.length < 2) {
    out.appendChild(el('p', {}, ['Tick two or more runs on the ', el('a', {href: 'index.html'}, ['run list']),
      ' and press "compare ticked runs" (or open compare.html#RUN_ID,RUN_ID).']));
    return;
  }
  var names = runs.map(function (r, i) { return String.fromCharCode(65 + i); });
  document.title = 'Comparison of ' + runs.length + ' runs';
  out.appendChild(table(['', 'run', 'model', 'backend', 'scenario', 'mode', 'status', 'system', 'started'],
    runs.map(function (r, i) { return [names[i], el('td', {}, [el('a', {href: r.page}, [r.id])]), r.model, r.backend,
      r.scenario, r.mode, el('td', {class: r.status}, [r.status]), r.system, r.started]; })));
  // The gates' rules (harness/compare/comparability.py): same system and framework versions, else refused.
  var diffs = [];
  runs.slice(1).forEach(function (r, i) {
    var a = D.fingerprints[runs[0].fp], b = D.fingerprints[r.fp];
    Object.keys(Object.assign({}, a, b)).sort().forEach(function (k) {
      if (!same(a[k], b[k])) diffs.push(names[i + 1] + ' vs A: ' + k + ': ' + JSON.stringify(a[k]) + ' vs ' + JSON.stringify(b[k]));
    });
  });
  var verdict = el('div', {id: 'comparability'}, []);
  if (!diffs.length) {
    verdict.appendChild(el('p', {class: 'ok'}, ['Comparable: the same system and framework versions.']));
  } else {
    verdict.appendChild(el('p', {class: 'failed'}, ['Not comparable: a gate refuses these runs unless --allow-different-systems.']));
    verdict.appendChild(el('ul', {}, diffs.map(function (d) { return el('li', {}, [d]); })));
  }
  var notes = [];
  runs.slice(1).forEach(function (r, i) {
    var differ = ['model', 'backend', 'scenario'].filter(function (k) { return r[k] !== runs[0][k]; });
    if (!same(r.harness, runs[0].harness)) differ.push('harness settings');
    if (differ.length) notes.push(names[i + 1] + ' is another configuration than A (' + differ.join(', ') + '): a gate matches runs by model, backend, scenario and settings.');
    if (!same(r.loadgen, runs[0].loadgen)) notes.push(names[i + 1] + ' ran with other LoadGen settings than A (see below).');
  });
  runs.forEach(function (r, i) { if (r.status !== 'ok') notes.push(names[i] + ' did not finish (' + r.status + '): a gate fails a failed candidate and leaves out a failed baseline.'); });
  notes.forEach(function (n) { verdict.appendChild(el('p', {class: 'note'}, [n])); });
  out.appendChild(el('h2', {}, ['Comparability']));
  out.appendChild(verdict);
  var figures = {};
  runs.forEach(function (r) { Object.keys(r.figures).forEach(function (k) { figures[k] = 1; }); });
  var headers = ['figure', 'A'];
  names.slice(1).forEach(function (n) { headers.push(n, n + ' vs A'); });
  headers.push('better');
  var rows = Object.keys(figures).sort().map(function (k) {
    var unit = D.units[k] || ['', 1], a = runs[0].figures[k], row = [D.labels[k], fmt(a === undefined ? a : a * unit[1])];
    runs.slice(1).forEach(function (r) {
      var b = r.figures[k], change = null, cls = {};
      row.push(fmt(b === undefined ? b : b * unit[1]));
      if (a !== undefined && b !== undefined && a !== 0) {
        change = 100 * (b - a) / Math.abs(a);
        if (Math.abs(change) >= 0.005) cls = {class: (change > 0) === D.higher[k] ? 'good' : 'bad'};
      }
      row.push(el('td', cls, [change === null ? '-' : (change >= 0 ? '+' : '') + change.toFixed(2) + '%']));
    });
    row.push(D.higher[k] ? 'higher' : 'lower');
    return row;
  });
  out.appendChild(el('h2', {}, ['Figures']));
  out.appendChild(table(headers, rows));
  var keys = {};
  runs.forEach(function (r) { Object.keys(r.settings).forEach(function (k) { keys[k] = 1; }); });
  var differing = Object.keys(keys).sort().filter(function (k) {
    return runs.some(function (r) { return !same(r.settings[k], runs[0].settings[k]); }); });
  out.appendChild(el('h2', {}, ['Settings and manifests that differ']));
  out.appendChild(differing.length ? table(['key'].concat(names), differing.map(function (k) {
    return [k].concat(runs.map(function (r) { return r.settings[k] === undefined ? '-' : String(r.settings[k]); })); }))
    : el('p', {class: 'note'}, ['none: the same settings and manifests']));
  var plots = runs.filter(function (r) { return r.latency; });
  if (plots.length) {
    out.appendChild(el('h2', {}, ['Latency percentiles']));
    out.appendChild(el('div', {class: 'side'}, plots.map(function (r) {
      return el('figure', {}, [el('img', {src: r.latency, alt: 'latency percentiles of ' + r.id}),
        el('figcaption', {}, [names[runs.indexOf(r)] + ': ' + r.id])]); })));
  }
})();
"""


def _flat_settings(record: RunRecord) -> dict[str, Any]:
    found: dict[str, Any] = {f"loadgen.{k}": v for k, v in record.loadgen_settings.items()}
    found.update({f"harness.{k}": v for k, v in record.harness_settings.items()})
    for kind, ref in record.manifest_refs():
        found[f"{kind}.{ref.get('name')}"] = f"{ref.get('version')} sha256 {str(ref.get('sha256'))[:12]}"
    return found


def _compare_page(root: Path, site: Site) -> None:
    fingerprints: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    units: dict[str, list[Any]] = {}
    labels: dict[str, str] = {}
    higher: dict[str, bool] = {}
    for run in site.runs:
        r = run.record
        fp = comparability.fingerprint(r)
        fp_key = hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:12]
        fingerprints[fp_key] = fp
        latency = next((f"{run.folder}/{p}" for p in [f"latency-{r.scenario}.png"]
                        if (root / run.folder / p).is_file()), None)
        runs[r.run_id] = {"id": r.run_id, "page": run.page, "model": r.model_name, "backend": r.backend,
                          "scenario": r.scenario, "mode": r.mode, "status": r.status, "system": r.system_name,
                          "started": r.started_at, "figures": run.figures, "fp": fp_key,
                          "settings": _flat_settings(r), "harness": r.harness_settings, "loadgen": r.loadgen_settings,
                          "latency": latency}
        for name in run.figures:
            unit, factor = figure_unit(name)
            units[name] = [unit, factor]
            labels[name] = _shown(name)
            higher[name] = record_metrics.higher_is_better(name)
    data = {"runs": runs, "fingerprints": fingerprints, "units": units, "labels": labels, "higher": higher}
    body = ("<p class='note'>Runs side by side: each figure of B, C, ... against A, coloured by whether the change is "
            "better (green) or worse (red) for that figure; comparability as the gates judge it "
            "(same CPU, device and versions of the packages the software manifest declares).</p>"
            "<div id='comparison'></div>" + _json_script("site-data", data))
    write_text(root / "compare.html", _page("Comparison", body, depth=0, script=f"<script>{COMPARE_JS}</script>"))


def _sweep_page(root: Path, store: Any, sweep: Any, site: Site) -> None:
    from mlharness.sweeps.sweep import best_configurations, sweep_rows

    sweep_id = sweep["sweep_id"]
    name = slug(sweep_id)
    folder = f"sweeps/{name}"
    rows = sweep_rows(store, sweep_id)
    pages = {run.record.run_id: run.page for run in site.runs}
    records = [RunRecord.from_dict(row["record"]) for row in rows if row["record"] is not None]
    heat = sweep_heatmaps(rows, sweep_id)
    others = throughput_plots(records) + latency_plots(records)
    _write_plots(root, folder, heat + others)
    cells = []
    for row in rows:
        cell, cell_row, record = row["cell"], row["row"], row["record"]
        value = record_metrics.headline(record)[1] if record else None
        run_id = cell_row["run_id"]
        link = f"<a href='../{_e(pages[run_id])}'>{_e(run_id)}</a>" if run_id in pages else _e(run_id)
        cells.append((_e(cell.label()), cell_row["repeat_index"], _status(cell_row["status"]), cell_row["seconds"],
                      value, link, _e((cell_row["error"] or "")[:200] or "-")))
    best = [(e["cell"].scenario, e["cell"].model, e["backend"], e["cell"].setting("max_batch_size"),
             e["cell"].setting("intra_op_threads"), _shown(e["metric"]), e["median"] * figure_unit(e["metric"])[1],
             len(e["values"])) for e in best_configurations(rows)]
    ok_ids = [row["row"]["run_id"] for row in rows if row["row"]["status"] == "ok" and row["row"]["run_id"] in pages]
    parts = [_definitions([("grid", f"<code>{_e(sweep['grid_path'])}</code>"), ("cells run", _e(len(rows))),
                           ("ok", _e(sum(1 for r in rows if r["row"]["status"] == "ok"))),
                           ("updated", _e(sweep["updated_at"]))])]
    if len(ok_ids) >= 2:
        parts.append(f"<p><a href='../compare.html#{_e(','.join(ok_ids))}'>compare the sweep's ok runs</a></p>")
    parts.append("<h2>Heat maps</h2>" + (_figures_html(heat, name) or
                                         "<p class='note'>No heat map: the sweep has fewer than two cells of one "
                                         "configuration with a headline figure.</p>"))
    parts.append("<h2>Best configuration per scenario and model</h2>"
                 + _table(("scenario", "model", "backend", "batch", "threads", "metric", "median", "runs"), best))
    parts.append("<h2>Cells</h2>" + _table(("cell", "repeat", "status", "seconds", "headline", "run", "error"),
                                           cells, raw=True))
    if others:
        parts.append("<h2>Plots</h2>" + _figures_html(others, name))
    write_text(root / f"sweeps/{name}.html", _page(f"Sweep {sweep_id}", "".join(parts), depth=1))


def _bricks_page(root: Path, site: Site) -> bool:
    records = latest_bricks([run.record for run in site.runs])
    records = [r for r in records if (r.bricks or {}).get("summary")]
    pages = {run.record.run_id: run.page for run in site.runs}
    if not records:
        body = "<p class='note'>No layer benchmarks in the database (mlharness bricks MODEL).</p>"
    else:
        plots = bricks_plots(records)
        _write_plots(root, "bricks", plots)
        links = " · ".join(f"<a href='{_e(pages[r.run_id])}'>{_e(r.model_name)}</a>" for r in records)
        body = (f"<p class='note'>Each model's latest layer benchmark. Run pages: {links}</p>"
                + bricks_table(records) + _figures_html(plots, "bricks"))
    write_text(root / "bricks.html", _page("Layer benchmarks (bricks)", body, depth=0))
    return bool(records)


def write_site(store: Any, out_dir: Path | str) -> Path:
    """Write the whole site from an open ResultStore; returns the path of index.html."""
    root = Path(out_dir)
    if root.exists() and not root.is_dir():
        raise UserError(f"{root}: not a folder (--site needs a folder to write the site into)")
    site = load_site(store)
    previous: dict[tuple, SiteRun] = {}
    for run in reversed(site.runs):  # oldest first, so each run knows the one before it
        key = _config_key(run.record)
        _run_page(root, run, previous.get(key))
        previous[key] = run
    sweeps = store.list_sweeps()
    for sweep in sweeps:
        _sweep_page(root, store, sweep, site)
    has_bricks = _bricks_page(root, site)
    _compare_page(root, site)
    _index_page(root, site, sweeps, has_bricks)
    return root / "index.html"
