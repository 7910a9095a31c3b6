"""`mlharness rerun RUN_ID|path/to/run.json`: run a recorded benchmark again from its record alone (its
`command`, which names every run-request field that is not at its default and the environment settings
it ran with: mlharness.running.arguments),
saying first what differs since it ran (a manifest's content, software versions, the system), one line
per difference."""
from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlharness.store.result_store import ResultStore, resolve_db_path
from mlharness.cli import build_parser
from mlharness.commands.run import format_summary, request_of
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord
from mlharness.running.arguments import command_line, with_environment
from mlharness.running.request import RunRequest


def recorded_request(record: RunRecord) -> RunRequest:
    """The request a record's command ran; refused in one line when it is not an `mlharness run` command."""
    words = shlex.split(record.command or "")
    assignments = []
    while words and "=" in words[0] and not words[0].startswith("-"):
        assignments.append(words.pop(0))  # VAR=value before the program: the environment settings it ran with
    if words[:2] != ["mlharness", "run"]:
        raise UserError(f"run {record.run_id}: recorded command {record.command!r} is not an `mlharness run` "
                        "command; rerun repeats runs")
    try:
        args = build_parser().parse_args(words[1:])
        request = with_environment(request_of(args), assignments)
    except (SystemExit, ValueError):  # argparse has said what it could not read
        raise UserError(f"run {record.run_id}: cannot read its recorded command {record.command!r}") from None
    return replace(request, command="")


def load_record(what: str, args: argparse.Namespace) -> RunRecord:
    """A run by id (or unique id prefix) from the results database, or a run.json by path."""
    path = Path(what)
    if path.suffix == ".json" or path.is_file():
        return RunRecord.load(path)
    with ResultStore(resolve_db_path(args.db, args.results_dir or "results"), create=False) as store:
        return store.get_record(what)


def differences(record: RunRecord, request: RunRequest) -> list[str]:
    """What is not as it was when the run ran: each manifest whose content (sha256) changed, each software
    version, the system's name; one line each."""
    from mlharness.running import system as system_mod
    from mlharness.running.resolve import select_model, spec_index

    index = spec_index(request)
    model = select_model(index, request.model, request.backend)
    backend = request.backend or model.framework
    now: dict[str, Any] = {"model": model, "dataset": index.find("dataset", request.dataset or model.default_dataset),
                           "hardware": index.find("hardware", request.hardware),
                           "software": index.find("software", request.software or backend)}
    then = {"model": record.model_ref, "dataset": record.dataset_ref, "hardware": record.hardware_ref,
            "software": record.software_ref}
    lines = [f"{kind} manifest {manifest.name}: sha256 {then[kind].sha256[:12]} then, {manifest.sha256[:12]} now "
             f"({manifest.path})" for kind, manifest in now.items()
             if then[kind].sha256 and then[kind].sha256 != manifest.sha256]
    versions_then, versions_now = record.software_versions, system_mod.software_versions()
    for name in sorted(set(versions_then) | set(versions_now)):
        if versions_then.get(name) != versions_now.get(name):
            lines.append(f"software {name}: {versions_then.get(name) or 'absent'} then, "
                         f"{versions_now.get(name) or 'absent'} now")
    system_now = system_mod.system_name(system_mod.detect_system(), now["hardware"].device)
    if record.system_name and record.system_name != system_now:
        lines.append(f"system: {record.system_name} then, {system_now} now")
    return lines


def cmd_rerun(args: argparse.Namespace) -> int:
    from mlharness import run

    record = load_record(args.run, args)
    request = recorded_request(record)
    # The new run goes where asked, else where the recorded command put its run.
    request = replace(request, results_dir=Path(args.results_dir) if args.results_dir else request.results_dir,
                      quiet=args.quiet)
    request = replace(request, command=command_line(request))
    changed = differences(record, request)
    print(f"rerun of {record.run_id}: {request.command}")
    for line in changed:
        print(f"  differs: {line}")
    if not changed:
        print("  as recorded: the same manifests, software and system")
    rerun = run(request)
    print(format_summary(rerun))
    return 1 if rerun.accuracy_verdict == "FAIL" else 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("rerun", help="run a recorded run again from its record; says what changed since")
    parser.add_argument("run", metavar="RUN_ID|run.json", help="a run id (or unique prefix) in the results "
                                                                "database, or a run.json file")
    parser.add_argument("--results-dir", help="results tree whose database holds RUN_ID, and where the new run goes "
                                              "(default: results to find it, the recorded command's to run it)")
    parser.add_argument("--db", help="results database file (default: $MLHARNESS_DB, else RESULTS_DIR/mlharness.sqlite)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.set_defaults(func=cmd_rerun)
