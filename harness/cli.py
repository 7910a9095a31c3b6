"""The `mlharness` command. Each module in harness/commands/ registers its own subcommands
(`register(subparsers)`), as thin wrappers that parse arguments and call testable functions.
User mistakes raise UserError, caught once here: one line on stderr, exit 1. A reader that stops
reading (`mlharness results list | head`) ends the command quietly, as it would `cat`."""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import select
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


# The exit status of a program stopped by SIGPIPE, as a shell reports it (Python ignores the signal).
STDOUT_CLOSED = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            status = _main(argv)
        except SystemExit:  # argparse after --help or a usage error: what it printed goes out first
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, where a closed stdout can still be told apart, not at exit
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe broke (a worker's): a fault, not a reader that stopped reading
        # Point stdout at /dev/null so the interpreter's last flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return STDOUT_CLOSED


def _stdout_closed() -> bool:
    """stdout is a pipe (or socket) whose reader has gone: polling it for writing reports an error."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file (in-process callers)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
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
