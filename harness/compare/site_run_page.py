"""The results site's runs as loaded from the database, and one run's page: settings and where each
came from, LoadGen's summary, accuracy against the reference, cold start, profile, error and traceback."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_bytes, write_text
from mlharness.compare.report import bricks_table
from mlharness.compare.report_plots import Plot, accuracy_plots, bricks_plots, latency_plots, profile_plots
from mlharness.compare.site_html import definitions, esc, figures_html, page, slug, status_badge, table
from mlharness.compare.site_plots import accuracy_reference_plot, figure_unit, shown_name
from mlharness.errors import UserError
from mlharness.records import record_metrics
from mlharness.records.run_record import BRICKS, RunRecord
from mlharness.tables import format_value


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
            record = store.record_of(row)
        except (UserError, ValueError) as exc:
            skipped.append(f"{row['run_id']}: {exc}")
            continue
        name = slug(record.run_id)
        runs.append(SiteRun(record, row["sweep_id"], f"runs/{name}.html", f"runs/{name}", record.figures()))
    return Site(runs, skipped)


COPY_LIMIT_BYTES = 64 * 2**20  # a profile timeline or traceback larger than this is named, not copied


def copy_into(src: Path, dest: Path) -> bool:
    """Copy a file the results tree still holds into the site; False when it is gone or too large."""
    try:
        if not src.is_file() or src.stat().st_size > COPY_LIMIT_BYTES:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        return True
    except OSError:
        return False


def write_plots(root: Path, folder: str, plots: list[Plot]) -> None:
    for plot in plots:
        write_bytes(root / folder / plot.filename, plot.png)


def _settings_rows(record: RunRecord) -> list[tuple[str, str, Any, str]]:
    origins = record.setting_origins
    rows = [("LoadGen", key, value, origins.get(key, "-")) for key, value in sorted(record.loadgen_settings.items())]
    rows += [("harness", key, value, origins.get(key, "default" if key not in origins else origins[key]))
             for key, value in sorted(record.harness_settings.items())]
    return rows


def _manifest_rows(record: RunRecord) -> list[tuple[str, Any, Any, Any]]:
    return [(kind, ref.name, ref.version, (ref.sha256 or "")[:16]) for kind, ref in record.manifest_refs()]


def _profile_section(root: Path, run: SiteRun) -> str:
    record, profile = run.record, run.record.profile
    if not isinstance(profile, dict) or not profile:
        return ""
    parts = [definitions([("levels", esc(", ".join(f"{k}: {v}" for k, v in (profile.get("levels") or {}).items()))),
                           ("measured overhead", esc(", ".join(f"{k} {v}%" for k, v in
                                                             (profile.get("overhead_pct") or {}).items()) or "-"))])]
    stages = [(name, s.get("count"), s.get("p50_ms"), s.get("p90_ms"), s.get("p99_ms"))
              for name, s in sorted((profile.get("stages") or {}).items()) if isinstance(s, dict)]
    if stages:
        parts.append(table(("stage", "count", "p50 (ms)", "p90 (ms)", "p99 (ms)"), stages))
    top = [(o.get("op") or o.get("name"), o.get("self_ms"), o.get("total_ms"), o.get("count"))
           for o in profile.get("top_operators") or [] if isinstance(o, dict)]
    if top:
        parts.append(table(("operator", "self (ms)", "total (ms)", "calls"), top[:15]))
    source = Path(str(record.results_path or "")) / str(profile.get("dir") or "profile")
    links = []
    for name in ("timeline.json", "summary.json"):
        if name not in (profile.get("files") or [name]):
            continue
        if copy_into(source / name, root / run.folder / "profile" / name):
            links.append(f"<a href='{esc(Path(run.folder).name)}/profile/{name}'>{name}</a>")
        else:
            links.append(f"{name}: <code>{esc(str(source / name))}</code> (not on disk or too large to copy)")
    if links:
        parts.append("<p>Profile files: " + " · ".join(links)
                     + " <span class='note'>(the timeline opens in chrome://tracing or ui.perfetto.dev)</span></p>")
    return "".join(parts)


def _loadgen_section(record: RunRecord) -> str:
    perf = record.perf
    if perf is None:
        return "<p class='note'>No LoadGen performance summary (an accuracy run, a layer benchmark, or a run that " \
               "failed before one was written).</p>"
    # LoadGen's summary shown whole, by its own labels (free-form: LoadGen's version decides them); a
    # summary without its lines shows every key the record stored.
    rows = list(perf.raw.items()) or [(k, v) for k, v in perf.stored.items() if k not in ("raw", "metric")]
    parts = [definitions([("result", esc(record.loadgen_result or "-")),
                           ("headline", esc(f"{shown_name(record.headline()[0])}: {format_value(headline_shown(record))}"))])]
    if record.status == "failed":
        parts.append("<p class='note'>The run failed: this is LoadGen's summary up to the failure, not a result.</p>")
    parts.append(f"<details><summary>all {len(rows)} keys of LoadGen's summary</summary>"
                 + table(("LoadGen summary key", "value"), rows) + "</details>")
    for mode, logged in sorted(record.loadgen_logs.items()):
        for kind, lines in (("errors", logged.errors), ("warnings", logged.warnings)):
            if lines:
                parts.append(f"<p><b>LoadGen {kind} ({esc(mode)})</b></p><ul>"
                             + "".join(f"<li><code>{esc(x)}</code></li>" for x in lines) + "</ul>")
    return "".join(parts)


def headline_shown(record: RunRecord) -> float | None:
    name, value = record.headline()
    return None if value is None else value * figure_unit(name)[1]


def _accuracy_section(record: RunRecord) -> str:
    accuracy = record.accuracy_result
    if accuracy is None:
        return ""
    parts = [definitions([("metric", esc(accuracy.metric or "-")),
                           ("result", esc(accuracy.headline or "-")),
                           ("reference", esc(accuracy.reference or "none (no reference log for this model, "
                                                                    "dataset and backend)")),
                           ("verdict", esc(accuracy.verdict or "-"))])]
    values = [(k, v) for k, v in sorted(accuracy.values.items())]
    if values:
        parts.append(table(("accuracy figure", "value"), values))
    checks = [(c.name, c.expected, c.tolerance, c.measured, c.verdict) for c in accuracy.checks]
    if checks:
        parts.append(table(("check", "expected", "tolerance", "measured", "verdict"), checks))
    for note in accuracy.notes:
        parts.append(f"<p class='note'>{esc(note)}</p>")
    return "".join(parts)


def _cold_start_section(record: RunRecord) -> str:
    cold = record.cold
    if cold is None:
        return ""
    rows = []
    # Every phase the run's runtime timed (they differ by runtime: a server's connect, an LLM's tokenizer).
    for key, value in cold.figures().items():
        unit, factor = figure_unit(f"coldstart.{key}")
        if key.endswith("_seconds") and value < 1:
            unit, factor = "ms", 1e3
        rows.append((key.removesuffix("_seconds").removesuffix("_bytes"), value * factor, unit))
    warmup = cold.warmup
    if warmup is not None:
        for key, value in (("queries", warmup.queries), ("samples", warmup.samples), ("batch_size", warmup.batch_size)):
            if value is not None:
                rows.append((f"warm-up {key}", value, "count"))
        if warmup.seconds is not None:
            rows.append(("warm-up time", warmup.seconds * 1e3, "ms"))
    for key, value in (cold.device_memory.figures() if cold.device_memory else {}).items():
        rows.append((f"device {key}", value * 2**-20, "MiB"))
    return table(("cold start / memory", "value", "unit"), rows)


def _error_section(root: Path, run: SiteRun) -> str:
    record = run.record
    if not record.error and record.status != "failed":
        return ""
    parts = [f"<div class='error'>{esc(record.error or 'failed without an error message')}</div>"]
    items = [("results folder", f"<code>{esc(record.results_path or '-')}</code>")]
    traceback = record.error_traceback
    if not traceback and record.results_path and (Path(record.results_path) / "traceback.txt").is_file():
        traceback = str(Path(record.results_path) / "traceback.txt")
    if traceback:
        text = f"<code>{esc(traceback)}</code>"
        if copy_into(Path(traceback), root / run.folder / "traceback.txt"):
            text += f" (<a href='{esc(Path(run.folder).name)}/traceback.txt'>copy</a>)"
        items.append(("traceback", text))
    else:
        items.append(("traceback", "none kept: the error is the user's code or settings, named above"))
    parts.append(definitions(items))
    return "".join(parts)


def _run_summary(run: SiteRun, previous: SiteRun | None) -> str:
    """The run's identity, command and folder, with links to its sweep and to the previous run."""
    record = run.record
    links = []
    if run.sweep_id:
        links.append(f"sweep <a href='../sweeps/{esc(slug(run.sweep_id))}.html'>{esc(run.sweep_id)}</a>")
    if previous is not None:
        links.append(f"<a href='../compare.html#{esc(previous.record.run_id)},{esc(record.run_id)}'>compare with the "
                     f"previous run of this configuration</a> ({esc(previous.record.run_id)})")
    summary = [("status", status_badge(record.status)),
               ("model / backend", esc(f"{record.model_name} / {record.backend}")),
               ("scenario / mode", esc(f"{record.scenario} / {record.mode}")),
               ("kind", esc(record.kind)), ("system", esc(record.system_name)),
               ("started / finished", esc(f"{record.started_at} / {record.finished_at}")),
               ("command", f"<code>{esc(record.command)}</code>"),
               ("results folder", f"<code>{esc(record.results_path)}</code>")]
    if links:
        summary.append(("see also", " · ".join(links)))
    return definitions(summary)


def _figures_table(figures: dict[str, float]) -> str:
    """Every figure in its shown unit, with which way is better."""
    return table(("figure", "value", "unit", "better"),
                 [(shown_name(n), v * figure_unit(n)[1], figure_unit(n)[0] or "-",
                   "higher" if record_metrics.higher_is_better(n) else "lower") for n, v in sorted(figures.items())])


def _manifests_section(record: RunRecord) -> str:
    """The manifests the run named, the package versions and the system it ran on."""
    software = ", ".join(f"{k} {v}" for k, v in record.software_versions.items()) or "-"
    system = ", ".join(f"{k}={v}" for k, v in record.system_description.items() if k != "hostname")
    return (table(("manifest", "name", "version", "sha256 (first 16)"), _manifest_rows(record))
            + definitions([("software", esc(software)), ("system", esc(system))]))


def write_run_page(root: Path, run: SiteRun, previous: SiteRun | None) -> None:
    record = run.record
    folder = Path(run.folder).name
    sections: list[tuple[str, str]] = [("Run", _run_summary(run, previous))]
    error = _error_section(root, run)
    if error:
        sections.append(("Error", error))
    plots_for = []
    if record.is_loadgen:
        sections.append(("LoadGen summary", _loadgen_section(record)))
        latency = latency_plots([record])
        plots_for += latency
        if latency:
            sections.append(("Latency percentiles", figures_html(latency, folder)))
    accuracy = _accuracy_section(record)
    if accuracy:
        acc_plots = accuracy_reference_plot(record) or accuracy_plots([record])
        plots_for += acc_plots
        sections.append(("Accuracy vs reference", accuracy + figures_html(acc_plots, folder)))
    if record.kind == BRICKS and record.bricks_result is not None:
        b_plots = bricks_plots([record])
        plots_for += b_plots
        sections.append(("Bricks (layer benchmark)", bricks_table([record]) + figures_html(b_plots, folder)))
    settings = _settings_rows(record)
    if settings:
        layers = " < ".join(record.setting_layers)
        sections.append(("Settings and where each came from",
                         (f"<p class='note'>Layers, lowest first: {esc(layers)}</p>" if layers else "")
                         + table(("kind", "key", "value", "set by"), settings)))
    cold = _cold_start_section(record)
    if cold:
        sections.append(("Cold start and memory", cold))
    profile = _profile_section(root, run)
    if profile:
        p_plots = profile_plots([record])
        plots_for += p_plots
        sections.append(("Profile", profile + figures_html(p_plots, folder)))
    if run.figures:
        sections.append(("Figures", _figures_table(run.figures)))
    sections.append(("Manifests", _manifests_section(record)))
    write_plots(root, run.folder, plots_for)
    body = "".join(f"<h2>{esc(h)}</h2>{b}" for h, b in sections)
    write_text(root / run.page, page(f"Run {record.run_id}", body, depth=1))
