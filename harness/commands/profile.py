"""`mlharness profile show RESULT_DIR`: the per-stage table and the top operators of a profiled run."""
from __future__ import annotations

import argparse
from pathlib import Path

from mlharness.errors import UserError


def cmd_profile_show(args: argparse.Namespace) -> int:
    from mlharness.profiling.report import show

    if args.top < 1:
        raise UserError(f"--top: expected a number of rows >= 1, got {args.top}")
    print(show(Path(args.result_dir), top=args.top))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    profile = sub.add_parser("profile", help="show profiles written by `run --profile`")
    commands = profile.add_subparsers(dest="profile_command", required=True)
    show = commands.add_parser("show", help="per-stage latencies, top operators, overheads of one result")
    show.add_argument("result_dir", help="a scenario result folder (results/<system>/<model>/<Scenario>) or its profile/")
    show.add_argument("--top", type=int, default=10, help="rows of operators and functions (default: 10)")
    show.set_defaults(func=cmd_profile_show)
