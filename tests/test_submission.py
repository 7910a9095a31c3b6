"""Submission trees: `submission run` (real LoadGen, null backend, short runs) with TEST01/TEST04,
`submission package` with --allow-invalid, and `submission check` against the v6.x rules.
Short runs are INVALID or override min_duration by design: they exercise every file, not the grade."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
from pathlib import Path

import pytest

from mlharness.submission import accuracy_txt, checker, compliance
from mlharness.submission.rules import (
    ACCURACY_FILES,
    BENCHMARKS,
    MAX_ACCURACY_LOG_SIZE,
    MEASUREMENTS_FIELDS,
    PERFORMANCE_FILES,
    SCENARIO_FILES,
    SYSTEM_FIELDS,
    VIEWABLE_SIZE,
)
from tests.support import copy_specs, detail_log, null_model_with, read_run, run_cli

MODEL = "null-resnet"
HEADLINE = re.compile(r"^accuracy=\d+\.\d{3}%, good=\d+, total=\d+$")


# Every verdict of the session is fixed by its settings, whatever the machine's speed or load:
# - Offline's one query holds 11 samples (target_qps 40 for --quick's 0.25 s, plus LoadGen's 10%): it ends long
#   before min_duration, so the run and its audits are INVALID and their comparisons FAIL; all 11
#   samples are sampled into TEST01's log.
# - SingleStream runs exactly 32 queries (min_duration 0, max_query_count 32), too few for LoadGen's
#   early-stopping estimate (64): INVALID, a score of 0, so the comparisons FAIL with "no positive
#   score"; target_latency is pinned (not measured at warm-up), so TEST01 samples all 32.
# - The null model answers every sample the same in both modes: TEST01's accuracy check PASSES.
USER_CONF = ("*.SingleStream.min_duration = 0\n*.SingleStream.max_query_count = 32\n"
             "*.SingleStream.target_latency = 1000\n")
SAMPLED = {"Offline": 11, "SingleStream": 32}
ALL_AUDITS_FAILED = "compliance failed: Offline/TEST01, Offline/TEST04, SingleStream/TEST01, SingleStream/TEST04"


def _session_args(results: Path) -> tuple:
    return ("submission", "run", "--model", MODEL, "--scenarios", "Offline,SingleStream", "--quick",
            "--compliance", "TEST01,TEST04", "--user-conf", results.parent / "user.conf", "--results-dir", results)


@pytest.fixture(scope="module")
def _session_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short submission run of Offline and SingleStream with both audits (see USER_CONF). The
    model is the null model named as ResNet-50, so the tree has a benchmark to map to."""
    root = tmp_path_factory.mktemp("submission")
    specs = copy_specs(root / "specs")
    manifest = null_model_with(specs / "models", name=MODEL, benchmark="resnet50")
    hint = "Offline: {target_qps: 1000000}"
    assert hint in manifest.read_text()
    manifest.write_text(manifest.read_text().replace(hint, "Offline: {target_qps: 40}"))
    (root / "user.conf").write_text(USER_CONF)
    results = root / "results"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(err):
        patch.setenv("MLHARNESS_SPECS", str(specs))
        code = run_cli(*_session_args(results))
    assert (code, err.getvalue()) == (1, ALL_AUDITS_FAILED + "\n")
    return results


@pytest.fixture
def session(_session_run: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The session's results folder, with MLHARNESS_SPECS pointing at its specs (which hold the
    null-resnet manifest) for the test; every test starts without it (tests/conftest.py)."""
    monkeypatch.setenv("MLHARNESS_SPECS", str(_session_run.parent / "specs"))
    return _session_run


def _scenario(results: Path, scenario: str) -> Path:
    (found,) = results.glob(f"*/{MODEL}/{scenario}")
    return found


def _package(session: Path, out: Path, *extra: str) -> int:
    return run_cli("submission", "package", "--division", "open", "--submitter", "Acme", "--out", out,
                   "--results-dir", session, *extra)


def test_audits_write_verify_files_with_verdicts_and_numbers(session: Path) -> None:
    for scenario in ("Offline", "SingleStream"):
        where = _scenario(session, scenario)
        accuracy = (where / "TEST01" / "verify_accuracy.txt").read_text().splitlines()
        # What was sampled in performance mode matches the accuracy run, every sample of it.
        assert f"num_perf_log_entries = {SAMPLED[scenario]}" in accuracy
        assert f"num_perf_log_qsl_idx_match = {SAMPLED[scenario]}" in accuracy
        assert "num_perf_log_data_mismatch = 0" in accuracy and accuracy[-1] == "TEST PASS"
        for test in ("TEST01", "TEST04"):
            text = (where / test / "verify_performance.txt").read_text()
            assert text.startswith(f"reference = performance/run_1/mlperf_log_detail.txt (INVALID)\n"
                                   f"test = {test}/performance/run_1/mlperf_log_detail.txt (INVALID)\n"
                                   f"scenario = {scenario}\n"), text
            assert text.endswith("TEST FAIL\n")
            if scenario == "Offline":  # both scores are real figures, compared, and the comparison void
                assert re.search(r"^reference score = \d[\d.e+]*\ntest score = \d[\d.e+]*\nratio = ", text, re.M)
                assert "a run is INVALID: the comparison does not count" in text
            else:  # 32 queries give LoadGen no early-stopping estimate: it logs 0
                assert "reference score = 0\ntest score = 0\nno comparison: the reference and test runs " \
                       "have no positive score" in text
            for name in PERFORMANCE_FILES:
                assert (where / test / "performance" / "run_1" / name).stat().st_size > 0
            detail = (where / test / "performance" / "run_1" / "mlperf_log_detail.txt").read_text()
            assert "Found Audit Config file" in detail
        assert '"effective_performance_issue_same", "value": true' in \
            (where / "TEST04" / "performance" / "run_1" / "mlperf_log_detail.txt").read_text()
        record = json.loads((where / "submission_steps.json").read_text())["records"]["performance"]
        audits = record["compliance"]
        assert {t: (a["verdict"], a["performance"], a.get("accuracy")) for t, a in audits.items()} == \
            {"TEST01": ("FAIL", "FAIL", "PASS"), "TEST04": ("FAIL", "FAIL", None)}


def test_session_resumes_without_rerunning(session: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Nothing runs, and the verdict is the one the session reached: the earlier audits failed.
    assert run_cli(*_session_args(session)) == 1
    out, err = capfd.readouterr()
    assert out.count("skipped") == 8 and "started" not in out
    assert out.count(", FAIL), skipped") == 4
    assert err.splitlines()[-1] == ("compliance failed: Offline/TEST01, Offline/TEST04, SingleStream/TEST01, "
                                    "SingleStream/TEST04")


def test_redo_runs_the_chosen_step_again_and_only_it(session: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = _session_args(session)
    assert run_cli(*args, "--redo", "SingleStream/TEST05") == 1
    refused = "mlharness: error: --redo SingleStream/TEST05: not a step of this run; expected a scenario or one of: "
    (line,) = [line for line in capfd.readouterr().err.splitlines() if line.startswith(refused)]
    assert set(line.removeprefix(refused).split(", ")) == {f"{scenario}/{step}" for scenario in ("Offline", "SingleStream")
                                                          for step in ("performance", "accuracy", "TEST01", "TEST04")}
    before = {scenario: json.loads((_scenario(session, scenario) / "submission_steps.json").read_text())
              for scenario in ("Offline", "SingleStream")}
    # Two steps named (repeatable): both run again, and fail again.
    assert run_cli(*args, "--redo", "SingleStream/TEST04", "--redo", "Offline/TEST04") == 1
    out, err = capfd.readouterr()
    # The steps that ran again failed again; the skipped ones failed earlier, and still count.
    assert err.splitlines()[-1] == ("compliance failed: Offline/TEST01, Offline/TEST04, SingleStream/TEST01, "
                                    "SingleStream/TEST04")
    assert out.count("skipped") == 6 and re.search(r"SingleStream TEST04: started", out)
    assert re.search(r"Offline TEST04: started", out)
    for scenario in ("Offline", "SingleStream"):
        after = json.loads((_scenario(session, scenario) / "submission_steps.json").read_text())
        ran, earlier = after["records"]["performance"]["compliance"], before[scenario]["records"]["performance"]["compliance"]
        assert ran["TEST04"]["run_id"] != earlier["TEST04"]["run_id"]
        assert ran["TEST01"]["run_id"] == earlier["TEST01"]["run_id"]


def test_package_refuses_invalid_runs_without_allow_invalid(session: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert _package(session, tmp_path / "out") == 1
    assert "not submission-grade" in capsys.readouterr().err
    assert not (tmp_path / "out" / "open").exists()


def test_package_writes_every_required_file_and_field(session: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _package(session, out, "--allow-invalid", "--skip-dataset-size-check", "--system", "tiny-box",
                    "--system-field", "cooling=air") == 0
    base = out / "open" / "Acme"
    # A checkout's layout (harness/running/...), or the package's (running/...) where mlharness runs from a
    # package folder: an installed wheel (test_install.py) or mutation testing's tree.
    code = base / "src" / "mlharness"
    assert (code / "harness" / "running" / "runner.py").is_file() or (code / "running" / "runner.py").is_file()
    assert [p.read_text() for p in (base / "src" / "specs" / "models").glob(f"{MODEL}-*.yaml")] == [
        next((session.parent / "specs" / "models").glob(f"{MODEL}-*.yaml")).read_text()]
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
        assert "--mode accuracy" in readme and "--compliance TEST01,TEST04" in readme
        min_duration = {"Offline": 250, "SingleStream": 0}[scenario]  # --quick, and USER_CONF
        assert f"resnet50.{scenario}.min_duration = {min_duration}" in (where / "user.conf").read_text()
        # accuracy.txt: the official headline, then our figures, then the hash of the full log
        lines = (where / "accuracy" / "accuracy.txt").read_text().splitlines()
        assert HEADLINE.match(lines[0]) and lines[0].startswith("accuracy=50.000%")
        full = out / "full_accuracy_logs" / "open" / "Acme" / "tiny-box" / MODEL / scenario / "mlperf_log_accuracy.json"
        assert lines[-1] == f"hash={hashlib.sha256(full.read_bytes()).hexdigest()}"
        assert full.stat().st_size > MAX_ACCURACY_LOG_SIZE
        assert (where / "accuracy" / "mlperf_log_accuracy.json").stat().st_size <= MAX_ACCURACY_LOG_SIZE
    assert run_cli("submission", "check", out, "--allow-invalid", "--skip-dataset-size-check") == 0


def test_check_reports_an_accuracy_run_on_part_of_the_dataset(session: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path)
    capsys.readouterr()
    assert run_cli("submission", "check", out, "--allow-invalid") == 1
    captured = capsys.readouterr()
    covered = [line for line in captured.err.splitlines() if "dataset samples" in line]
    assert len(covered) == 2 and all("of resnet's 50000 dataset samples" in line for line in covered)
    assert run_cli("submission", "check", out, "--allow-invalid", "--skip-dataset-size-check") == 0
    assert capsys.readouterr().out.count("waived (--skip-dataset-size-check)") == 2


def _packaged(session: Path, tmp_path: Path, division: str = "open") -> Path:
    """The session packaged with --allow-invalid. The check that packaging ends with fails on the
    dataset size (the accuracy runs cover 1024 of resnet's 50000 samples): exit 1, tree written."""
    out = tmp_path / "out"
    assert run_cli("submission", "package", "--division", division, "--submitter", "Acme", "--out", out,
                   "--results-dir", session, "--allow-invalid") == 1
    assert (out / division / "Acme" / "systems").is_dir()
    return out


def test_check_refuses_invalid_and_overridden_runs(session: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path)
    capsys.readouterr()
    assert run_cli("submission", "check", out) == 1
    err = capsys.readouterr().err
    assert re.search(r"Offline/performance/run_1/mlperf_log_detail.txt: LoadGen marked the run INVALID", err)
    assert "min_duration: expected >= 600000 ms, found 250" in err
    assert "overrode protected settings min_duration" in err
    assert re.search(r"SingleStream/performance/run_1/mlperf_log_detail.txt: LoadGen marked the run INVALID", err)


def test_check_passes_a_valid_run_and_flags_an_invalid_one(session: Path, tmp_path: Path) -> None:
    """The session's runs are INVALID by design; a VALID one is needed to show the checker does not
    flag every run. 64 SingleStream queries with no minimum duration are VALID by count alone
    (LoadGen's early stopping needs 64), whatever the machine's speed."""
    assert run_cli("run", "null", "--scenario", "SingleStream", "--quick", "--set", "min_duration=0",
                   "--set", "min_query_count=64", "--results-dir", tmp_path) == 0
    valid = read_run(tmp_path, "null", "SingleStream")
    assert valid["performance"]["result"] == "VALID"
    detail = Path(valid["results_path"]) / "performance" / "run_1" / "mlperf_log_detail.txt"
    assert not [p.message for p in checker.check_performance_log(detail, "SingleStream", BENCHMARKS["resnet"])
                if p.message.startswith(("LoadGen marked", "LoadGen error"))]
    invalid = _scenario(session, "SingleStream") / "performance" / "run_1" / "mlperf_log_detail.txt"
    found = [p.message for p in checker.check_performance_log(invalid, "SingleStream", BENCHMARKS["resnet"])]
    assert any(m.startswith("LoadGen marked the run INVALID") for m in found), found


def test_check_reports_a_missing_and_an_unparsable_system_field(session: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path)
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
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = _packaged(session, tmp_path, "closed")
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
    verdict = compliance.verify_performance(test, detail_log(tmp_path / "r.txt", scenario, key, ref),
                                            detail_log(tmp_path / "t.txt", scenario, key, got))
    assert verdict.passed is passed
    assert verdict.text().rstrip().endswith("TEST PASS" if passed else "TEST FAIL")


def test_performance_verdict_fails_on_an_invalid_run(tmp_path: Path) -> None:
    verdict = compliance.verify_performance(
        "TEST04", detail_log(tmp_path / "r.txt", "Offline", "result_samples_per_second", 100.0, valid=False),
        detail_log(tmp_path / "t.txt", "Offline", "result_samples_per_second", 100.0))
    assert not verdict.passed and "INVALID" in verdict.text()


@pytest.mark.parametrize("division, scenario, samples, flagged", [
    ("closed", "Offline", 24575, True),
    ("closed", "Offline", 24576, False),
    ("open", "Offline", 100, False),             # the floor is a closed-division rule
    ("closed", "SingleStream", 1, False),
])
def test_closed_offline_queries_need_the_benchmarks_minimum_samples(tmp_path: Path, division: str, scenario: str,
                                                                     samples: int, flagged: bool) -> None:
    detail = detail_log(tmp_path / "d.txt", scenario, "effective_samples_per_query", samples)
    found = [p.message for p in checker.check_performance_log(detail, scenario, BENCHMARKS["resnet"], division)]
    assert any("samples_per_query: expected >= 24576 for resnet" in m for m in found) is flagged


def test_run_compliance_flag_rejects_unknown_tests_before_running(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", tmp_path,
                   "--compliance", "TEST05") == 1
    assert "--compliance: expected tests from TEST01, TEST04, got 'TEST05'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_check_waives_nothing_unless_asked_and_counts_every_tree(session: Path, tmp_path: Path) -> None:
    """Two submitters' trees, one no longer marked NOT_FOR_SUBMISSION: check() as an API, with its
    defaults (nothing waived) and with both waivers (the unmarked tree's run problems still count)."""
    out = _packaged(session, tmp_path)
    assert run_cli("submission", "package", "--division", "open", "--submitter", "Other", "--out", out,
                   "--results-dir", session, "--allow-invalid") == 1
    strict = checker.check(out)
    assert not strict.waived and {p.kind for p in strict.problems} >= {"run", "dataset"}
    for submitter in ("Acme", "Other"):
        assert any(submitter in p.path.parts for p in strict.problems if p.kind == "run")
    other = out / "open" / "Other"
    next(other.glob("NOT_FOR_SUBMISSION*")).unlink()
    waived = checker.check(out, allow_invalid=True, skip_dataset_size_check=True)
    assert (other, "--allow-invalid: tree is not marked NOT_FOR_SUBMISSION; its run problems still count", "tree") \
        in [(p.path, p.message, p.kind) for p in waived.problems]
    runs_left = [p for p in waived.problems if p.kind == "run"]
    assert runs_left and all(other in p.path.parents for p in runs_left)
    assert not [p for p in waived.problems if p.kind == "dataset"]
    assert {p.kind for p in waived.waived} == {"run", "dataset"}  # both waivers' problems, said apart


def test_check_names_each_missing_empty_or_unreadable_file(session: Path, tmp_path: Path) -> None:
    out = _packaged(session, tmp_path)
    base = out / "open" / "Acme"
    where = next(base.glob("results/*/*/Offline"))
    (where / "README.md").unlink()
    (where / "user.conf").write_text("")
    (where / "measurements.json").write_text("{cut")
    system = next((base / "systems").glob("*.json"))
    system.unlink()
    found = {(p.path, p.message, p.kind) for p in checker.check(out).problems}
    assert {(where / "README.md", "missing: required file", "tree"),
            (where / "user.conf", "empty: required file must have content", "tree"),
            (where / "measurements.json", "not valid JSON (line 1: Expecting property name enclosed in double quotes): "
                                          "expected measurements.json fields", "tree"),
            (system, "missing: expected the system description (35 fields)", "tree")} <= found
