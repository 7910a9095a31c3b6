"""`mlharness zoo list` and `mlharness zoo build NAME...|--family F|--all [--out DIR]`: the model zoo of
repeating-layer families (docs/bricks.md, "The zoo"). `build` prints one manifest path per member on
stdout, so `mlharness bricks $(mlharness zoo build --family resnet)` measures a family; what it did
goes to stderr."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlharness.errors import UserError
from mlharness.tables import format_table


def cmd_list(args: argparse.Namespace) -> int:
    from mlharness.sut import zoo  # the CLI parses without numpy; the zoo's conversion needs it

    rows = [[m.name, m.family, "x".join(map(str, m.input_shape)), m.factory.rpartition(".")[2],
             ", ".join(f"{k}={v}" for k, v in m.options) or "-"] for m in zoo.ZOO]
    print(format_table(["name", "family", "input", "factory", "options"], rows))
    print(f"{len(zoo.ZOO)} models in {len(zoo.families())} families; random weights (performance only); "
          f"built into {zoo.zoo_dir()}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from mlharness.sut import zoo

    known = zoo.families()
    unknown = [f for f in args.family or [] if f not in known]
    if unknown:
        raise UserError(f"--family {unknown[0]}: not a zoo family (known: {', '.join(known)})")
    if args.all:
        chosen = list(zoo.ZOO)
    else:
        chosen = [zoo.member(name) for name in args.names]
        chosen += [m for m in zoo.ZOO if m.family in (args.family or []) and m not in chosen]
    if not chosen:
        raise UserError("zoo build: name members, a --family or --all (see `mlharness zoo list`)")
    total = 0.0
    for member in chosen:
        built = zoo.build(member, Path(args.out) if args.out else None, force=args.force)
        total += built.seconds
        state = "cached (verified)" if built.reused else "converted"
        print(f"{member.name}: {state} in {built.seconds:.1f} s: {built.graph} sha256 {built.sha256[:16]}...",
              file=sys.stderr)
        print(built.manifest, flush=True)
    print(f"{len(chosen)} models, {total:.1f} s", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("zoo", help="the model zoo of repeating-layer families (random weights, performance only)")
    actions = parser.add_subparsers(dest="zoo_command", required=True)
    listing = actions.add_parser("list", help="the zoo's members")
    listing.set_defaults(func=cmd_list)
    build = actions.add_parser("build", help="write members' manifests and convert their ONNX graphs into the cache; "
                                             "prints each manifest's path")
    build.add_argument("names", nargs="*", metavar="NAME", help="zoo members (see `mlharness zoo list`)")
    build.add_argument("--family", action="append", metavar="FAMILY", help="every member of a family (repeatable)")
    build.add_argument("--all", action="store_true", help="every member")
    build.add_argument("--out", metavar="DIR", help="folder for the manifests (default: the cache's zoo/ folder); "
                                                    "the graphs stay in the cache's converted/ folder")
    build.add_argument("--force", action="store_true", help="convert again even when a verified cached graph exists")
    build.set_defaults(func=cmd_build)
