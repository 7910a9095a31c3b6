"""`mlharness submission package|check|run`: MLCommons Inference v6.x submission trees."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlharness.running.arguments import FLAGS, add_request_arguments, request_fields
from mlharness.running.settings import SCENARIOS

# The run-request flags a submission session takes (its runs' timeout, software and reference are its own).
SESSION_FLAGS = ("--results-dir", "--backend", "--dataset", "--hardware", "--user-conf", "--set", "--preset", "--quick",
                 "--quiet")
SESSION_REQUEST_FIELDS = tuple(FLAGS[flag].field for flag in SESSION_FLAGS)


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def cmd_package(args: argparse.Namespace) -> int:
    from mlharness.submission import checker, system_json
    from mlharness.submission.packager import PackageOptions, package

    options = PackageOptions(
        division=args.division, submitter=args.submitter, out=Path(args.out), results_dir=Path(args.results_dir),
        system=args.system, results_system=args.results_system, models=_split(args.model),
        scenarios=_split(args.scenarios), runs=_split(args.run), allow_invalid=args.allow_invalid,
        system_fields=system_json.parse_fields(args.system_field or [], args.system_file or []), force=args.force)
    result = package(options)
    print(f"packaged {result.tree.base}")
    if result.not_for_submission:
        print(f"  marked NOT_FOR_SUBMISSION ({len(result.not_for_submission)} reason(s), see "
              f"{result.tree.marker.name})")
    for reason in result.skipped:
        print(f"  {reason}")
    if result.undetected_fields:
        print(f"  system fields not detected (set with --system-field KEY=VALUE): "
              f"{', '.join(result.undetected_fields)}")
    return _print_report(checker.check(result.tree.base, allow_invalid=args.allow_invalid,
                                       skip_dataset_size_check=args.skip_dataset_size_check), result.tree.root)


def cmd_check(args: argparse.Namespace) -> int:
    from mlharness.submission import checker

    return _print_report(checker.check(Path(args.dir), allow_invalid=args.allow_invalid,
                                       skip_dataset_size_check=args.skip_dataset_size_check), Path(args.dir))


def _print_report(report, base: Path) -> int:
    from mlharness.submission.checker import WAIVERS

    for problem in report.problems:
        print(problem.line(base), file=sys.stderr)
    for problem in report.waived:
        print(f"waived ({WAIVERS[problem.kind]}): {problem.line(base)}")
    trees = ", ".join(f"{t.division}/{t.submitter}" for t in report.trees)
    if report.problems:
        print(f"submission check: {len(report.problems)} problem(s) in {trees}", file=sys.stderr)
        return 1
    print(f"submission check: {trees}: no problems" + (f" ({len(report.waived)} waived)" if report.waived else ""))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from mlharness.submission.session import run_session, session_options

    fields = request_fields(args)
    options = session_options(
        {name: fields[name] for name in SESSION_REQUEST_FIELDS} | {"model": args.model}, _split(args.scenarios),
        division=args.division, compliance=tuple(_split([args.compliance])) if args.compliance is not None else None,
        restart=args.restart, redo=tuple(_split(args.redo)))
    return run_session(options)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("submission", help="package, check or run an MLPerf Inference v6.x submission")
    commands = parser.add_subparsers(dest="submission_command", required=True)

    pkg = commands.add_parser("package", help="assemble {open|closed}/<submitter>/ from recorded runs")
    pkg.add_argument("--division", required=True, choices=("open", "closed"))
    pkg.add_argument("--submitter", required=True, help="organisation folder name")
    pkg.add_argument("--system", help="system name in the submission (default: the results tree's folder)")
    pkg.add_argument("--out", required=True, help="folder to write open/ or closed/ into")
    pkg.add_argument("--results-dir", default="results", help="results tree to take runs from (default: results)")
    pkg.add_argument("--results-system", help="system folder in the results tree (when it holds several)")
    pkg.add_argument("--model", action="append", help="models to package (default: all); comma-separated or repeated")
    pkg.add_argument("--scenarios", action="append", help="scenarios to package (default: all recorded)")
    pkg.add_argument("--run", action="append", metavar="RUN_ID",
                     help="package this run instead of the latest of its mode (repeatable)")
    pkg.add_argument("--system-field", action="append", metavar="KEY=VALUE",
                     help="system description field that cannot be detected (repeatable)")
    pkg.add_argument("--system-file", action="append", metavar="JSON", help="system description fields from a file")
    pkg.add_argument("--allow-invalid", action="store_true",
                     help="package INVALID or overridden runs, marking the tree NOT_FOR_SUBMISSION")
    pkg.add_argument("--force", action="store_true", help="replace an existing <division>/<submitter> folder")
    pkg.add_argument("--skip-dataset-size-check", action="store_true",
                     help="waive accuracy runs on part of the benchmark's dataset (as the official checker's flag)")
    pkg.set_defaults(func=cmd_package)

    chk = commands.add_parser("check", help="check a submission tree against the v6.x rules; one line per problem")
    chk.add_argument("dir", help="the folder holding open/ or closed/ (or a division or submitter folder)")
    chk.add_argument("--allow-invalid", action="store_true",
                     help="waive run problems in trees marked NOT_FOR_SUBMISSION")
    chk.add_argument("--skip-dataset-size-check", action="store_true",
                     help="waive accuracy runs on part of the benchmark's dataset (as the official checker's flag)")
    chk.set_defaults(func=cmd_check)

    run = commands.add_parser("run", help="performance, accuracy and compliance runs for a submission; resumable")
    run.add_argument("--model", required=True)
    run.add_argument("--scenarios", required=True, action="append",
                     help=f"comma-separated, from {', '.join(SCENARIOS)}")
    run.add_argument("--division", default="open", choices=("open", "closed"),
                     help="closed also runs the benchmark's compliance tests (default: open)")
    run.add_argument("--compliance", help="compliance tests to run (default: none for open, the benchmark's for closed)")
    add_request_arguments(run, SESSION_FLAGS, help_text={
        "--user-conf": "LoadGen user.conf (e.g. target_qps); protected keys make runs invalid",
        "--quick": "short runs (not submission-grade) to try the flow"})
    run.add_argument("--restart", action="store_true", help="ignore finished steps and run everything again")
    run.add_argument("--redo", action="append", metavar="STEP",
                     help="run a finished step again, e.g. SingleStream/performance or Offline/TEST01 (or a whole "
                          "scenario); the scenario's later steps follow (repeatable, comma-separated)")
    run.set_defaults(func=cmd_run)
