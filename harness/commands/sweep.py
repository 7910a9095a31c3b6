"""`mlharness sweep GRID.yaml`: run a grid of configurations, one worker process per cell."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from mlharness.cluster.address import DEFAULT_CONNECT_TIMEOUT_S
from mlharness.commands.results import add_db_arguments
from mlharness.errors import UserError

if TYPE_CHECKING:
    from mlharness.sweeps.sweep import SlotsFactory


def cmd_sweep(args: argparse.Namespace) -> int:
    from mlharness.store.result_store import ResultStore, resolve_db_path
    from mlharness.sweeps.sweep import SweepOptions, best_table, run_sweep, sweep_rows

    # Unset, each falls back to the grid's value; set, it must be one a grid could hold.
    if args.repeat is not None and args.repeat < 1:
        raise UserError(f"--repeat: expected a number of runs per cell >= 1, got {args.repeat}")
    if args.timeout is not None and not 0 < args.timeout < math.inf:  # nan fails this too
        raise UserError(f"--timeout: expected a number of seconds > 0, got {args.timeout}")
    if not 0 < args.connect_timeout < math.inf:
        raise UserError(f"--connect-timeout: expected a number of seconds > 0, got {args.connect_timeout}")
    options = SweepOptions(results_dir=Path(args.results_dir), db_path=resolve_db_path(args.db, args.results_dir),
                           sweep_id=args.sweep_id, rerun=args.rerun, retry_failed=args.retry_failed,
                           repeat=args.repeat, timeout_s=args.timeout, quick=True if args.quick else None,
                           extra_settings=args.set or [], dry_run=args.dry_run, quiet=args.quiet)
    runner = None
    if args.cluster and not args.dry_run:
        runner = _cluster_runner(args.cluster, args.connect_timeout)
    try:
        result = run_sweep(Path(args.grid), options, slots=runner)
    finally:
        if runner is not None:
            from mlharness.cluster.ray_launcher import disconnect

            disconnect()
    if args.dry_run:
        return 0
    with ResultStore(options.db_path) as store:
        rows = sweep_rows(store, result.sweep_id)
    failed = sum(1 for row in rows if row.status != "ok")
    print(f"sweep {result.sweep_id}: {len(result.outcomes)} ran now, {result.skipped} skipped as finished, "
          f"{failed} failed cell run(s) in total; database {options.db_path}")
    print("best configuration per scenario and model:")
    print(best_table(rows))
    return 1 if failed and args.strict else 0


def _cluster_runner(address: str, timeout_s: float) -> SlotsFactory:
    """--cluster: connect to the Ray cluster (a one-line error without the `cluster` extra, or for an
    address of the wrong form or where nothing answers within --connect-timeout)."""
    import sys

    from mlharness.cluster.ray_launcher import connect

    print(f"cluster: {connect(address, timeout_s)}", file=sys.stderr)
    from mlharness.cluster.scheduler import node_slots

    return node_slots


def register(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser("sweep", help="run a grid of models x backends x scenarios x settings")
    sweep.add_argument("grid", help="sweep grid YAML (see scenarios/sweep-example.yaml)")
    sweep.add_argument("--sweep-id", help="id to record the cells under (default: the grid's name); "
                                          "running the same id again resumes it")
    sweep.add_argument("--rerun", action="store_true", help="run every cell again, finished or not")
    sweep.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    sweep.add_argument("--repeat", type=int, help="runs per cell (default: the grid's repeat, else 1)")
    sweep.add_argument("--timeout", type=float, help="seconds per cell run before it is stopped")
    sweep.add_argument("--quick", action="store_true", help="short smoke-run preset for every cell")
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE", help="setting for every cell (repeatable)")
    sweep.add_argument("--dry-run", action="store_true", help="list the cells and whether they are finished")
    sweep.add_argument("--strict", action="store_true", help="exit 1 when any cell failed")
    sweep.add_argument("--quiet", action="store_true", help="no live progress (each cell's line is still printed)")
    sweep.add_argument("--cluster", metavar="ADDRESS",
                       help="run the cells on a Ray cluster: ray (the local one, started if none), ray://HOST:PORT "
                            "or HOST:PORT; nodes join with `mlharness node` (docs/cluster.md; needs mlharness[cluster])")
    sweep.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="SECONDS",
                       help="with --cluster: seconds to wait for the cluster's port to answer before giving up "
                            f"(default {DEFAULT_CONNECT_TIMEOUT_S:g})")
    add_db_arguments(sweep)
    sweep.set_defaults(func=cmd_sweep)
