"""`mlharness run --preset` and `run --compliance`, on real short runs of the null model: a preset
changes the settings LoadGen itself used, and the audits really run (their own LoadGen tests, verify
files with verdicts, the outcomes recorded on the audited run)."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import REPO, run_cli, scenario_root

PRESET = """\
description: a test preset
settings:
  "*":
    min_duration: 250
  Offline:
    min_query_count: 321
    target_qps: 10
"""


def loadgen_values(detail_log: Path) -> dict:
    """Every key LoadGen logged in a detail log, with its (last) value."""
    values = {}
    for line in detail_log.read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[len(":::MLLOG "):])
            values[entry["key"]] = entry["value"]
    return values


def conf_lines(user_conf: Path) -> dict[str, str]:
    found = {}
    for line in user_conf.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


@pytest.fixture
def presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A presets folder (MLHARNESS_SCENARIOS) with the shipped quick preset and one of the test's own."""
    folder = tmp_path / "presets"
    folder.mkdir()
    shutil.copy(REPO / "scenarios" / "quick.yaml", folder / "quick.yaml")
    (folder / "tiny-offline.yaml").write_text(PRESET)
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(folder))
    return folder


def test_a_named_preset_changes_what_loadgen_ran(tmp_path: Path, presets: Path) -> None:
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--preset", "tiny-offline",
                   "--results-dir", results) == 0
    root = scenario_root(results, "null", "Offline")
    # What LoadGen itself read and did: the preset's values, over quick's min_duration of 1000 ms.
    logged = loadgen_values(root / "performance" / "run_1" / "mlperf_log_detail.txt")
    assert logged["requested_min_query_count"] == 321
    assert logged["requested_min_duration_ms"] == 250
    assert logged["requested_offline_expected_qps"] == 10
    assert logged["generated_samples_per_query"] == 321  # Offline's one query: max(min_query_count, qps x duration)
    # The saved user.conf and the record say where each key came from.
    assert conf_lines(root / "user.conf") == {"null.Offline.min_duration": "250",
                                               "null.Offline.min_query_count": "321",
                                               "null.Offline.target_qps": "10"}
    record = json.loads((root / "run.json").read_text())
    assert record["settings"]["layers"] == ["mlperf.conf", "model", "preset:quick", "preset:tiny-offline"]
    assert record["settings"]["origin"] == {"min_duration": "preset:tiny-offline",
                                            "min_query_count": "preset:tiny-offline",
                                            "target_qps": "preset:tiny-offline"}
    assert record["performance"]["samples_per_query"] == 321


def test_a_preset_by_path_sits_below_set(tmp_path: Path) -> None:
    """Presets given as files; --set still wins over them (presets < --set)."""
    preset = tmp_path / "mine.yaml"
    preset.write_text(PRESET)
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--preset", preset, "--set", "min_query_count=77",
                   "--results-dir", results) == 0
    root = scenario_root(results, "null", "Offline")
    logged = loadgen_values(root / "performance" / "run_1" / "mlperf_log_detail.txt")
    assert (logged["requested_min_query_count"], logged["requested_min_duration_ms"]) == (77, 250)
    assert logged["generated_samples_per_query"] == 77
    origin = json.loads((root / "run.json").read_text())["settings"]["origin"]
    assert origin == {"min_duration": "preset:mine", "min_query_count": "cli", "target_qps": "preset:mine"}


def test_a_missing_preset_is_a_one_line_error_before_anything_runs(tmp_path: Path, presets: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--preset", "no-such-preset", "--results-dir",
                   results) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"mlharness: error: {presets / 'no-such-preset.yaml'}: no such scenario preset"
    assert not list(results.glob("*/null/Offline/runs/*"))


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One submission-mode run (accuracy, then performance) of null Offline with TEST01 and TEST04.

    target_qps 10: Offline's one query holds 10 samples and ends long before min_duration, so every
    run is INVALID on any machine, and both audits' performance comparisons must say FAIL: the exit
    status is fixed (1), not a matter of timing."""
    results = tmp_path_factory.mktemp("compliance") / "results"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_cli("run", "null", "--scenario", "Offline", "--mode", "submission", "--quick",
                       "--set", "target_qps=10", "--compliance", "test01,TEST04", "--results-dir", results)
    return {"code": code, "out": out.getvalue(), "results": results,
            "root": scenario_root(results, "null", "Offline")}


def test_compliance_runs_both_audits_and_writes_verdicts(audited: dict) -> None:
    assert audited["code"] == 1  # an audit FAILed: the command fails
    root = audited["root"]
    record = json.loads((root / "run.json").read_text())
    run_dir = Path(record["results_path"])
    assert run_dir.parent.name == "runs" and run_dir.parent.parent == root
    for test in ("TEST01", "TEST04"):
        for where in (run_dir / test, root / test):  # the run's own folder, and the scenario's view of it
            detail = where / "performance" / "run_1" / "mlperf_log_detail.txt"
            # A real LoadGen test that read our audit.config.
            assert "Found Audit Config file (audit.config)" in detail.read_text()
            assert (where / "performance" / "run_1" / "mlperf_log_summary.txt").stat().st_size > 0
            verdict = (where / "verify_performance.txt").read_text().splitlines()
            assert verdict[-1] == "TEST FAIL" and "a run is INVALID: the comparison does not count" in verdict
            assert verdict[0] == "reference = performance/run_1/mlperf_log_detail.txt (INVALID)"
    # TEST04 asks LoadGen to issue the same sample every time; the audited run did not.
    assert loadgen_values(run_dir / "TEST04" / "performance" / "run_1" / "mlperf_log_detail.txt")[
        "effective_performance_issue_same"] is True
    assert loadgen_values(run_dir / "performance" / "run_1" / "mlperf_log_detail.txt")[
        "effective_performance_issue_same"] is False
    # TEST01 logs sampled responses in performance mode; the null model answers them as in accuracy mode.
    assert loadgen_values(run_dir / "TEST01" / "performance" / "run_1" / "mlperf_log_detail.txt")[
        "effective_accuracy_log_sampling_target"] > 0
    sampled = json.loads((run_dir / "TEST01" / "accuracy" / "mlperf_log_accuracy.json").read_text())
    text = (run_dir / "TEST01" / "verify_accuracy.txt").read_text()
    assert f"num_perf_log_entries = {len(sampled)}\n" in text and len(sampled) > 0
    assert "num_perf_log_data_mismatch = 0\n" in text and text.rstrip().endswith("TEST PASS")
    assert not (run_dir / "TEST04" / "verify_accuracy.txt").exists()


def test_compliance_outcomes_are_recorded_and_printed(audited: dict) -> None:
    root, out = audited["root"], audited["out"]
    record = json.loads((root / "run.json").read_text())
    compliance = record["compliance"]
    assert set(compliance) == {"TEST01", "TEST04"}  # test01 was taken as TEST01
    assert (compliance["TEST01"]["accuracy"], compliance["TEST01"]["performance"], compliance["TEST01"]["verdict"]) \
        == ("PASS", "FAIL", "FAIL")
    assert (compliance["TEST04"]["performance"], compliance["TEST04"]["verdict"]) == ("FAIL", "FAIL")
    assert "accuracy" not in compliance["TEST04"]
    # Each audit is its own run, not the audited one, and stays out of the database.
    audit_ids = {compliance[t]["run_id"] for t in ("TEST01", "TEST04")}
    assert len(audit_ids) == 2 and record["run_id"] not in audit_ids
    with ResultStore(audited["results"] / "mlharness.sqlite") as store:
        rows = store.list_runs()
        assert [r["run_id"] for r in rows] == [record["run_id"]]
        assert store.get_record(record["run_id"]).compliance["TEST04"]["verdict"] == "FAIL"
    assert "  TEST01 : FAIL (accuracy PASS, performance FAIL)" in out.splitlines()
    assert "  TEST04 : FAIL (performance FAIL)" in out.splitlines()
    scores = re.findall(r"^    test score = ([\d.e+]+)$", out, re.MULTILINE)
    assert len(scores) == 2 and all(float(s) > 0 for s in scores)


def test_without_compliance_the_same_run_passes_and_has_no_audits(tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "submission", "--quick",
                   "--set", "target_qps=10", "--results-dir", results) == 0
    root = scenario_root(results, "null", "Offline")
    assert not list(root.rglob("TEST0*"))
    assert json.loads((root / "run.json").read_text())["compliance"] is None


def test_an_unknown_compliance_test_is_refused_before_the_run(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--compliance", "TEST01,TEST99",
                   "--results-dir", results) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlharness: error: --compliance: expected tests from ") and err.endswith("got 'TEST99'")
    assert not results.exists()
