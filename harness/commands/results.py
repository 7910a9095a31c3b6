"""`mlharness results list|show|compare|import|sweeps|sweep`: query the results database."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.settings import SCENARIOS


def add_db_arguments(parser: argparse.ArgumentParser) -> None:
    """--results-dir and --db, shared by every command that opens the results database."""
    parser.add_argument("--results-dir", default="results", help="results tree root (default: results)")
    parser.add_argument("--db", help="results database file (default: $MLHARNESS_DB, else RESULTS_DIR/mlharness.sqlite)")


def open_store(args: argparse.Namespace, create: bool = False):  # noqa: ANN201 - ResultStore, imported lazily
    from harness.result_store import ResultStore, resolve_db_path

    return ResultStore(resolve_db_path(args.db, args.results_dir), create=create)


def cmd_list(args: argparse.Namespace) -> int:
    from harness.result_store import RunFilter
    from harness.tables import format_table

    flt = RunFilter(model=args.model, scenario=args.scenario, backend=args.backend, status=args.status,
                    mode=args.mode, sweep=args.sweep)
    with open_store(args) as store:
        rows = store.list_runs(flt, limit=args.limit)
    if args.json:
        print(json.dumps([{k: row[k] for k in row.keys() if k != "record_json"} for row in rows], indent=2))
        return 0
    table = [(r["run_id"], r["started_at"], r["model"], r["backend"], r["scenario"], r["mode"], r["status"],
              r["batch_size"], r["threads"], (r["metric_name"] or "").partition(".")[2] or None, r["metric_value"],
              r["sweep_id"]) for r in rows]
    print(format_table(("run id", "started", "model", "backend", "scenario", "mode", "status", "batch", "threads",
                        "metric", "value", "sweep"), table))
    return 0


def describe(record: dict[str, Any], figures: dict[str, float]) -> str:
    """A run record as readable lines: identity, stack, settings, figures, accuracy, profile."""
    def ident(part: dict[str, Any] | None) -> str:
        part = part or {}
        return f"{part.get('name')} {part.get('version')} (sha256 {str(part.get('sha256'))[:12]})"

    software = record.get("software") or {}
    settings = record.get("settings") or {}
    lines = [
        f"run {record['run_id']}: {record.get('status')}",
        f"  started/finished : {record.get('started_at')} / {record.get('finished_at')}",
        f"  model            : {ident(record.get('model'))}",
        f"  dataset          : {ident(record.get('dataset'))}",
        f"  backend          : {record.get('backend')}  scenario {record.get('scenario')}  mode {record.get('mode')}",
        f"  software         : {ident(software.get('manifest'))}  "
        + ", ".join(f"{k}={v}" for k, v in (software.get("versions") or {}).items()),
        f"  hardware         : {ident(record.get('hardware'))}",
        f"  system           : {record.get('system_name')}  "
        + ", ".join(f"{k}={v}" for k, v in (record.get("system") or {}).items() if k != "hostname"),
        f"  loadgen settings : {settings.get('loadgen')}",
        f"  harness settings : {settings.get('harness')}",
        f"  command          : {record.get('command')}",
        f"  results          : {record.get('results_path')}",
    ]
    if record.get("error"):
        lines.append(f"  error            : {record['error']}")
    perf = record.get("performance") or {}
    if perf:
        lines.append(f"  LoadGen result   : {perf.get('result')}")
    for name, value in sorted(figures.items()):
        lines.append(f"  {name:<40} {value:g}")
    accuracy = record.get("accuracy") or {}
    if accuracy.get("verdict"):
        lines.append(f"  reference        : {accuracy['verdict']}")
    profile = record.get("profile")
    if isinstance(profile, dict) and profile:
        lines.append(f"  profile          : {', '.join(sorted(profile))}")
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    from harness import record_metrics

    with open_store(args) as store:
        record = store.get_run(args.run_id)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(describe(record, record_metrics.flatten(record)))
    return 0


def _flat_settings(record: dict[str, Any]) -> dict[str, Any]:
    settings = record.get("settings") or {}
    found = {f"loadgen.{k}": v for k, v in (settings.get("loadgen") or {}).items()}
    found.update({f"harness.{k}": v for k, v in (settings.get("harness") or {}).items()})
    for part in ("model", "dataset", "hardware"):
        found[f"{part}.sha256"] = (record.get(part) or {}).get("sha256")
    found["software.manifest.sha256"] = ((record.get("software") or {}).get("manifest") or {}).get("sha256")
    return found


def compare_text(first: dict[str, Any], second: dict[str, Any]) -> str:
    from harness import comparability, record_metrics
    from harness.tables import format_table

    a, b = record_metrics.flatten(first), record_metrics.flatten(second)
    rows = []
    for name in sorted(set(a) | set(b)):
        change = None
        if name in a and name in b and a[name]:
            change = f"{100.0 * (b[name] - a[name]) / abs(a[name]):+.2f}%"
        better = "higher" if record_metrics.higher_is_better(name) else "lower"
        rows.append((name, a.get(name), b.get(name), change, better))
    out = [f"A = {first['run_id']} ({first.get('model', {}).get('name')}, {first.get('backend')}, "
           f"{first.get('scenario')}, {first.get('status')})",
           f"B = {second['run_id']} ({second.get('model', {}).get('name')}, {second.get('backend')}, "
           f"{second.get('scenario')}, {second.get('status')})", "",
           format_table(("figure", "A", "B", "B vs A", "better"), rows)]
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
        first, second = store.get_run(args.first), store.get_run(args.second)
    print(compare_text(first, second))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from harness.result_store import load_run_files

    records = load_run_files([Path(p) for p in args.paths])  # every file checked before anything is stored
    with open_store(args, create=True) as store:
        for record in records:
            store.add_run(record)
    print(f"{len(records)} run(s) stored in {store.path}")
    return 0


def cmd_sweeps(args: argparse.Namespace) -> int:
    from harness.tables import format_table

    with open_store(args) as store:
        rows = store.list_sweeps()
    print(format_table(("sweep", "name", "grid", "cells run", "ok", "updated"),
                       [(r["sweep_id"], r["name"], r["grid_path"], r["cells"], r["ok"], r["updated_at"]) for r in rows]))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from harness.sweep import sweep_summary

    with open_store(args) as store:
        print(sweep_summary(store, args.sweep_id))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    results = sub.add_parser("results", help="query the results database").add_subparsers(
        dest="results_command", required=True)

    listing = results.add_parser("list", help="list runs, newest first")
    listing.add_argument("--model")
    listing.add_argument("--scenario", choices=SCENARIOS)
    listing.add_argument("--backend")
    listing.add_argument("--status", choices=("ok", "failed", "running"))
    listing.add_argument("--mode")
    listing.add_argument("--sweep", help="only the runs of this sweep id")
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

    for parser in (listing, show, compare, imp, sweeps, sweep):
        add_db_arguments(parser)
