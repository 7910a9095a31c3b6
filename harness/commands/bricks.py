"""`mlharness bricks MODEL [MODEL...]`: layer-level benchmarks (docs/bricks.md)."""
from __future__ import annotations

import argparse
import shlex

from mlharness.errors import UserError
from mlharness.running.arguments import add_request_arguments, request_fields
from mlharness.running.request import RunRequest


def cmd_bricks(args: argparse.Namespace) -> int:
    from mlharness.bricks.suite import run_suite

    if args.backend not in (None, "onnxruntime"):  # before the measuring run: it would be wasted
        raise UserError(f"--backend {args.backend}: bricks are measured on onnxruntime only")
    argv = getattr(args, "argv", None) or []
    fields = request_fields(args) | {"backend": args.backend or "onnxruntime"}
    estimate = "measure-missing" if args.measure_missing else "only" if args.estimate_only else None
    base = RunRequest(model=args.models[0], scenario="SingleStream", kind="bricks", batch=args.batch,
                      variants=not args.no_variants, brick_time_cap=args.time_cap, brick_estimate=estimate,
                      command=shlex.join(["mlharness", *argv]) if argv[:1] == ["bricks"] else "", **fields)
    # --estimate-only measures nothing whole: the estimate is the answer.
    run_suite(args.models, base, measure=estimate is None and not args.no_measure)
    return 0

def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bricks", help="benchmark models through their layers: bricks, composed estimate, "
                                           "lower bound, measured latency")
    parser.add_argument("models", nargs="+", metavar="MODEL", help="model manifest names or paths (ONNX Runtime)")
    parser.add_argument("--batch", type=int, default=1, help="batch size the model is decomposed and measured at")
    parser.add_argument("--time-cap", type=float, default=2.0, metavar="SECONDS",
                        help="most seconds of timed calls for one brick (default 2)")
    parser.add_argument("--no-variants", action="store_true",
                        help="measure bricks as executed only (no lower bound)")
    parser.add_argument("--no-measure", action="store_true",
                        help="skip the LoadGen run that measures each model whole")
    parser.add_argument("--estimate-only", action="store_true",
                        help="compose each model from the bricks stored for this system, measuring nothing else; "
                             "fails naming the bricks not stored")
    parser.add_argument("--measure-missing", action="store_true",
                        help="with --estimate-only: measure only the bricks not stored (implies --estimate-only)")
    add_request_arguments(parser, ["--dataset", "--backend", "--software", "--hardware", "--results-dir", "--set",
                                   "--quiet", "--timeout"])
    parser.set_defaults(func=cmd_bricks)
