"""Submission trees: `submission run` (real LoadGen, null backend, short runs) with TEST01/TEST04,
`submission package` with --allow-invalid, and `submission check` against the v6.x rules.
Short runs are INVALID or override min_duration by design: they exercise every file, not the grade."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from harness.submission import accuracy_txt, checker, compliance
from harness.submission.rules import (
    ACCURACY_FILES,
    BENCHMARKS,
    MAX_ACCURACY_LOG_SIZE,
    MEASUREMENTS_FIELDS,
    PERFORMANCE_FILES,
    SCENARIO_FILES,
    SYSTEM_FIELDS,
    VIEWABLE_SIZE,
)
from tests.support import REPO, run_cli

MODEL = "null-resnet"
HEADLINE = re.compile(r"^accuracy=\d+\.\d{3}%, good=\d+, total=\d+$")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short submission run: Offline (INVALID: min duration not met) and SingleStream, with audits.
    The model is the null model named as ResNet-50, so the tree has a benchmark to map to."""
    root = tmp_path_factory.mktemp("submission")
    specs = root / "specs"
    shutil.copytree(REPO / "specs", specs)
    text = (specs / "models" / "null.yaml").read_text().replace('name: "null"\n', f"name: {MODEL}\n", 1)
    # Offline's one query holds 10 samples, so it always ends before min_duration and is INVALID,
    # however loaded the machine (with the null model's 1M samples a slow machine could pass 1 s).
    hint = "Offline: {target_qps: 1000000}"
    assert hint in text
    text = text.replace(hint, "Offline: {target_qps: 10}")
    (specs / "models" / "null-resnet.yaml").write_text(text.replace("attributes:", "mlperf_benchmark: resnet50\n"
                                                                                   "attributes:", 1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLHARNESS_SPECS", str(specs))
        patch.delenv("MLHARNESS_DB", raising=False)
        results = root / "results"
        code = run_cli("submission", "run", "--model", MODEL, "--scenarios", "Offline,SingleStream", "--quick",
                       "--compliance", "TEST01,TEST04", "--results-dir", results)
        assert code in (0, 1)  # 1: an audit's timing comparison failed on a short run; files exist either way
        yield results


def _scenario(results: Path, scenario: str) -> Path:
    (found,) = results.glob(f"*/{MODEL}/{scenario}")
    return found


def _package(session: Path, out: Path, *extra: str) -> int:
    return run_cli("submission", "package", "--division", "open", "--submitter", "Acme", "--out", out,
                   "--results-dir", session, *extra)


def test_audits_write_verify_files_with_verdicts_and_numbers(session: Path) -> None:
    for scenario in ("Offline", "SingleStream"):
        where = _scenario(session, scenario)
        accuracy = (where / "TEST01" / "verify_accuracy.txt").read_text()
        # The null model answers every sample the same way in both modes: what was sampled must match.
        assert "num_perf_log_data_mismatch = 0" in accuracy
        sampled = int(re.search(r"^num_perf_log_qsl_idx_match = (\d+)$", accuracy, re.M).group(1))
        # Nothing sampled proves nothing, so it fails. Offline's 10 samples are all sampled; a loaded
        # machine can issue too few SingleStream queries for LoadGen's 64-in-100k sampling to pick one.
        assert accuracy.rstrip().endswith("TEST PASS" if sampled else "TEST FAIL")
        assert sampled > 0 or scenario == "SingleStream"
        for test in ("TEST01", "TEST04"):
            text = (where / test / "verify_performance.txt").read_text()
            assert text.rstrip().splitlines()[-1] in ("TEST PASS", "TEST FAIL")
            assert re.search(r"^reference score = [\d.e+]+$", text, re.M)
            assert re.search(r"^test score = [\d.e+]+$", text, re.M)
            for name in PERFORMANCE_FILES:
                assert (where / test / "performance" / "run_1" / name).stat().st_size > 0
            detail = (where / test / "performance" / "run_1" / "mlperf_log_detail.txt").read_text()
            assert "Found Audit Config file" in detail
        assert '"effective_performance_issue_same", "value": true' in \
            (where / "TEST04" / "performance" / "run_1" / "mlperf_log_detail.txt").read_text()
    # the Offline short run is INVALID, so its comparisons cannot pass
    assert "INVALID" in (_scenario(session, "Offline") / "TEST04" / "verify_performance.txt").read_text()
    record = json.loads((_scenario(session, "SingleStream") / "submission_steps.json").read_text())
    assert set(record["records"]["performance"]["compliance"]) == {"TEST01", "TEST04"}


def test_session_resumes_without_rerunning(session: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_SPECS", str(session.parent / "specs"))
    run_cli("submission", "run", "--model", MODEL, "--scenarios", "Offline,SingleStream", "--quick",
            "--compliance", "TEST01,TEST04", "--results-dir", session)
    out = capsys.readouterr().out
    assert out.count("skipped") == 8 and "started" not in out


def test_redo_runs_the_chosen_step_again_and_only_it(session: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_SPECS", str(session.parent / "specs"))
    args = ("submission", "run", "--model", MODEL, "--scenarios", "Offline,SingleStream", "--quick",
            "--compliance", "TEST01,TEST04", "--results-dir", session)
    assert run_cli(*args, "--redo", "SingleStream/TEST05") == 1
    assert "--redo SingleStream/TEST05: not a step of this run" in capsys.readouterr().err
    before = json.loads((_scenario(session, "SingleStream") / "submission_steps.json").read_text())
    run_cli(*args, "--redo", "SingleStream/TEST04")
    out = capsys.readouterr().out
    assert out.count("skipped") == 7 and re.search(r"SingleStream TEST04: started", out)
    after = json.loads((_scenario(session, "SingleStream") / "submission_steps.json").read_text())
    ran = after["records"]["performance"]["compliance"]
    assert ran["TEST04"]["run_id"] != before["records"]["performance"]["compliance"]["TEST04"]["run_id"]
    assert ran["TEST01"]["run_id"] == before["records"]["performance"]["compliance"]["TEST01"]["run_id"]


def test_package_refuses_invalid_runs_without_allow_invalid(session: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert _package(session, tmp_path / "out") == 1
    assert "not submission-grade" in capsys.readouterr().err
    assert not (tmp_path / "out" / "open").exists()


def test_package_writes_every_required_file_and_field(session: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_SPECS", str(session.parent / "specs"))
    out = tmp_path / "out"
    assert _package(session, out, "--allow-invalid", "--skip-dataset-size-check", "--system", "tiny-box",
                    "--system-field", "cooling=air") == 0
    base = out / "open" / "Acme"
    assert (base / "src" / "mlharness" / "harness" / "running" / "runner.py").is_file()
    assert (base / "src" / "specs" / "models" / "null-resnet.yaml").is_file()
    assert json.loads((base / "model_mapping.json").read_text()) == {MODEL: "resnet"}
    assert "overrode protected settings min_duration" in (base / "NOT_FOR_SUBMISSION.txt").read_text()
    system = json.loads((base / "systems" / "tiny-box.json").read_text())
    assert list(system) == list(SYSTEM_FIELDS) and len(system) == 35
    assert all(isinstance(v, str) and v.strip() for v in system.values())
    assert system["division"] == "open" and system["submitter"] == "Acme" and system["cooling"] == "air"
    assert system["accelerators_per_node"] == "0"
    for scenario in ("Offline", "SingleStream"):
        where = base / "results" / "tiny-box" / MODEL / scenario
        files = [where / n for n in SCENARIO_FILES] + [where / "performance" / "run_1" / n for n in PERFORMANCE_FILES]
        files += [where / "accuracy" / n for n in ACCURACY_FILES]
        files += [where / t / "verify_performance.txt" for t in ("TEST01", "TEST04")]
        for path in files:
            assert path.stat().st_size > 0, path
        assert sorted(p.name for p in (where / "performance" / "run_1").iterdir()) == sorted(PERFORMANCE_FILES)
        measurements = json.loads((where / "measurements.json").read_text())
        assert all(str(measurements[k]).strip() for k in MEASUREMENTS_FIELDS)
        readme = (where / "README.md").read_text()
        assert f"mlharness run {MODEL} --scenario {scenario} --mode performance" in readme
        assert f"--mode accuracy" in readme and "--compliance TEST01,TEST04" in readme
        assert f"resnet50.{scenario}.min_duration = 1000" in (where / "user.conf").read_text()
        # accuracy.txt: the official headline, then our figures, then the hash of the full log
        lines = (where / "accuracy" / "accuracy.txt").read_text().splitlines()
        assert HEADLINE.match(lines[0]) and lines[0].startswith("accuracy=50.000%")
        full = out / "full_accuracy_logs" / "open" / "Acme" / "tiny-box" / MODEL / scenario / "mlperf_log_accuracy.json"
        assert lines[-1] == f"hash={hashlib.sha256(full.read_bytes()).hexdigest()}"
        assert full.stat().st_size > MAX_ACCURACY_LOG_SIZE
        assert (where / "accuracy" / "mlperf_log_accuracy.json").stat().st_size <= MAX_ACCURACY_LOG_SIZE
    assert run_cli("submission", "check", out, "--allow-invalid", "--skip-dataset-size-check") == 0


def test_check_reports_an_accuracy_run_on_part_of_the_dataset(session: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path, monkeypatch)
    capsys.readouterr()
    assert run_cli("submission", "check", out, "--allow-invalid") == 1
    captured = capsys.readouterr()
    covered = [line for line in captured.err.splitlines() if "dataset samples" in line]
    assert len(covered) == 2 and all("of resnet's 50000 dataset samples" in line for line in covered)
    assert run_cli("submission", "check", out, "--allow-invalid", "--skip-dataset-size-check") == 0
    assert capsys.readouterr().out.count("waived (--skip-dataset-size-check)") == 2


def _packaged(session: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, division: str = "open") -> Path:
    monkeypatch.setenv("MLHARNESS_SPECS", str(session.parent / "specs"))
    out = tmp_path / "out"
    assert run_cli("submission", "package", "--division", division, "--submitter", "Acme", "--out", out,
                   "--results-dir", session, "--allow-invalid") in (0, 1)
    return out


def test_check_refuses_invalid_and_overridden_runs(session: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path, monkeypatch)
    capsys.readouterr()
    assert run_cli("submission", "check", out) == 1
    err = capsys.readouterr().err
    assert re.search(r"Offline/performance/run_1/mlperf_log_detail.txt: LoadGen marked the run INVALID", err)
    assert "min_duration: expected >= 600000 ms, found 1000" in err
    assert "overrode protected settings min_duration" in err
    assert "SingleStream/performance/run_1/mlperf_log_detail.txt: LoadGen marked" not in err  # that one was VALID


def test_check_reports_a_missing_and_an_unparsable_system_field(session: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path, monkeypatch)
    (path,) = (out / "open" / "Acme" / "systems").glob("*.json")
    system = json.loads(path.read_text())
    del system["cooling"]
    system["accelerators_per_node"] = 0
    system["host_processor_core_count"] = "two"
    path.write_text(json.dumps(system))
    (next((out / "open" / "Acme" / "results").glob("*/*/SingleStream")) / "README.md").write_text("")
    capsys.readouterr()
    assert run_cli("submission", "check", out, "--allow-invalid", "--skip-dataset-size-check") == 1
    err = capsys.readouterr().err.splitlines()
    assert any(line.endswith(".json: cooling: missing field") for line in err)
    assert any("accelerators_per_node: expected a non-empty string (write \"0\", not 0)" in line for line in err)
    assert any("host_processor_core_count: expected a count that parses as an integer" in line for line in err)
    assert any(line.endswith("SingleStream/README.md: empty: required file must have content") for line in err)
    assert err[-1].startswith("submission check: 4 problem(s)")


def test_closed_division_reports_missing_scenarios_and_accuracy(session: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path, monkeypatch, "closed")
    assert list((out / "closed" / "Acme" / "results").glob("*/resnet/Offline"))
    capsys.readouterr()
    assert run_cli("submission", "check", out, "--allow-invalid") == 1
    captured = capsys.readouterr()
    assert "closed division: edge systems need scenarios MultiStream for resnet" in captured.err
    assert "closed division: accuracy 50 is below resnet's target 75.695" in captured.err
    # a run setting, so waived in this NOT_FOR_SUBMISSION tree, and reported as waived
    assert re.search(r"^waived \(not for submission\): .*Offline/performance/run_1/mlperf_log_detail.txt: "
                     r"closed division: Offline samples_per_query: expected >= 24576 for resnet, found \d+$",
                     captured.out, re.M)


def test_accuracy_txt_and_truncation_follow_the_official_tool(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    entries = [{"seq_id": i, "qsl_idx": i, "data": "00" * 64} for i in range(200)]
    (run_dir / "mlperf_log_accuracy.json").write_text(json.dumps(entries, indent=1))
    (run_dir / "accuracy.txt").write_text("accuracy=90.000%, good=18, total=20\ntop5=1.000000\n")
    full = tmp_path / "full" / "mlperf_log_accuracy.json"
    digest = accuracy_txt.write_packaged_accuracy(run_dir, tmp_path / "packaged", full)
    original = (run_dir / "mlperf_log_accuracy.json").read_bytes()
    assert full.read_bytes() == original and digest == hashlib.sha256(original).hexdigest()
    text = (tmp_path / "packaged" / "accuracy.txt").read_text()
    assert text == f"accuracy=90.000%, good=18, total=20\ntop5=1.000000\nhash={digest}\n"
    truncated = (tmp_path / "packaged" / "mlperf_log_accuracy.json").read_bytes()
    assert truncated == original[:VIEWABLE_SIZE] + b"\n\n...\n\n" + original[-VIEWABLE_SIZE:]
    small = tmp_path / "small"
    small.mkdir()
    (small / "mlperf_log_accuracy.json").write_text("[\n]\n")
    (small / "accuracy.txt").write_text("top1=0.5\n")
    with pytest.raises(Exception, match="expected the official headline"):
        accuracy_txt.write_packaged_accuracy(small, tmp_path / "p2", tmp_path / "f2.json")


def _detail(path: Path, scenario: str, key: str, value: float, valid: bool = True) -> Path:
    lines = [("effective_scenario", scenario), ("result_validity", "VALID" if valid else "INVALID"), (key, value)]
    path.write_text("".join(f':::MLLOG {json.dumps({"key": k, "value": v, "metadata": {}})}\n' for k, v in lines))
    return path


@pytest.mark.parametrize("test, scenario, key, ref, got, passed", [
    ("TEST01", "Offline", "result_samples_per_second", 100.0, 109.0, True),
    ("TEST01", "Offline", "result_samples_per_second", 100.0, 89.0, False),
    ("TEST04", "Offline", "result_samples_per_second", 100.0, 109.0, True),
    ("TEST04", "Offline", "result_samples_per_second", 100.0, 50.0, True),   # slower is fine
    ("TEST04", "Offline", "result_samples_per_second", 100.0, 111.0, False),  # caching would be faster
    # SingleStream: TEST04 compares rates (1e9 / latency), relaxed to 20% at these rates
    ("TEST04", "SingleStream", "early_stopping_latency_ss", 30e6, 26e6, True),
    ("TEST04", "SingleStream", "early_stopping_latency_ss", 30e6, 24e6, False),
])
def test_performance_verdicts(tmp_path: Path, test: str, scenario: str, key: str, ref: float, got: float,
                              passed: bool) -> None:
    verdict = compliance.verify_performance(test, _detail(tmp_path / "r.txt", scenario, key, ref),
                                            _detail(tmp_path / "t.txt", scenario, key, got))
    assert verdict.passed is passed
    assert verdict.text().rstrip().endswith("TEST PASS" if passed else "TEST FAIL")


def test_performance_verdict_fails_on_an_invalid_run(tmp_path: Path) -> None:
    verdict = compliance.verify_performance(
        "TEST04", _detail(tmp_path / "r.txt", "Offline", "result_samples_per_second", 100.0, valid=False),
        _detail(tmp_path / "t.txt", "Offline", "result_samples_per_second", 100.0))
    assert not verdict.passed and "INVALID" in verdict.text()


@pytest.mark.parametrize("division, scenario, samples, flagged", [
    ("closed", "Offline", 24575, True),
    ("closed", "Offline", 24576, False),
    ("open", "Offline", 100, False),             # the floor is a closed-division rule
    ("closed", "SingleStream", 1, False),
])
def test_closed_offline_queries_need_the_benchmarks_minimum_samples(tmp_path: Path, division: str, scenario: str,
                                                                     samples: int, flagged: bool) -> None:
    detail = _detail(tmp_path / "d.txt", scenario, "effective_samples_per_query", samples)
    found = [p.message for p in checker.check_performance_log(detail, scenario, BENCHMARKS["resnet"], division)]
    assert any("samples_per_query: expected >= 24576 for resnet" in m for m in found) is flagged


def test_run_compliance_flag_rejects_unknown_tests_before_running(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", tmp_path,
                   "--compliance", "TEST05") == 1
    assert "--compliance: expected tests from TEST01, TEST04, got 'TEST05'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
