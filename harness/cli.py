"""The `mlharness` command. Each module in harness/commands/ registers its own subcommands
(`register(subparsers)`), as thin wrappers that parse arguments and call testable functions.
User mistakes raise UserError, caught once here: one line on stderr, exit 1."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from mlharness import commands
from mlharness.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlharness", description="MLPerf-style inference benchmark harness")
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"mlharness.commands.{info.name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # the command line as given (sys.argv is another program's when called in-process)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"mlharness: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_status", 1))  # 128 + signal for a run stopped by one
    except KeyboardInterrupt:
        print("mlharness: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
