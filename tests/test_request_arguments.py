"""A run request's command-line form (mlharness.running.arguments): the argv written for a request
parses back into the same request, for a request that sets every field that has a flag; a tune
trial's recorded command is such an argv."""
from __future__ import annotations

import shlex
from dataclasses import fields, replace
from pathlib import Path

from mlharness.cli import build_parser
from mlharness.commands.run import request_of
from mlharness.records.run_record import RunRecord
from mlharness.running.arguments import FIELDS_WITHOUT_FLAGS, REQUEST_FLAGS, command_line, run_arguments
from mlharness.running.request import RunRequest


def _everything(tmp_path: Path) -> RunRequest:
    """A request whose every field with a flag is not at its default."""
    conf = tmp_path / "user conf.txt"  # a space: the shell line must quote it
    conf.write_text("")
    return RunRequest(
        model="null", scenario="Server", mode="accuracy", dataset="synthetic", backend="onnxruntime",
        software="onnxruntime-cpu", hardware="cpu-pinned", reference="ref-x", endpoint="grpc://127.0.0.1:8001",
        quick=True, presets=("fast", "slow"), user_conf=conf, user_conf_text="", results_dir=tmp_path / "res",
        overrides=("workers=2", "target_qps=7.5"), use_tuned=False, quiet=True, timeout=1234567.25,
        profile=("harness", "python"), compliance=("TEST01", "TEST04"))


def test_every_request_field_has_a_flag_or_is_named_as_having_none() -> None:
    flagged = [spec.field for spec in REQUEST_FLAGS]
    assert len(flagged) == len(set(flagged))
    assert sorted(f.name for f in fields(RunRequest)) == sorted([*flagged, *FIELDS_WITHOUT_FLAGS])


def test_a_request_round_trips_through_its_arguments(tmp_path: Path) -> None:
    request = _everything(tmp_path)
    defaults = RunRequest(model="null", scenario="Offline")
    assert all(getattr(request, spec.field) != getattr(defaults, spec.field) for spec in REQUEST_FLAGS)
    argv = run_arguments(request, complete=True)
    parsed = request_of(build_parser().parse_args(argv))
    # user_conf_text is read when the request is resolved for a run, not from the command line.
    assert replace(parsed, user_conf_text="") == request


def test_the_shell_line_splits_into_the_same_arguments(tmp_path: Path) -> None:
    request = _everything(tmp_path)
    assert shlex.split(command_line(request, complete=True)) == ["mlharness", *run_arguments(request, complete=True)]


def test_defaults_are_left_out_and_where_results_go_only_when_asked() -> None:
    request = RunRequest(model="null", scenario="Offline", results_dir=Path("elsewhere"), quiet=True)
    assert run_arguments(request) == ["run", "null", "--scenario", "Offline", "--mode", "performance"]
    assert run_arguments(request, complete=True)[-3:] == ["--results-dir", "elsewhere", "--quiet"]


def test_a_tune_trial_records_the_run_that_repeats_it(tmp_path: Path) -> None:
    """A trial runs with --no-tuned, the trial's settings and the tune's --timeout: its recorded
    command says so (it used to drop --no-tuned and --timeout, so it reproduced another run)."""
    from mlharness.running import tuning

    base = RunRequest(model="null", scenario="Offline", use_tuned=False, timeout=99.0, overrides=("min_duration=500",),
                      command="mlharness tune null --scenario Offline")
    seen: list[RunRequest] = []

    def run_trial(request: RunRequest) -> RunRecord:
        seen.append(request)
        return RunRecord(run_id="r", command=request.command, model={}, dataset={}, backend="null",
                         scenario="Offline", mode="performance", performance={"samples_per_second": 10.0})

    tuning.run_search(base, {"intra_op_threads": 0}, "null", 1, run_trial, say=lambda _: None)
    first = seen[0]
    args = shlex.split(first.command)
    assert args[:3] == ["mlharness", "run", "null"] and "--no-tuned" in args and args[args.index("--timeout") + 1] == "99.0"
    assert request_of(build_parser().parse_args(args[1:])) == replace(first, command="")


def test_the_environment_settings_a_request_carries_are_in_its_command(tmp_path: Path) -> None:
    """A resolved request's MLHARNESS_SPECS/HANDOFF/ISSUE that are not the defaults come first in its
    command as VAR=value, and `mlharness rerun` reads them back."""
    from mlharness.commands.rerun import recorded_request
    from mlharness.records.run_record import RunRecord

    request = replace(_everything(tmp_path), specs_root=tmp_path / "my specs", handoff="python", issue_path="python",
                      resolved=True)
    line = command_line(request)
    assert line.startswith(f"'MLHARNESS_SPECS={tmp_path}/my specs' MLHARNESS_HANDOFF=python MLHARNESS_ISSUE=python "
                           "mlharness run null ")
    record = RunRecord(run_id="r1", command=command_line(request, complete=True), model={}, dataset={}, backend="x",
                       scenario="Server", mode="accuracy")
    assert recorded_request(record) == replace(request, user_conf_text=None, resolved=False)
    assert command_line(replace(request, specs_root=None, handoff="native", issue_path="native")).startswith("mlharness ")
