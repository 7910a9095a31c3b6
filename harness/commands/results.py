"""`mlharness results list|show|compare|import|sweeps|sweep|export`: query the results database."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlharness.errors import UserError
from mlharness.running.settings import SCENARIOS

if TYPE_CHECKING:
    from mlharness.records.payloads import ManifestRef
    from mlharness.records.run_record import RunRecord


def add_db_arguments(parser: argparse.ArgumentParser) -> None:
    """--results-dir and --db, shared by every command that opens the results database."""
    parser.add_argument("--results-dir", default="results", help="results tree root (default: results)")
    parser.add_argument("--db", help="results database file (default: $MLHARNESS_DB, else RESULTS_DIR/mlharness.sqlite)")


def output_path(flag: str, value: str, folder: bool = False) -> Path:
    """A path the user named for output (a file, or a folder with `folder`), refused in one line naming
    the flag when it is the other kind or lies below a file; missing parent folders are created when
    it is written, as `mkdir -p` would."""
    path = Path(value)
    if path.exists() and path.is_dir() != folder:
        raise UserError(f"{flag} {path}: a file; name a folder to write into" if folder else
                        f"{flag} {path}: a folder; name the file to write")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is a file, not a folder")
    return path


def write_output(flag: str, path: Path, text: str) -> None:
    """Write a named output file whole (a temporary file renamed), a failure one line naming the flag."""
    from mlharness.atomic_io import write_text

    try:
        write_text(path, text)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None


def open_store(args: argparse.Namespace, create: bool = False):  # noqa: ANN201 - ResultStore, imported lazily
    from mlharness.store.result_store import ResultStore, resolve_db_path

    return ResultStore(resolve_db_path(args.db, args.results_dir), create=create)


def cmd_list(args: argparse.Namespace) -> int:
    from mlharness.tables import format_table

    if args.limit < 0:
        raise UserError(f"--limit: expected a number of rows >= 0 (0 = all), got {args.limit}")
    with open_store(args) as store:
        rows = store.list_runs(_run_filter(args), limit=args.limit)
    if args.json:
        print(json.dumps([{k: row[k] for k in row.keys() if k != "record_json"} for row in rows], indent=2))
        return 0
    table = [(r["run_id"], r["started_at"], r["model"], r["backend"], r["scenario"], r["mode"], r["status"],
              r["batch_size"], r["threads"], (r["metric_name"] or "").partition(".")[2] or None, r["metric_value"],
              r["sweep_id"]) for r in rows]
    print(format_table(("run id", "started", "model", "backend", "scenario", "mode", "status", "batch", "threads",
                        "metric", "value", "sweep"), table))
    return 0


def describe(record: RunRecord, figures: dict[str, float]) -> str:
    """A run record as readable lines: identity, stack, settings, figures, accuracy, profile."""
    def ident(ref: ManifestRef) -> str:
        return f"{ref.name} {ref.version} (sha256 {str(ref.sha256)[:12]})"

    settings = record.settings or {}
    lines = [
        f"run {record.run_id}: {record.status}",
        f"  started/finished : {record.started_at} / {record.finished_at}",
        f"  model            : {ident(record.model_ref)}",
        f"  dataset          : {ident(record.dataset_ref)}",
        f"  backend          : {record.backend}  scenario {record.scenario}  mode {record.mode}",
        f"  software         : {ident(record.software_ref)}  "
        + ", ".join(f"{k}={v}" for k, v in record.software_versions.items()),
        f"  hardware         : {ident(record.hardware_ref)}",
        f"  system           : {record.system_name}  "
        + ", ".join(f"{k}={v}" for k, v in record.system_description.items() if k != "hostname"),
        f"  loadgen settings : {settings.get('loadgen')}",
        f"  harness settings : {settings.get('harness')}",
        f"  command          : {record.command}",
        f"  results          : {record.results_path}",
    ]
    if not record.is_loadgen:
        lines.insert(1, f"  kind             : {record.kind}")
    if record.error:
        lines.append(f"  error            : {record.error}")
    if record.perf is not None:
        lines.append(f"  LoadGen result   : {record.loadgen_result}")
    for name, value in sorted(figures.items()):
        lines.append(f"  {name:<40} {value:g}")
    if record.accuracy_verdict:
        lines.append(f"  reference        : {record.accuracy_verdict}")
    profile = record.profile
    if isinstance(profile, dict) and profile:
        lines.append(f"  profile          : {', '.join(sorted(profile))}")
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        record = store.get_record(args.run_id)
    if args.json:
        # Every field, known or not (to_dict puts `extra` back), in the stored JSON's sorted key order.
        print(json.dumps(record.to_dict(), indent=2, sort_keys=True))
    else:
        print(describe(record, record.figures()))
    return 0


def _flat_settings(record: RunRecord) -> dict[str, Any]:
    found = {f"loadgen.{k}": v for k, v in record.loadgen_settings.items()}
    found.update({f"harness.{k}": v for k, v in record.harness_settings.items()})
    for part, ref in (("model", record.model_ref), ("dataset", record.dataset_ref), ("hardware", record.hardware_ref)):
        found[f"{part}.sha256"] = ref.sha256
    found["software.manifest.sha256"] = record.software_ref.sha256
    return found


def compare_text(first: RunRecord, second: RunRecord) -> str:
    from mlharness.compare import comparability
    from mlharness.records import record_metrics
    from mlharness.tables import format_table

    a, b = first.figures(), second.figures()
    rows = []
    for name in sorted(set(a) | set(b)):
        change = None
        if name in a and name in b and a[name]:
            change = f"{100.0 * (b[name] - a[name]) / abs(a[name]):+.2f}%"
        better = "higher" if record_metrics.higher_is_better(name) else "lower"
        rows.append((name, a.get(name), b.get(name), change, better))
    out = [f"{label} = {r.run_id} ({r.model_name}, {r.backend}, {r.scenario}, {r.status})"
           for label, r in (("A", first), ("B", second))]
    out += ["", format_table(("figure", "A", "B", "B vs A", "better"), rows)]
    sa, sb = _flat_settings(first), _flat_settings(second)
    setting_rows = [(k, sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    if setting_rows:
        out += ["", "settings and manifests that differ:", format_table(("key", "A", "B"), setting_rows)]
    system = comparability.differences(first, second)
    out += ["", "system and framework versions: " + ("same" if not system else "DIFFERENT")]
    out += [f"  {line}" for line in system]
    return "\n".join(out)


def cmd_compare(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        first, second = store.get_record(args.first), store.get_record(args.second)
    print(compare_text(first, second))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from mlharness.store.run_files import load_run_files

    records = load_run_files([Path(p) for p in args.paths])  # every file checked before anything is stored
    with open_store(args, create=True) as store:
        for record in records:
            store.add_run(record)
    print(f"{len(records)} run(s) stored in {store.path}")
    return 0


def cmd_sweeps(args: argparse.Namespace) -> int:
    from mlharness.tables import format_table

    with open_store(args) as store:
        rows = store.list_sweeps()
    print(format_table(("sweep", "name", "grid", "cells run", "ok", "updated"),
                       [(r["sweep_id"], r["name"], r["grid_path"], r["cells"], r["ok"], r["updated_at"]) for r in rows]))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from mlharness.sweeps.sweep import sweep_summary

    with open_store(args) as store:
        print(sweep_summary(store, args.sweep_id))
    return 0


# ---- export ------------------------------------------------------------------------------------

EXPORT_COLUMNS = ("run_id", "started_at", "finished_at", "status", "kind", "model", "model_version", "dataset",
                  "backend", "scenario", "mode", "system_name", "batch_size", "threads", "sweep_id", "metric_name",
                  "metric_value", "loadgen_result", "accuracy_verdict", "error", "results_path")
SUMMARY_COLUMNS = ("system", "benchmark", "model", "backend", "scenario", "metric", "units", "value", "valid",
                   "accuracy", "accuracy_verdict", "performance_run", "accuracy_run")
# How MLCommons' results tables state each scenario's figure: (metric, units, factor from the stored figure).
_REPORTED = {"Offline": ("samples_per_second", "Samples/s", 1.0),
             "Server": ("completed_samples_per_second", "Queries/s", 1.0),
             "SingleStream": ("p90_latency_ns", "Latency (ms)", 1e-6),
             "MultiStream": ("p99_latency_ns", "Latency (ms)", 1e-6)}


def export_rows(store: Any, flt: Any, all_figures: bool = False) -> list[dict[str, Any]]:
    """One dict per stored run, newest first: its index columns, headline figure, accuracy values
    (`accuracy.<name>`) and, with all_figures, every figure by name. Keys are the same for every row."""
    runs = []
    for row in store.list_runs(flt):
        record = store.record_of(row)
        base = {c: row[c] for c in EXPORT_COLUMNS if c in row.keys()}
        base.update(kind=record.kind, loadgen_result=record.loadgen_result, accuracy_verdict=record.accuracy_verdict)
        figures = record.figures()
        runs.append((base, {k: v for k, v in figures.items() if all_figures or k.startswith("accuracy.")}))
    names = sorted({name for _, figures in runs for name in figures})
    return [{**{c: base.get(c) for c in EXPORT_COLUMNS}, **{n: figures.get(n) for n in names}} for base, figures in runs]


def summary_rows(store: Any, flt: Any) -> list[dict[str, Any]]:
    """MLCommons' final-report shape: per system, benchmark, backend and scenario, the newest ok
    performance run's figure (as MLPerf reports it) and the newest ok accuracy run's accuracy."""
    from dataclasses import replace

    groups: dict[tuple, dict[str, Any]] = {}
    for record in store.run_records(replace(flt, status="ok")):  # newest first
        if not record.is_loadgen or record.scenario not in _REPORTED:
            continue
        benchmark = record.conf_model or record.model_name
        key = (record.system_name, benchmark, record.model_name, record.backend, record.scenario)
        group = groups.setdefault(key, {})
        if record.perf is not None and record.headline()[1] is not None:
            group.setdefault("performance", record)
        if record.accuracy_values:
            group.setdefault("accuracy", record)
    rows = []
    for (system, benchmark, model, backend, scenario), group in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        metric, units, factor = _REPORTED[scenario]
        perf, acc = group.get("performance"), group.get("accuracy")
        value = perf.figures().get(f"{scenario.lower()}.{metric}") if perf else None
        rows.append({"system": system, "benchmark": benchmark, "model": model, "backend": backend,
                     "scenario": scenario, "metric": metric, "units": units,
                     "value": None if value is None else value * factor,
                     "valid": perf.loadgen_result if perf else None,
                     "accuracy": " ".join(f"{k}={v:.6g}" for k, v in sorted(acc.accuracy_values.items())) if acc else None,
                     "accuracy_verdict": acc.accuracy_verdict if acc else None,
                     "performance_run": perf.run_id if perf else None, "accuracy_run": acc.run_id if acc else None})
    return rows


def format_export(rows: list[dict[str, Any]], columns: list[str], fmt: str) -> str:
    import csv
    import io

    if fmt == "jsonl":
        return "".join(json.dumps(row, default=str) + "\n" for row in rows)
    if fmt == "table":
        from mlharness.tables import format_table

        return format_table(columns, [[row.get(c) for c in columns] for row in rows]) + "\n"
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def cmd_export(args: argparse.Namespace) -> int:
    import sys

    from mlharness.atomic_io import write_text
    from mlharness.errors import UserError

    flt = _run_filter(args, system=args.system)
    if args.format == "table" and not args.summary:
        raise UserError("--format table: only with --summary (the full export is csv or jsonl)")
    with open_store(args) as store:
        if args.summary:
            rows, columns = summary_rows(store, flt), list(SUMMARY_COLUMNS)
        else:
            rows = export_rows(store, flt, args.all_figures)
            columns = list(rows[0]) if rows else list(EXPORT_COLUMNS)
    text = format_export(rows, columns, args.format)
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"{out}: --out is a folder; name the file to write")
        try:
            write_text(out, text)
        except OSError as exc:
            raise UserError(f"{out}: cannot write the export: {exc.strerror or exc}") from None
        print(f"{len(rows)} row(s) written to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _add_run_filters(parser: argparse.ArgumentParser) -> None:
    """The filters `results list` and `results export` share: each keeps only the runs that match."""
    parser.add_argument("--model")
    parser.add_argument("--scenario", choices=SCENARIOS)
    parser.add_argument("--backend")
    parser.add_argument("--status", choices=("ok", "failed", "running"))
    parser.add_argument("--mode")
    parser.add_argument("--sweep", help="only the runs of this sweep id")


def _run_filter(args: argparse.Namespace, **more: str | None):  # noqa: ANN202 - RunFilter, imported lazily
    """The RunFilter of the options `_add_run_filters` registered, plus a command's own (`more`)."""
    from mlharness.store.result_store import RunFilter

    return RunFilter(model=args.model, scenario=args.scenario, backend=args.backend, status=args.status,
                     mode=args.mode, sweep=args.sweep, **more)


def register(sub: argparse._SubParsersAction) -> None:
    results = sub.add_parser("results", help="query the results database").add_subparsers(
        dest="results_command", required=True)

    listing = results.add_parser("list", help="list runs, newest first")
    _add_run_filters(listing)
    listing.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50; 0 = all)")
    listing.add_argument("--json", action="store_true", help="print the index rows as JSON")
    listing.set_defaults(func=cmd_list)

    show = results.add_parser("show", help="show one run's record")
    show.add_argument("run_id", help="run id or a unique prefix")
    show.add_argument("--json", action="store_true", help="print the full stored run.json")
    show.set_defaults(func=cmd_show)

    compare = results.add_parser("compare", help="compare two runs' figures, settings and systems")
    compare.add_argument("first", metavar="ID_A")
    compare.add_argument("second", metavar="ID_B")
    compare.set_defaults(func=cmd_compare)

    imp = results.add_parser("import", help="store run.json files (or every run.json below a folder)")
    imp.add_argument("paths", nargs="+")
    imp.set_defaults(func=cmd_import)

    sweeps = results.add_parser("sweeps", help="list sweeps")
    sweeps.set_defaults(func=cmd_sweeps)

    sweep = results.add_parser("sweep", help="show a sweep's cells and its best configuration per scenario")
    sweep.add_argument("sweep_id")
    sweep.set_defaults(func=cmd_sweep)

    export = results.add_parser("export", help="the runs and their headline figures as CSV or JSON lines, or "
                                               "(--summary) a table in the shape of MLCommons' final report")
    export.add_argument("--format", choices=("csv", "jsonl", "table"), default="csv",
                        help="csv (default), jsonl (one JSON object per line), table (--summary only)")
    export.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    export.add_argument("--summary", action="store_true",
                        help="per system, benchmark, backend and scenario: the newest ok performance run's figure "
                             "as MLPerf reports it, with the newest ok accuracy run's accuracy")
    export.add_argument("--all-figures", action="store_true", help="a column per figure of any run, not only "
                                                                   "the headline and accuracy")
    _add_run_filters(export)
    export.add_argument("--system", help="only the runs of this system (as results list shows it)")
    export.set_defaults(func=cmd_export)

    for parser in (listing, show, compare, imp, sweeps, sweep, export):
        add_db_arguments(parser)
