"""User-facing options no other test exercised (issue 38), continued from tests/test_cli_options.py:
`profile show --top`, `node --dry-run`. Real runs of the null model; nothing depends on its speed."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import run_cli, scenario_root


# ---- profile show --top ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A null Offline --quick run profiled at the python level (sampled functions)."""
    results = tmp_path_factory.mktemp("profiled") / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--profile", "python,harness",
                   "--results-dir", results) == 0
    return scenario_root(results, "null", "Offline")


def _function_rows(shown: str) -> list[list[str]]:
    """The rows of `profile show`'s python function table (after its header and rule, to a blank line)."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["function", "where"])
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_profile_show_top_sets_the_rows_of_functions(profiled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorded = json.loads((profiled / "profile" / "summary.json").read_text())["python"]["top_functions"]
    assert len(recorded) > 10  # enough for the default to be a cut
    capsys.readouterr()
    assert run_cli("profile", "show", profiled) == 0
    default = _function_rows(capsys.readouterr().out)
    assert [row[0] for row in default] == [f["function"].split()[0] for f in recorded[:10]]
    for top in (1, 3):
        assert run_cli("profile", "show", profiled, "--top", str(top)) == 0
        rows = _function_rows(capsys.readouterr().out)
        assert rows == default[:top]
    # Its profile/ folder takes it too.
    assert run_cli("profile", "show", profiled / "profile", "--top", "2") == 0
    assert _function_rows(capsys.readouterr().out) == default[:2]
    for bad in ("0", "-1"):
        assert run_cli("profile", "show", profiled, "--top", bad) == 1
        assert capsys.readouterr().err.strip() == f"mlharness: error: --top: expected a number of rows >= 1, got {bad}"


# ---- node --dry-run -------------------------------------------------------------------------------

def test_node_dry_run_prints_resources_and_command_and_starts_nothing(tmp_path: Path) -> None:
    """In a process of its own, with a `ray start` option that ray would refuse at once: had the command
    been run, the line `mlharness node: ...` and ray's refusal would show (and nothing start)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLHARNESS_")} | \
        {"TMPDIR": str(temp), "RAY_TMPDIR": str(temp)}
    command = [sys.executable, "-m", "mlharness.cli", "node", "--head", "--port", "6390", "--name", "n1",
               "--system", "loopback-x", "--system", "loopback-y", "--dry-run", "--", "--no-such-ray-option", "7"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    resources = dict(line.split(": ") for line in lines[:-1])
    (system,) = [k.partition(":")[2] for k in resources if k.startswith("mlharness_system:")
                 and k not in ("mlharness_system:loopback-x", "mlharness_system:loopback-y")]
    assert resources == {"mlharness_node:n1": "1", "mlharness_slot": "1", f"mlharness_system:{system}": "1",
                         "mlharness_system:loopback-x": "1", "mlharness_system:loopback-y": "1"}
    words = shlex.split(lines[-1])
    assert Path(words[0]).name == "ray" and words[1:5] == ["start", "--head", "--port", "6390"]
    assert words[5] == "--resources" and json.loads(words[6]) == {k: float(v) for k, v in resources.items()}
    assert words[7:] == ["--disable-usage-stats", "--no-such-ray-option", "7"]
    assert list(temp.iterdir()) == []  # no ray session folder
    # Joining: --address in the command, not --head.
    join = [c for c in command if c not in ("--head", "--port", "6390")]
    join[join.index("node") + 1:join.index("node") + 1] = ["--address", "10.0.0.1:6390"]
    done = subprocess.run(join, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert shlex.split(done.stdout.splitlines()[-1])[1:4] == ["start", "--address", "10.0.0.1:6390"]
    assert list(temp.iterdir()) == []


def test_node_dry_run_still_checks_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("node", "--dry-run") == 1
    assert capsys.readouterr().err.strip() == ("mlharness: error: mlharness node: expected --head (start a cluster) "
                                               "or --address HOST:PORT (join one)")
    assert run_cli("node", "--head", "--dry-run", "--", "--resources", "{}") == 1
    assert "--resources is set from the detected system" in capsys.readouterr().err


# ---- tune on SingleStream, its request flags ------------------------------------------------------

def test_tune_single_stream_trials_carry_the_request_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each trial is a run of its own; --trial-seconds is each trial's min_duration, --set reaches each
    trial, --repeats 1 runs each searched configuration once (before the confirmation rounds)."""
    from mlharness.store.result_store import ResultStore

    results = tmp_path / "results"
    assert run_cli("tune", "null", "--scenario", "SingleStream", "--trial-seconds", "0.2", "--repeats", "1",
                   "--set", "target_latency=0.002", "--dataset", "null-samples", "--hardware", "cpu", "--quiet",
                   "--results-dir", results) == 0
    out = capsys.readouterr().out
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        (stored,) = store.list_tuned()
        assert stored["scenario"] == "SingleStream" and stored["figure_name"] == "singlestream.p90_latency_ns"
        trials = json.loads(stored["trials_json"])
        # --repeats 1: one run a trial, no more runs in the database than trials in the search.
        assert sorted(row["run_id"] for row in store.list_runs()) == sorted(t["run_id"] for t in trials)
        records = [json.loads((Path(store.get_record(t["run_id"]).results_path) / "run.json").read_text())
                   for t in trials]
    assert len(records) >= 2
    for record in records:
        settings = record["settings"]
        assert (record["scenario"] if "scenario" in record else settings["scenario"]) == "SingleStream"
        assert settings["loadgen"]["min_duration"] == "200" and settings["origin"]["min_duration"] == "cli"
        assert settings["loadgen"]["target_latency"] == "0.002" and settings["origin"]["target_latency"] == "cli"
        assert record["dataset"]["name"] == "null-samples" and record["hardware"]["name"] == "cpu"
    searched = [line.split()[1] for line in out.splitlines()
                if line[:1].isdigit() and line.split()[2:3] != [] and "(confirm)" not in line and " ok " in f" {line} "]
    assert searched and len(searched) == len(set(searched)), out
