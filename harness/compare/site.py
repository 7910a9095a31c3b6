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
import json
from pathlib import Path
from typing import Any, Iterable

from mlharness.atomic_io import write_text
from mlharness.compare import comparability
from mlharness.compare.report import bricks_table, latest_bricks
from mlharness.compare.report_plots import bricks_plots, latency_plots, throughput_plots
from mlharness.compare.site_html import asset, definitions, esc, figures_html, json_script, page, slug, status_badge, table
from mlharness.compare.site_plots import figure_unit, shown_name, sweep_heatmaps
from mlharness.compare.site_run_page import Site, SiteRun, headline_shown, load_site, write_plots, write_run_page
from mlharness.errors import UserError
from mlharness.records import record_metrics
from mlharness.records.run_record import RunRecord
from mlharness.tables import format_value


def _config_key(record: RunRecord) -> tuple:
    return (record.model_name, record.backend, record.scenario, record.mode, record.system_name,
            json.dumps(record.harness_settings, sort_keys=True, default=str))


def _short_time(stamp: str | None) -> str:
    """2026-11-23T16:04:47+00:00 as 2026-11-23 16:04:47 (the database's times are UTC)."""
    return str(stamp or "-").replace("T", " ").removesuffix("+00:00")


INDEX_COLUMNS = ("", "run", "started", "model", "backend", "scenario", "mode", "status", "system", "batch", "threads",
                 "headline", "value", "LoadGen", "accuracy", "sweep", "figure")


def _index_row(run: SiteRun) -> str:
    """One run's row of the run list: its filter attributes, its figures for the figure column, and
    a cell per column (sortable numbers carry data-v)."""
    r = run.record
    name, _ = r.headline()
    headline = headline_shown(r)
    accuracy = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(r.accuracy_values.items()))
    if r.accuracy_verdict:
        accuracy += f" ({r.accuracy_verdict})"
    sweep = (f"<a href='sweeps/{esc(slug(run.sweep_id))}.html'>{esc(run.sweep_id)}</a>" if run.sweep_id else "-")
    attrs = {"model": r.model_name or "", "scenario": r.scenario or "", "system": r.system_name or "",
             "status": r.status or "", "backend": r.backend or "", "mode": r.mode or ""}
    data = " ".join(f"data-{k}='{esc(v)}'" for k, v in attrs.items())
    cells = [f"<td><input type='checkbox' value='{esc(r.run_id)}' aria-label='compare {esc(r.run_id)}'></td>",
             f"<td data-v='{esc(r.run_id)}'><a href='{esc(run.page)}'>{esc(r.run_id)}</a></td>",
             f"<td>{esc(_short_time(r.started_at))}</td>", f"<td>{esc(r.model_name)}</td>", f"<td>{esc(r.backend)}</td>",
             f"<td>{esc(r.scenario)}</td>", f"<td>{esc(r.mode)}</td>", f"<td>{status_badge(r.status)}</td>",
             f"<td>{esc(r.system_name)}</td>",
             f"<td class='n' data-v='{esc('' if r.batch_size is None else r.batch_size)}'>{esc(r.batch_size)}</td>",
             f"<td class='n' data-v='{esc('' if r.threads is None else r.threads)}'>{esc(r.threads)}</td>",
             f"<td>{esc(shown_name(name).partition('.')[2] if headline is not None else '-')}</td>",
             f"<td class='n' data-v='{esc('' if headline is None else repr(headline))}'>{esc(headline)}</td>",
             f"<td>{esc(r.loadgen_result)}</td>", f"<td>{esc(accuracy or '-')}</td>", f"<td>{sweep}</td>",
             "<td class='n' data-v=''>-</td>"]
    figures = esc(json.dumps(run.figures, sort_keys=True))
    return f"<tr {data} data-figures='{figures}'>{''.join(cells)}</tr>"


def _filter_select(name: str, label: str, values: Iterable[str]) -> str:
    options = "".join(f"<option value='{esc(v)}'>{esc(v)}</option>" for v in sorted(set(values)) if v)
    return f"<label>{esc(label)} <select data-filter='{name}'><option value=''>all</option>{options}</select></label>"


def _index_controls(runs: list[SiteRun]) -> str:
    """The run list's filters, search box, figure column picker (every figure any run has) and compare button."""
    figure_names = sorted({n for run in runs for n in run.figures})
    return ("<div class='controls'>"
            + _filter_select("model", "model", (r.record.model_name or "" for r in runs))
            + _filter_select("scenario", "scenario", (r.record.scenario or "" for r in runs))
            + _filter_select("system", "system", (r.record.system_name or "" for r in runs))
            + _filter_select("status", "status", (r.record.status or "" for r in runs))
            + "<label>search <input id='search' type='search' placeholder='any text'></label>"
            + "<label>figure column <select id='figure'><option value=''>none</option>"
            + "".join(f"<option value='{esc(n)}' data-factor='{figure_unit(n)[1]!r}'>{esc(shown_name(n))}</option>"
                      for n in figure_names)
            + "</select></label><button id='compare' type='button'>compare ticked runs</button>"
              "<span id='compare-note' class='note'></span><span id='count' class='note'></span></div>")


def _index_page(root: Path, site: Site, sweeps: list[Any], has_bricks: bool) -> None:
    runs = site.runs
    rows = [_index_row(run) for run in runs]
    head = "".join(f"<th data-col='{i}'" + (" id='figure-head'" if c == "figure" else "") + f">{esc(c)}</th>"
                   if c else "<th>compare</th>" for i, c in enumerate(INDEX_COLUMNS))
    body = [f"<p class='note'>{len(runs)} runs in the results database. Click a column heading to sort by it "
            "(again to reverse); pick a figure to show and sort by any figure a run has.</p>", _index_controls(runs),
            f"<table id='runs'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"]
    if site.skipped:
        body.append("<h2>Records left out</h2><ul>" + "".join(f"<li>{esc(s)}</li>" for s in site.skipped) + "</ul>")
    body.append("<h2 id='sweeps'>Sweeps</h2>")
    if sweeps:
        body.append(table(("sweep", "name", "grid", "cells run", "ok", "updated"),
                           [(f"<a href='sweeps/{esc(slug(s['sweep_id']))}.html'>{esc(s['sweep_id'])}</a>", esc(s["name"]),
                             esc(s["grid_path"]), s["cells"], s["ok"], esc(s["updated_at"])) for s in sweeps], raw=True))
    else:
        body.append("<p class='note'>No sweeps (mlharness sweep GRID.yaml).</p>")
    if has_bricks:
        body.append("<p>Layer benchmarks: <a href='bricks.html'>bricks</a></p>")
    write_text(root / "index.html", page("Runs", "".join(body), depth=0, script=f"<script>{asset('index.js')}</script>"))


def _flat_settings(record: RunRecord) -> dict[str, Any]:
    found: dict[str, Any] = {f"loadgen.{k}": v for k, v in record.loadgen_settings.items()}
    found.update({f"harness.{k}": v for k, v in record.harness_settings.items()})
    for kind, ref in record.manifest_refs():
        found[f"{kind}.{ref.name}"] = f"{ref.version} sha256 {str(ref.sha256)[:12]}"
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
            labels[name] = shown_name(name)
            higher[name] = record_metrics.higher_is_better(name)
    data = {"runs": runs, "fingerprints": fingerprints, "units": units, "labels": labels, "higher": higher}
    body = ("<p class='note'>Runs side by side: each figure of B, C, ... against A, coloured by whether the change is "
            "better (green) or worse (red) for that figure; comparability as the gates judge it "
            "(same CPU, device and versions of the packages the software manifest declares).</p>"
            "<div id='comparison'></div>" + json_script("site-data", data))
    write_text(root / "compare.html", page("Comparison", body, depth=0, script=f"<script>{asset('compare.js')}</script>"))


def _sweep_page(root: Path, store: Any, sweep: Any, site: Site) -> None:
    from mlharness.sweeps.sweep import best_configurations, sweep_rows

    sweep_id = sweep["sweep_id"]
    name = slug(sweep_id)
    folder = f"sweeps/{name}"
    rows = sweep_rows(store, sweep_id)
    pages = {run.record.run_id: run.page for run in site.runs}
    records = [row.record for row in rows if row.record is not None]
    heat = sweep_heatmaps(rows, sweep_id)
    others = throughput_plots(records) + latency_plots(records)
    write_plots(root, folder, heat + others)
    cells = []
    for row in rows:
        value = record_metrics.headline(row.record)[1] if row.record else None
        run_id = row.run_id
        link = f"<a href='../{esc(pages[run_id])}'>{esc(run_id)}</a>" if run_id in pages else esc(run_id)
        cells.append((esc(row.cell.label()), row.repeat_index, status_badge(row.status), row.seconds,
                      value, link, esc((row.error or "")[:200] or "-")))
    best = [(e["cell"].scenario, e["cell"].model, e["backend"], e["cell"].setting("max_batch_size"),
             e["cell"].setting("intra_op_threads"), shown_name(e["metric"]), e["median"] * figure_unit(e["metric"])[1],
             len(e["values"])) for e in best_configurations(rows)]
    ok_ids = [row.run_id for row in rows if row.status == "ok" and row.run_id in pages]
    parts = [definitions([("grid", f"<code>{esc(sweep['grid_path'])}</code>"), ("cells run", esc(len(rows))),
                           ("ok", esc(sum(1 for r in rows if r.status == "ok"))),
                           ("updated", esc(sweep["updated_at"]))])]
    if len(ok_ids) >= 2:
        parts.append(f"<p><a href='../compare.html#{esc(','.join(ok_ids))}'>compare the sweep's ok runs</a></p>")
    parts.append("<h2>Heat maps</h2>" + (figures_html(heat, name) or
                                         "<p class='note'>No heat map: the sweep has fewer than two cells of one "
                                         "configuration with a headline figure.</p>"))
    parts.append("<h2>Best configuration per scenario and model</h2>"
                 + table(("scenario", "model", "backend", "batch", "threads", "metric", "median", "runs"), best))
    parts.append("<h2>Cells</h2>" + table(("cell", "repeat", "status", "seconds", "headline", "run", "error"),
                                           cells, raw=True))
    if others:
        parts.append("<h2>Plots</h2>" + figures_html(others, name))
    write_text(root / f"sweeps/{name}.html", page(f"Sweep {sweep_id}", "".join(parts), depth=1))


def _bricks_page(root: Path, site: Site) -> bool:
    records = latest_bricks([run.record for run in site.runs])
    records = [r for r in records if r.bricks_summary is not None]
    pages = {run.record.run_id: run.page for run in site.runs}
    if not records:
        body = "<p class='note'>No layer benchmarks in the database (mlharness bricks MODEL).</p>"
    else:
        plots = bricks_plots(records)
        write_plots(root, "bricks", plots)
        links = " · ".join(f"<a href='{esc(pages[r.run_id])}'>{esc(r.model_name)}</a>" for r in records)
        body = (f"<p class='note'>Each model's latest layer benchmark. Run pages: {links}</p>"
                + bricks_table(records) + figures_html(plots, "bricks"))
    write_text(root / "bricks.html", page("Layer benchmarks (bricks)", body, depth=0))
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
        write_run_page(root, run, previous.get(key))
        previous[key] = run
    sweeps = store.list_sweeps()
    for sweep in sweeps:
        _sweep_page(root, store, sweep, site)
    has_bricks = _bricks_page(root, site)
    _compare_page(root, site)
    _index_page(root, site, sweeps, has_bricks)
    return root / "index.html"
