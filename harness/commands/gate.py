"""`mlharness gate`: fail (exit 1) when a candidate run regresses against a baseline beyond a rule."""
from __future__ import annotations

import argparse
import os

from mlharness.commands.results import add_db_arguments, output_path, write_output
from mlharness.errors import UserError


def cmd_gate(args: argparse.Namespace) -> int:
    from mlharness.compare import gate, gate_output, gate_refs
    from mlharness.store.result_store import resolve_db_path

    if not 0 < args.alpha < 1:  # nan fails this too
        raise UserError(f"--alpha: expected a significance level between 0 and 1 (exclusive), got {args.alpha}")
    # Where the outputs go is checked before the comparison, so a wrong path costs nothing.
    markdown = output_path("--markdown", args.markdown) if args.markdown else None
    junit = output_path("--junit", args.junit) if args.junit else None
    rules = [gate.parse_rule(text) for text in args.rule or []]
    db_path = resolve_db_path(args.db, args.results_dir)
    result = gate.evaluate(gate_refs.resolve_all(args.baseline, db_path), gate_refs.resolve_all(args.candidate, db_path),
                           rules, allow_different_systems=args.allow_different_systems, test=args.test,
                           alpha=args.alpha, match=gate.parse_match(args.match))
    text = gate_output.markdown(result)
    print(text, end="")
    if markdown:
        write_output("--markdown", markdown, text)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        # GitHub Actions collects the job summary by appending to this file.
        summary_path = os.environ["GITHUB_STEP_SUMMARY"]
        try:
            with open(summary_path, "a", encoding="utf-8") as summary:
                summary.write(text)
        except OSError as exc:
            raise UserError(f"GITHUB_STEP_SUMMARY {summary_path}: cannot append: {exc.strerror or exc}") from None
    if junit:
        write_output("--junit", junit, gate_output.junit_xml(result))
    return 0 if result.passed else 1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("gate", help="fail when a candidate regresses against a baseline (CI)")
    parser.add_argument("--baseline", action="append", required=True, metavar="REF",
                        help="run id, run.json, folder of run records, sweep:ID or latest:model=M[,scenario=S,n=N] "
                             "(repeatable)")
    parser.add_argument("--candidate", action="append", required=True, metavar="REF", help="as --baseline")
    parser.add_argument("--rule", action="append", metavar="FIGURE:LIMIT",
                        help="e.g. offline.samples_per_second:-5%%, server.p99_latency_ns:+10%%, accuracy.top1:-0.5pt")
    parser.add_argument("--test", default="mannwhitney", choices=("mannwhitney", "bootstrap", "none"),
                        help="significance test when both sides have repeats (default mannwhitney)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level, between 0 and 1 (default 0.05)")
    parser.add_argument("--match", default="model,backend,scenario,settings",
                        help="fields that make runs the same configuration (default model,backend,scenario,settings; "
                             "also mode)")
    parser.add_argument("--allow-different-systems", action="store_true",
                        help="compare runs from different hardware or framework versions")
    parser.add_argument("--markdown", metavar="FILE", help="write the Markdown summary here")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    add_db_arguments(parser)
    parser.set_defaults(func=cmd_gate)
