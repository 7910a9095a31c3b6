"""`mlharness report (--run ID | --sweep ID | --bricks) --out DIR`: HTML with PNG plots."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.results import add_db_arguments, open_store


def cmd_report(args: argparse.Namespace) -> int:
    from harness.compare.report import bricks_report, run_report, sweep_report

    with open_store(args) as store:
        if args.run:
            index = run_report(store, args.run, Path(args.out))
        elif args.bricks:
            index = bricks_report(store, Path(args.out))
        else:
            index = sweep_report(store, args.sweep, Path(args.out))
    print(f"report written to {index}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="write an HTML report with plots for a run or a sweep")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", metavar="ID", help="run id (or unique prefix) in the results database")
    which.add_argument("--sweep", metavar="ID", help="sweep id")
    which.add_argument("--bricks", action="store_true", help="every model's latest layer benchmark (mlharness bricks)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for index.html and the PNGs")
    add_db_arguments(parser)
    parser.set_defaults(func=cmd_report)
