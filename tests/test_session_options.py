"""`mlharness submission run`'s options carry one RunRequest (mlharness.submission.session.SessionOptions):
each run-request flag the command takes reaches every step's run, none copied by hand and none dropped."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.cli import build_parser
from mlharness.commands.submission import SESSION_FLAGS
from mlharness.errors import UserError
from mlharness.running.arguments import FLAGS
from mlharness.running.request import RunRequest
from mlharness.submission import session
from tests.support import copy_specs, run_cli


def _options(monkeypatch: pytest.MonkeyPatch, *argv: str) -> session.SessionOptions:
    """The options `submission run ARGV` would run with (its cmd_run, less the running)."""
    captured: list[session.SessionOptions] = []
    monkeypatch.setattr(session, "run_session", lambda options: captured.append(options) or 0)
    args = build_parser().parse_args(["submission", "run", *argv])
    assert args.func(args) == 0
    return captured[0]


def test_every_session_flag_reaches_the_steps_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "user.conf"
    options = _options(monkeypatch, "--model", "null", "--scenarios", "Offline,Server", "--results-dir", str(tmp_path),
                       "--backend", "onnxruntime", "--dataset", "synthetic", "--hardware", "cpu-pinned",
                       "--user-conf", str(conf), "--set", "workers=2", "--preset", "fast", "--quick", "--quiet",
                       "--division", "closed", "--redo", "Offline")
    expected = RunRequest(model="null", scenario="Offline", results_dir=tmp_path, backend="onnxruntime",
                          dataset="synthetic", hardware="cpu-pinned", user_conf=conf, overrides=("workers=2",),
                          presets=("fast",), quick=True, quiet=True)
    assert options.request == expected
    default = RunRequest(model="null", scenario="Offline")
    assert all(getattr(options.request, FLAGS[flag].field) != getattr(default, FLAGS[flag].field)
               for flag in SESSION_FLAGS)  # every flag was set above, and kept
    step = session._request(options, "Server", "cmd")
    assert step == RunRequest(**{**expected.__dict__, "scenario": "Server", "command": "cmd"})
    assert (options.scenarios, options.division, options.redo) == (("Offline", "Server"), "closed", ("Offline",))


def test_a_wrong_scenario_is_named_as_scenarios(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError) as caught:
        _options(monkeypatch, "--model", "null", "--scenarios", "Offlin")
    assert str(caught.value) == "--scenarios: expected names from SingleStream, MultiStream, Server, Offline, got 'Offlin'"
    with pytest.raises(UserError) as caught:
        session.check_scenarios([])
    assert str(caught.value) == "--scenarios: expected at least one scenario"


def test_a_backend_the_model_has_no_manifest_for_is_refused_before_any_step(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--backend picks the model's manifest for the whole session: one it lacks is refused when the session opens,
    in one line, before a step starts or a state file is written."""
    assert run_cli("submission", "run", "--model", "null", "--scenarios", "Offline", "--quick", "--backend",
                   "onnxruntime", "--results-dir", tmp_path) == 1
    out, err = capsys.readouterr()
    assert err == "mlharness: error: model 'null' has no manifest for backend 'onnxruntime' (have: null)\n"
    assert "started" not in out and not list(tmp_path.rglob("submission_run.json"))


def test_a_session_on_a_gpu_keeps_its_state_in_the_devices_system_folder(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A CUDA run and a CPU run of one host are two systems: a session's state goes where its runs go, the
    device's system folder. (No GPU here: the first step's run is refused, after the session opened.)"""
    assert run_cli("submission", "run", "--model", "null", "--scenarios", "Offline", "--quick", "--hardware", "cuda0",
                   "--results-dir", tmp_path) == 1
    assert "device: the null backend runs on cpu only, got cuda:0" in capsys.readouterr().err
    (state,) = tmp_path.glob("*/null/submission_run.json")
    assert state.parent.parent.name.endswith("c_cuda0"), state


def test_the_sessions_hardware_is_looked_up_among_hardware_manifests_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A dataset that shares the hardware's name ("cpu") does not make the name ambiguous: the session gets as far
    as its --redo check (which names the steps, before anything runs)."""
    specs = copy_specs(tmp_path / "specs")
    text = (specs / "datasets" / "null-samples.yaml").read_text()
    (specs / "datasets" / "cpu.yaml").write_text(text.replace("name: null-samples", "name: cpu", 1))
    monkeypatch.setenv("MLHARNESS_SPECS", str(specs))
    assert run_cli("submission", "run", "--model", "null", "--scenarios", "Offline", "--quick", "--redo", "nothing",
                   "--results-dir", tmp_path / "results") == 1
    assert capsys.readouterr().err == ("mlharness: error: --redo nothing: not a step of this run; expected a scenario "
                                       "or one of: Offline/performance, Offline/accuracy\n")
