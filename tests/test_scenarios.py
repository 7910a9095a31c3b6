"""Every scenario in performance mode with the real LoadGen, on resnet50-light (ONNX Runtime) and null."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.records.loadgen_logs import parse_summary
from harness.running.settings import SCENARIOS
from tests.support import read_run, run_cli, scenario_root


@pytest.mark.parametrize("model", ["null", "resnet50-light"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_performance_run_writes_the_tree(tmp_path: Path, model: str, scenario: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli("run", model, "--scenario", scenario, "--quick", "--results-dir", results) == 0
    out = capsys.readouterr().out
    assert f"{model} " in out and scenario in out and "LoadGen result" in out
    root = scenario_root(results, model, scenario)
    summary = parse_summary(root / "performance" / "run_1" / "mlperf_log_summary.txt")
    assert summary["scenario"] == scenario and summary["mode"] == "PerformanceOnly"
    assert summary["metric"]["value"] > 0
    assert (root / "performance" / "run_1" / "mlperf_log_detail.txt").stat().st_size > 0
    record = read_run(results, model, scenario)
    assert record["status"] == "ok" and record["performance"]["metric"] == summary["metric"]
    assert not list(root.glob(".staging-*")), "staging folder must be gone after a run"
    system_json = json.loads(next(results.glob("*.json")).read_text())
    # Holds on any machine (a count the OS does not report is recorded as 1): only that it is recorded.
    assert system_json["schema_version"] == 1 and system_json["detected"]["logical_cpus"] >= 1


def test_batching_sends_whole_batches_to_a_symbolic_batch_graph(tmp_path: Path) -> None:
    """light_resnet50 is made batchable by the recorded symbolic_batch transform."""
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--quick", "--set", "max_batch_size=4",
                   "--results-dir", tmp_path) == 0
    record = read_run(tmp_path, "resnet50-light", "Offline")
    assert record["backend_info"]["transforms"] == ["symbolic_batch"]
    assert len(record["backend_info"]["graph_sha256"]) == 64
    assert record["settings"]["harness"]["max_batch_size"] == 4


def test_find_peak_mode_on_server(tmp_path: Path) -> None:
    assert run_cli("run", "null", "--scenario", "Server", "--mode", "find-peak", "--quick",
                   "--set", "min_duration=200", "--results-dir", tmp_path) == 0
    summary = read_run(tmp_path, "null", "Server")["performance"]
    assert summary["mode"] == "FindPeakPerformance"
