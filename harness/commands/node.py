"""`mlharness node`: start or join a Ray node that advertises this machine's hardware (docs/cluster.md)."""
from __future__ import annotations

import argparse
import json
import shlex
import socket
import subprocess
import sys
from pathlib import Path


def ray_start_command(args: argparse.Namespace) -> tuple[list[str], dict[str, float]]:
    """The `ray start` command line for this node, and the custom resources it advertises."""
    from mlharness.cluster.resources import node_resources
    from mlharness.errors import UserError
    from mlharness.running.system import detect_system

    if args.head == bool(args.address):
        raise UserError("mlharness node: expected --head (start a cluster) or --address HOST:PORT (join one)")
    extra = list(args.ray_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if any(arg == "--resources" or arg.startswith("--resources=") for arg in extra):
        raise UserError("mlharness node: --resources is set from the detected system; name more systems with --system")
    resources = node_resources(detect_system(), args.name or socket.gethostname(), tuple(args.system or ()))
    beside = Path(sys.executable).with_name("ray")
    ray = str(beside) if beside.is_file() else "ray"
    command = [ray, "start"]
    command += ["--head", "--port", str(args.port)] if args.head else ["--address", args.address]
    command += ["--resources", json.dumps(resources, sort_keys=True), "--disable-usage-stats"] + extra
    return command, resources


def cmd_node(args: argparse.Namespace) -> int:
    command, resources = ray_start_command(args)
    if args.dry_run:
        for key, amount in sorted(resources.items()):
            print(f"{key}: {amount:g}")
        print(shlex.join(command))
        return 0
    from mlharness.cluster.ray_launcher import require_ray

    require_ray()  # a one-line error naming the extra, before `ray` is looked for
    print(f"mlharness node: {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(command).returncode
    except FileNotFoundError:
        from mlharness.errors import UserError

        raise UserError(f"mlharness node: {command[0]}: not found; pip install 'mlharness[cluster]'") from None


def register(sub: argparse._SubParsersAction) -> None:
    node = sub.add_parser("node", help="start or join a Ray node advertising this machine's hardware (sweeps --cluster)")
    node.add_argument("--head", action="store_true", help="start a new cluster with this machine as its head")
    node.add_argument("--address", help="join the cluster whose head is at HOST:PORT")
    node.add_argument("--port", type=int, default=6379, help="the head's port (with --head; default 6379)")
    node.add_argument("--name", help="this node's name in progress and records (default: the host name)")
    node.add_argument("--system", action="append", metavar="NAME",
                      help="another system name this node answers to (a hardware manifest's `system:`; repeatable)")
    node.add_argument("--dry-run", action="store_true", help="print the resources and the ray start command only")
    node.add_argument("ray_args", nargs=argparse.REMAINDER,
                      help="after --: more `ray start` options (--block, --num-cpus, --node-ip-address, ...)")
    node.set_defaults(func=cmd_node)
