"""A run request reads nothing when it is built (mlharness.running.request); user.conf is read where
the request is resolved for a run (mlharness.running.resolve.resolved_for_run, called by the
launcher), so a request kept with a sweep still loads once its user.conf has moved."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.running.request import RunRequest
from mlharness.running.resolve import resolved_for_run
from mlharness.sweeps.sweep_grid import Cell
from tests.support import run_cli


def test_a_request_naming_a_moved_user_conf_still_loads(tmp_path: Path) -> None:
    gone = tmp_path / "moved" / "user.conf"
    request = RunRequest(model="null", scenario="Offline", user_conf=gone)
    assert request.user_conf_text is None
    assert RunRequest.from_json(request.to_json()) == request
    # a sweep's stored cell, as report --sweep, report --site and gate sweep:ID load it
    assert Cell.from_params({"model": "null", "scenario": "Offline", "mode": "performance",
                             "user_conf": str(gone)}).request.user_conf == gone


def test_resolving_for_a_run_reads_user_conf_once(tmp_path: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("null.Offline.target_qps = 3\n")
    resolved = resolved_for_run(RunRequest(model="null", scenario="Offline", user_conf=conf))
    assert resolved.user_conf_text == "null.Offline.target_qps = 3\n"
    conf.unlink()  # what crosses to the run's process is the text: the file is not read again
    assert resolved_for_run(resolved) == resolved


def test_resolving_a_missing_user_conf_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    gone = tmp_path / "user.conf"
    with pytest.raises(UserError) as caught:
        resolved_for_run(RunRequest(model="null", scenario="Offline", user_conf=gone))
    assert str(caught.value) == f"{gone}: cannot read user.conf: No such file or directory"


def test_run_with_a_missing_user_conf_fails_in_one_line_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "user.conf"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--user-conf", gone,
                   "--results-dir", tmp_path / "results") == 1
    assert capsys.readouterr().err == f"mlharness: error: {gone}: cannot read user.conf: No such file or directory\n"
    assert not (tmp_path / "results").exists()


def test_the_launcher_sends_the_run_user_conf_text_not_its_path(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from mlharness.running import launcher
    from mlharness.running.outcome import Outcome

    conf = tmp_path / "user.conf"
    conf.write_text("null.Offline.target_qps = 3\n")
    sent: list[RunRequest] = []

    def child(self: launcher.LocalLauncher, request: RunRequest, workdir: Path) -> Outcome:
        sent.append(RunRequest.from_json(request.to_json()))  # what request.json carries to the run's process
        return Outcome(kind="error", record=None, error="not run", exit_status=1)

    monkeypatch.setattr(launcher.LocalLauncher, "_run_child", child)
    launcher.LocalLauncher(store=False).submit(RunRequest(model="null", scenario="Offline", user_conf=conf,
                                                          results_dir=tmp_path / "results"))
    assert sent[0].user_conf_text == "null.Offline.target_qps = 3\n"
