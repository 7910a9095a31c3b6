"""`mlharness rerun RUN_ID|run.json` (issue 34 step 4): a recorded run runs again from its record alone,
and says first what differs since (a manifest's content, software versions), one line each."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import newest_run, run_cli, scenario_root


def _first_run(results: Path) -> dict:
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "target_qps=50000",
                   "--results-dir", results) == 0
    return newest_run(results, "null", "Offline")


def test_rerun_by_id_repeats_the_run_as_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    first = _first_run(results)
    capsys.readouterr()
    assert run_cli("rerun", first["run_id"], "--results-dir", results, "--quiet") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rerun of {first['run_id']}: mlharness run null --scenario Offline --mode performance "
                          "--quick --set target_qps=50000\n  as recorded: the same manifests, software and system\n")
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        runs = store.run_records()
    assert len(runs) == 2
    again = next(r for r in runs if r.run_id != first["run_id"])
    assert again.settings["loadgen"] == first["settings"]["loadgen"] and again.status == "ok"


def test_rerun_says_what_changed_one_line_each(tmp_path: Path, specs_copy: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    first = _first_run(results)
    manifest = specs_copy / "models" / "null.yaml"
    manifest.write_text(manifest.read_text() + "# edited since\n")
    stored = tmp_path / "run.json"  # the record as another machine's software wrote it
    record = dict(first, software=dict(first["software"], versions={**first["software"]["versions"], "numpy": "0.0.1"}))
    stored.write_text(json.dumps(record))
    capsys.readouterr()
    assert run_cli("rerun", stored, "--quiet") == 0
    lines = capsys.readouterr().out.splitlines()
    differs = [line for line in lines if line.startswith("  differs: ")]
    assert len(differs) == 2, lines
    assert differs[0].startswith(f"  differs: model manifest null: sha256 {first['model']['sha256'][:12]} then, ")
    assert differs[1].startswith("  differs: software numpy: 0.0.1 then, ") and not differs[1].endswith("absent now")
    assert len(list(scenario_root(results, "null", "Offline").glob("runs/*/run.json"))) == 2  # the recorded command's


def test_a_record_not_of_a_run_command_is_refused_in_one_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    first = _first_run(results)
    stored = tmp_path / "run.json"
    stored.write_text(json.dumps(dict(first, command="mlharness tune null --scenario Offline")))
    capsys.readouterr()
    assert run_cli("rerun", stored) == 1
    assert capsys.readouterr().err == (f"mlharness: error: run {first['run_id']}: recorded command 'mlharness tune null "
                                       "--scenario Offline' is not an `mlharness run` command; rerun repeats runs\n")
