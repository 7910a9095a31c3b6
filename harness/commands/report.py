"""`mlharness report (--run ID | --sweep ID | --bricks) --out DIR`: HTML with PNG plots;
`mlharness report --site DIR`: a static site of the whole results database."""
from __future__ import annotations

import argparse
from pathlib import Path

from mlharness.commands.results import add_db_arguments, open_store, output_path
from mlharness.errors import UserError


def cmd_report(args: argparse.Namespace) -> int:
    from mlharness.compare.report import bricks_report, run_report, sweep_report, tuning_report

    if args.site:
        if args.out:
            raise UserError("--out: not used with --site (the site is written into the --site folder)")
        from mlharness.compare.site import write_site

        with open_store(args) as store:
            try:
                index = write_site(store, Path(args.site))
            except OSError as exc:
                raise UserError(f"{exc.filename or args.site}: cannot write the site: {exc.strerror or exc}") from None
        print(f"site written to {index} (open it in a browser; it needs no server)")
        return 0
    if not args.out:
        raise UserError("--out DIR: needed with --run, --sweep, --bricks and --tuning (the folder for index.html and its PNGs)")
    out = output_path("--out", args.out, folder=True)
    with open_store(args) as store:
        try:
            if args.run:
                index = run_report(store, args.run, out)
            elif args.bricks:
                index = bricks_report(store, out)
            elif args.tuning:
                index = tuning_report(store, out)
            else:
                index = sweep_report(store, args.sweep, out)
        except OSError as exc:
            raise UserError(f"--out {out}: cannot write the report: {exc.strerror or exc}") from None
    print(f"report written to {index}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="write an HTML report with plots for a run or a sweep, or a site of every run")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", metavar="ID", help="run id (or unique prefix) in the results database")
    which.add_argument("--sweep", metavar="ID", help="sweep id")
    which.add_argument("--bricks", action="store_true", help="every model's latest layer benchmark (mlharness bricks)")
    which.add_argument("--tuning", action="store_true", help="every tuned configuration and its search (mlharness tune)")
    which.add_argument("--site", metavar="DIR", help="a static, self-contained HTML site of every run, sweep and "
                                                     "layer benchmark in the database, written into DIR")
    parser.add_argument("--out", metavar="DIR", help="folder for index.html and the PNGs (--run, --sweep, --bricks)")
    add_db_arguments(parser)
    parser.set_defaults(func=cmd_report)
