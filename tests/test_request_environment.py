"""The environment's settings that decide a run (MLHARNESS_SPECS, MLHARNESS_HANDOFF, MLHARNESS_ISSUE,
MLHARNESS_SCENARIOS) are
read where the run is submitted and carried in its request (mlharness.running.resolve.resolved_for_run);
the run's process, here or on a cluster node, uses the request's, not its own environment's."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.running.launcher import run_request
from mlharness.running.request import RunRequest
from mlharness.running.resolve import resolved_for_run, spec_index
from mlharness.specs.index import shipped_specs


def test_resolving_reads_the_environment_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_SPECS", str(tmp_path))
    monkeypatch.setenv("MLHARNESS_HANDOFF", "python")
    monkeypatch.setenv("MLHARNESS_ISSUE", "python")
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(tmp_path / "presets"))
    resolved = resolved_for_run(RunRequest(model="null", scenario="Server"))
    assert (resolved.specs_root, resolved.handoff, resolved.issue_path, resolved.resolved) == \
        (tmp_path, "python", "python", True)
    assert resolved.scenarios_root == tmp_path / "presets"
    assert RunRequest.from_json(resolved.to_json()) == resolved  # what crosses to the run's process
    for name in ("MLHARNESS_SPECS", "MLHARNESS_HANDOFF", "MLHARNESS_ISSUE", "MLHARNESS_SCENARIOS"):
        monkeypatch.delenv(name)
    assert resolved_for_run(resolved) == resolved  # resolved once: another environment changes nothing


def test_unset_means_the_defaults_and_the_request_s_own_values_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLHARNESS_SPECS", "MLHARNESS_HANDOFF", "MLHARNESS_ISSUE"):
        monkeypatch.delenv(name, raising=False)
    resolved = resolved_for_run(RunRequest(model="null", scenario="Offline"))
    assert (resolved.specs_root, resolved.handoff, resolved.issue_path) == (None, "native", "native")
    monkeypatch.setenv("MLHARNESS_HANDOFF", "native")
    own = resolved_for_run(RunRequest(model="null", scenario="Offline", handoff="python", specs_root=Path("/s")))
    assert (own.handoff, own.specs_root) == ("python", Path("/s"))


def test_a_resolved_request_without_specs_runs_with_the_shipped_ones(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHARNESS_SPECS", raising=False)
    resolved = resolved_for_run(RunRequest(model="null", scenario="Offline"))
    monkeypatch.setenv("MLHARNESS_SPECS", str(tmp_path))  # as a node's own environment might say
    assert spec_index(resolved).root == shipped_specs()
    assert spec_index(RunRequest(model="null", scenario="Offline")).root == tmp_path  # not resolved yet: the environment


def test_a_resolved_request_without_presets_runs_with_the_shipped_ones(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from mlharness.running.resolve import presets_root
    from mlharness.running.presets import shipped_scenarios

    monkeypatch.delenv("MLHARNESS_SCENARIOS", raising=False)
    resolved = resolved_for_run(RunRequest(model="null", scenario="Offline"))
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(tmp_path))  # as a node's own environment might say
    assert presets_root(resolved) == shipped_scenarios()
    assert presets_root(RunRequest(model="null", scenario="Offline")) is None  # not resolved yet: the environment


def test_the_run_takes_the_issue_path_from_its_request_not_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlharness.sut._native", reason="the C extension is not built")
    monkeypatch.setenv("MLHARNESS_ISSUE", "python")
    request = resolved_for_run(RunRequest(model="null", scenario="Server", quick=True, overrides=("target_qps=2000",),
                                          results_dir=tmp_path, quiet=True))
    monkeypatch.setenv("MLHARNESS_ISSUE", "native")  # the run's process inherits this one
    record = run_request(request)
    assert record.loadgen["performance"]["sut"]["issue_path"] == "python (MLHARNESS_ISSUE=python)"


def test_a_typed_run_command_is_recorded_with_the_environment_settings_it_ran_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support import newest_run, run_cli

    monkeypatch.setenv("MLHARNESS_HANDOFF", "python")
    monkeypatch.delenv("MLHARNESS_ISSUE", raising=False)
    monkeypatch.delenv("MLHARNESS_SPECS", raising=False)
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", tmp_path) == 0
    assert newest_run(tmp_path, "null", "Offline")["command"] == \
        f"MLHARNESS_HANDOFF=python mlharness run null --scenario Offline --quick --results-dir {tmp_path}"


def test_the_run_takes_its_presets_folder_from_its_request_not_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$MLHARNESS_SCENARIOS is read where the run is submitted: a preset found there is the one the run's
    process (or a cluster node, whose own environment may name another folder or none) applies."""
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "mine.yaml").write_text("settings:\n  '*': {min_duration: 1000, min_query_count: 7}\n")
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(presets))
    request = resolved_for_run(RunRequest(model="null", scenario="SingleStream", presets=("mine",),
                                          results_dir=tmp_path / "results", quiet=True))
    assert request.scenarios_root == presets
    assert RunRequest.from_json(request.to_json()) == request
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(tmp_path / "elsewhere"))  # the run's process inherits this one
    record = run_request(request)
    assert record.settings["loadgen"]["min_query_count"] == "7"  # as LoadGen took it (a user.conf value)
