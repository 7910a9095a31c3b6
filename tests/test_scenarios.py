"""Every scenario in performance mode with the real LoadGen, on resnet50-light (ONNX Runtime) and null."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mlharness.records.loadgen_logs import parse_summary
from mlharness.running.settings import SCENARIOS
from tests.support import null_model_with, read_run, run_cli, scenario_root, sleeping_postprocess


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
    (system_file,) = results.glob("*.json")
    system_json = json.loads(system_file.read_text())
    # The CPUs this machine has and those this process may run on (the run inherits its affinity).
    assert system_json["schema_version"] == 1
    assert system_json["detected"]["logical_cpus"] == os.cpu_count()
    assert system_json["detected"]["cpus_available"] == len(os.sched_getaffinity(0))


def test_batching_sends_whole_batches_to_a_symbolic_batch_graph(tmp_path: Path, specs_copy: Path) -> None:
    """light_resnet50 is made batchable by the recorded symbolic_batch transform, and ONNX Runtime
    really computes batches of max_batch_size: the model's postprocess (a copy that also writes down
    how many rows each call got back from the backend) sees 4 rows a call, not what was recorded."""
    seen = tmp_path / "rows.txt"
    manifest = specs_copy / "models" / "resnet50-light.yaml"
    line = '      scores = outputs["gpu_0/softmax_1"]\n'
    text = manifest.read_text()
    assert line in text
    manifest.write_text(text.replace(line, line + f'      open({str(seen)!r}, "a").write(f"{{len(scores)}}\\n")\n'))
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--quick", "--set", "max_batch_size=4",
                   "--set", "min_duration=1000", "--results-dir", tmp_path / "r") == 0
    record = read_run(tmp_path / "r", "resnet50-light", "Offline")
    assert record["backend_info"]["transforms"] == ["symbolic_batch"]
    assert len(record["backend_info"]["graph_sha256"]) == 64
    assert record["settings"]["harness"]["max_batch_size"] == 4
    rows = [int(n) for n in seen.read_text().split()]
    # The timed first inference (one sample) and the warm-up's 4 batches, postprocessed one by one;
    # then the Offline query's 44 samples (target_qps 40 for a min_duration of 1 s, plus LoadGen's 10%),
    # in 11 batches of 4 that the worker postprocesses in groups of up to 64 rows (how many batches a
    # group gets depends on how many were queued when the worker looked): whole batches each time.
    assert rows[:5] == [1, 4, 4, 4, 4], rows
    assert sum(rows[5:]) == 44 and all(n % 4 == 0 for n in rows[5:]), rows
    assert record["loadgen"]["performance"]["sut"]["postprocess_group_rows"] == 64


def test_find_peak_mode_on_server(tmp_path: Path) -> None:
    """LoadGen's search for the highest VALID target, on a model whose peak is fixed by construction:
    the null model answering one query at a time, each after a 1 ms sleep, can never serve more than
    1000 QPS. The search starts at 100 QPS, which a loaded machine meets too, and allows 100 ms at the
    99th percentile; a step above the peak for its 500 ms builds a queue that stays within that bound
    only up to about 1200 QPS."""
    model = null_model_with(tmp_path / "models", postprocess=sleeping_postprocess(0.001))
    assert run_cli("run", model, "--scenario", "Server", "--mode", "find-peak", "--quick",
                   "--set", "min_duration=500", "--set", "target_qps=100", "--set", "target_latency=100",
                   "--set", "max_batch_size=1", "--set", "workers=1", "--results-dir", tmp_path) == 0
    summary = read_run(tmp_path, "null", "Server")["performance"]
    assert summary["mode"] == "FindPeakPerformance"
    # The search ran: it ends on the highest target whose latency bound held, above where it started and
    # not far past the peak. Whether LoadGen calls it VALID is left open: at that edge some queries come
    # close to the bound, and its early-stopping estimate then wants more queries than a step has.
    assert 100 < summary["target_qps"] < 2000, summary["target_qps"]
    assert summary["raw"]["Performance constraints satisfied"] == "Yes"
    assert summary["p99_latency_ns"] <= 100_000_000


def test_the_run_records_the_cpus_it_may_use(tmp_path: Path) -> None:
    """`cpus_available` is the CPU affinity the run got, not the machine's count: with this test
    pinned to one CPU (the run's process inherits it), the machine still has all of its CPUs and
    the run may use one."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip(f"only {len(allowed)} CPU may be used here: pinning to one would change nothing")
    os.sched_setaffinity(0, {min(allowed)})
    try:
        assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", tmp_path) == 0
    finally:
        os.sched_setaffinity(0, allowed)
    detected = read_run(tmp_path, "null", "Offline")["system"]
    assert (detected["logical_cpus"], detected["cpus_available"]) == (os.cpu_count(), 1)


def test_a_run_without_a_results_dir_stays_in_the_tests_folder(tmp_path: Path) -> None:
    """The suite is hermetic (tests/conftest.py): no MLHARNESS_* from outside but the shared cache and
    the display turned off, and a command's default `results/` (with its database) lands in the test's
    own folder."""
    assert {v for v in os.environ if v.startswith("MLHARNESS_")} == {"MLHARNESS_CACHE", "MLHARNESS_PROGRESS"}
    assert os.environ["MLHARNESS_PROGRESS"] == "off"
    cache = Path(os.environ["MLHARNESS_CACHE"])  # shared by the session (and its xdist workers): above the test
    assert cache.name == "mlharness-cache" and cache.parent in tmp_path.parents
    assert Path.cwd() == tmp_path
    assert run_cli("run", "null", "--scenario", "Offline", "--quick") == 0
    assert (tmp_path / "results" / "mlharness.sqlite").is_file()
    assert read_run(tmp_path / "results", "null", "Offline")["status"] == "ok"
