"""Tests that mutation testing of the submission module (tools/mutation/modules.toml, [submission]) asked
for: each fails with the surviving mutant it names applied and passes without. The compliance
verdicts as the official compliance scripts write them, on the functions themselves, with LoadGen's
log formats written by hand (a few lines each)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord
from mlharness.running.request import RunRequest
from mlharness.submission import accuracy_txt, checker, compliance, packager, runs, session
from mlharness.submission.layout import SubmitterTree, find_trees
from mlharness.submission.rules import BENCHMARKS, COMPLIANCE_FILES, SCENARIOS, benchmark_for, required_scenarios
from tests.support import detail_log, mllog_line, null_model_with, run_cli, scenario_root, sha256


def _accuracy_log(path: Path, *entries: tuple[int, str]) -> Path:
    path.write_text(json.dumps([{"seq_id": i, "qsl_idx": index, "data": data}
                                for i, (index, data) in enumerate(entries)]))
    return path


# ---- TEST01's accuracy check -------------------------------------------------------------------

def test_test01_counts_duplicates_matches_mismatches_and_missing_samples(tmp_path: Path) -> None:
    """The accuracy run logged sample 1 four times (twice with other data), 2 and 5 once each; the audit
    sampled 1 twice (equal), 2 and 5 (different), 7 and 8 (never in the accuracy run)."""
    reference = _accuracy_log(tmp_path / "ref.json", (1, "AA"), (1, "AA"), (1, "BB"), (1, "CC"), (2, "DD"),
                              (5, "GG"))
    sampled = _accuracy_log(tmp_path / "test.json", (1, "AA"), (1, "AA"), (2, "EE"), (5, "HH"), (7, "FF"),
                            (8, "II"))
    verdict = compliance.verify_accuracy(reference, sampled)
    assert verdict.lines == [f"reference accuracy log = {reference}", f"test accuracy log = {sampled}",
                             "num_acc_log_entries = 6", "num_acc_log_duplicate_keys = 3",
                             "num_acc_log_data_mismatch = 2", "num_perf_log_entries = 6",
                             "num_perf_log_qsl_idx_match = 4", "num_perf_log_data_mismatch = 2",
                             "num_missing_qsl_idxs = 2"]
    assert not verdict.passed and verdict.text().endswith("TEST FAIL\n")


def test_test01_passes_on_one_matching_sample_and_labels_the_logs_as_asked(tmp_path: Path) -> None:
    reference = _accuracy_log(tmp_path / "ref.json", (3, "AA"), (4, "BB"))
    verdict = compliance.verify_accuracy(reference, _accuracy_log(tmp_path / "test.json", (3, "AA")),
                                         labels=("accuracy/log", "TEST01/log"))
    assert verdict.passed and verdict.lines[:2] == ["reference accuracy log = accuracy/log",
                                                     "test accuracy log = TEST01/log"]
    assert "num_perf_log_qsl_idx_match = 1" in verdict.lines


def test_test01_fails_on_one_mismatch_among_matches_and_when_nothing_was_sampled(tmp_path: Path) -> None:
    reference = _accuracy_log(tmp_path / "ref.json", (3, "AA"), (4, "BB"))
    one_wrong = compliance.verify_accuracy(reference, _accuracy_log(tmp_path / "t1.json", (3, "AA"), (4, "XX")))
    assert not one_wrong.passed and "num_perf_log_data_mismatch = 1" in one_wrong.lines
    empty = tmp_path / "t2.json"
    empty.write_text("")  # LoadGen leaves the file empty when it sampled nothing
    nothing = compliance.verify_accuracy(reference, empty)
    assert not nothing.passed and "num_perf_log_entries = 0" in nothing.lines


@pytest.mark.parametrize("text, message", [
    ("{not json", "expected LoadGen's accuracy log (a JSON list): Expecting property name"),
    ('{"qsl_idx": 1}', "expected LoadGen's accuracy log (a JSON list), got dict"),
    ('[{"qsl_idx": 1, "data": "AA"}, {"qsl_idx": 2}]', "entry 1: expected {qsl_idx: integer, data: ...}, "
                                                       "got {'qsl_idx': 2}"),
    ('[{"qsl_idx": "2", "data": "AA"}]', "entry 0: expected {qsl_idx: integer, data: ...}, got "),
    ('["' + "x" * 100 + '"]', "entry 0: expected {qsl_idx: integer, data: ...}, got " + "x" * 80),
])
def test_an_unreadable_accuracy_log_is_one_error_naming_the_file_and_entry(tmp_path: Path, text: str,
                                                                          message: str) -> None:
    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text(text)
    with pytest.raises(UserError) as caught:
        compliance.verify_accuracy(log, log)
    assert str(caught.value).startswith(f"{log}: {message}")
    if "x" * 80 in message:
        assert str(caught.value) == f"{log}: {message}"  # cut at 80 characters


# ---- the performance checks' thresholds --------------------------------------------------------

def test_a_reference_rate_exactly_at_the_relaxed_limit_gets_the_relaxed_threshold(tmp_path: Path) -> None:
    """TEST04 on SingleStream compares rates, 1e9 / latency: 5,000 ns is 200,000 a second, the limit
    at and below which the threshold relaxes to 20%; the audit is 13.6% faster."""
    verdict = compliance.verify_performance(
        "TEST04", detail_log(tmp_path / "r.txt", "SingleStream", "early_stopping_latency_ss", 5000),
        detail_log(tmp_path / "t.txt", "SingleStream", "early_stopping_latency_ss", 4400))
    assert "threshold = 20%" in verdict.lines and verdict.passed


# ---- the checker's compliance folders ----------------------------------------------------------

def _audit_folder(folder: Path, test: str, **verdicts: str) -> Path:
    """A compliance folder with every file `test` needs, non-empty; verify_*.txt say TEST PASS unless
    `verdicts` gives their text. The detail log is left out: its own checks are another function's."""
    for name in COMPLIANCE_FILES[test]:
        if not name.endswith("mlperf_log_detail.txt"):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(verdicts.get(name.split(".")[0], "TEST PASS\n"))
    return folder


def _problems(found: list[checker.Problem]) -> list[tuple[Path, str, str]]:
    return [(p.path, p.message, p.kind) for p in found]


def test_a_missing_compliance_folder_is_one_problem_naming_the_test_and_benchmark(tmp_path: Path) -> None:
    found = checker.check_compliance(tmp_path / "TEST01", "TEST01", "Offline", benchmark_for("resnet"))
    assert _problems(found) == [(tmp_path / "TEST01", "missing: closed division needs TEST01 for resnet", "compliance")]


def test_each_missing_or_empty_compliance_file_is_a_compliance_problem(tmp_path: Path) -> None:
    folder = _audit_folder(tmp_path / "TEST01", "TEST01")
    (folder / "accuracy" / "mlperf_log_accuracy.json").unlink()
    (folder / "performance" / "run_1" / "mlperf_log_summary.txt").write_text("")
    found = checker.check_compliance(folder, "TEST01", "Offline", benchmark_for("resnet"))
    assert _problems(found) == [
        (folder / "performance" / "run_1" / "mlperf_log_summary.txt", "empty: required file must have content",
         "compliance"),
        (folder / "performance" / "run_1" / "mlperf_log_detail.txt", "missing: required file", "compliance"),
        (folder / "accuracy" / "mlperf_log_accuracy.json", "missing: required file", "compliance")]


def test_a_verdict_without_test_pass_fails_only_for_the_files_the_test_writes(tmp_path: Path) -> None:
    """TEST01 writes both verdicts; TEST04 only verify_performance.txt, so a verify_accuracy.txt left in
    its folder is not its verdict."""
    test01 = _audit_folder(tmp_path / "TEST01", "TEST01", verify_accuracy="TEST FAIL\n",
                           verify_performance="TEST FAIL\n")
    test04 = _audit_folder(tmp_path / "TEST04", "TEST04")
    (test04 / "verify_accuracy.txt").write_text("TEST FAIL\n")
    resnet = benchmark_for("resnet")
    failed = [p for p in _problems(checker.check_compliance(test01, "TEST01", "Offline", resnet)) if "pass" in p[1]]
    assert failed == [(test01 / "verify_accuracy.txt", "TEST01 did not pass (no 'TEST PASS' line)", "compliance"),
                      (test01 / "verify_performance.txt", "TEST01 did not pass (no 'TEST PASS' line)", "compliance")]
    assert not [p for p in checker.check_compliance(test04, "TEST04", "Offline", resnet) if "pass" in p.message]


def test_a_verdict_file_with_bytes_that_are_not_utf8_is_read_not_refused(tmp_path: Path) -> None:
    folder = _audit_folder(tmp_path / "TEST04", "TEST04")
    (folder / "verify_performance.txt").write_bytes(b"test = caf\xe9\nTEST PASS\n")
    assert not [p for p in checker.check_compliance(folder, "TEST04", "Offline", benchmark_for("resnet"))
                if "pass" in p.message]


def test_the_audits_detail_log_is_checked_as_a_compliance_run_beside_the_missing_files(tmp_path: Path) -> None:
    """The audit runs with its own audit.config beside user.conf: LoadGen's error about several conf
    files is expected there and tolerated; any other error, and a log of another scenario, are not."""
    folder = _audit_folder(tmp_path / "TEST01", "TEST01")
    (folder / "accuracy" / "mlperf_log_accuracy.json").unlink()
    (folder / "performance" / "run_1" / "mlperf_log_detail.txt").write_text(
        mllog_line("error_invalid_config", "Multiple conf files are used", is_error=True)
        + mllog_line("error_runtime", "a sample went missing", is_error=True) + mllog_line("effective_scenario", "Server"))
    detail = folder / "performance" / "run_1" / "mlperf_log_detail.txt"
    found = _problems(checker.check_compliance(folder, "TEST01", "Offline", benchmark_for("resnet")))
    assert found[0] == (folder / "accuracy" / "mlperf_log_accuracy.json", "missing: required file", "compliance")
    assert (detail, "LoadGen error: error_runtime: a sample went missing", "run") in found
    assert (detail, "log is for scenario Server, folder says Offline", "tree") in found
    assert not [p for p in found if "Multiple conf files" in p[1]]


# ---- rules, records, the session's steps --------------------------------------------------------

def test_the_scenarios_a_system_type_requires() -> None:
    unet = benchmark_for("3d-unet-99")
    assert required_scenarios(unet, "edge") == ("SingleStream", "Offline")
    assert required_scenarios(unet, "datacenter") == ("Offline",)
    assert required_scenarios(unet, "datacenter,edge") == ("SingleStream", "Offline")  # both, each once
    # A benchmark whose datacenter scenarios are not all edge ones (as in rounds before this table).
    served = dataclasses.replace(unet, datacenter_scenarios=("Server", "Offline"))
    assert required_scenarios(served, "edge") == ("SingleStream", "Offline")
    assert required_scenarios(served, "edge,datacenter") == ("SingleStream", "Offline", "Server")


def test_an_unreadable_steps_file_is_one_error_naming_it(tmp_path: Path) -> None:
    scenario_dir = tmp_path / "results" / "box" / "null" / "Offline"
    scenario_dir.mkdir(parents=True)
    (scenario_dir / runs.STEPS_FILE).write_text("{cut")
    with pytest.raises(UserError) as caught:
        runs.candidate_records(tmp_path / "results", scenario_dir)
    assert str(caught.value).startswith(f"{scenario_dir / runs.STEPS_FILE}: cannot read run record: Expecting")


@pytest.mark.parametrize("step, output", [
    ("performance", "performance/run_1/mlperf_log_summary.txt"),
    ("accuracy", "accuracy/mlperf_log_accuracy.json"),
    ("TEST01", "TEST01"),
])
def test_a_done_step_counts_as_done_only_while_its_output_is_there(tmp_path: Path, step: str, output: str) -> None:
    assert not session._step_output_exists(tmp_path, step)
    for other in ("performance/run_1/mlperf_log_detail.txt", "performance/mlperf_log_summary.txt", "TEST04",
                  "accuracy/accuracy.txt"):
        (tmp_path / other).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / other).write_text("x")
    assert not session._step_output_exists(tmp_path, step)
    (tmp_path / output).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / output).write_text("x")
    assert session._step_output_exists(tmp_path, step)


def test_an_audit_is_expected_to_take_as_long_as_its_scenarios_performance_run() -> None:
    """The progress line's estimate: an audit or accuracy step as long as the measured performance
    step; the performance step itself, or any step before a measurement, the full length plus 10%."""
    state = {"steps": {"Offline/performance": {"status": "done", "seconds": 42.5},
                       "Server/performance": {"status": "failed"}}}
    assert session._expected_seconds(state, "Offline", "TEST01") == 42.5
    assert session._expected_seconds(state, "Offline", "performance") == pytest.approx(660)
    assert session._expected_seconds(state, "Server", "TEST04") == pytest.approx(660)
    assert session._expected_seconds(state, "SingleStream", "TEST04") == pytest.approx(660)


def test_audit_config_text_names_its_test_then_each_key() -> None:
    assert compliance.audit_config_text("TEST04").splitlines() == [
        "# TEST04 audit.config written by mlharness (keys as in mlcommons/inference compliance/TEST04)",
        "*.*.mode = 2", "*.*.performance_issue_unique = 0", "*.*.performance_issue_same = 1",
        "*.*.performance_issue_same_index = 3"]


def test_an_audit_without_the_logs_it_compares_with_is_refused_naming_the_missing_log(tmp_path: Path) -> None:
    """Refused before anything runs (no request is needed to get there)."""
    root = tmp_path / "results" / "box" / "null" / "Offline"
    run_dir = root / "runs" / "20260101T000000Z-abcdef"
    run_dir.mkdir(parents=True)
    detail = run_dir / "performance" / "run_1" / "mlperf_log_detail.txt"
    with pytest.raises(UserError) as caught:
        compliance.run_audit(None, "TEST04", run_dir)
    assert str(caught.value) == f"{detail}: missing: TEST04 compares with the performance run; run it first"
    detail.parent.mkdir(parents=True)
    detail.write_text(mllog_line("effective_scenario", "Offline"))
    with pytest.raises(UserError) as caught:
        compliance.run_audit(None, "TEST01", run_dir)
    assert str(caught.value) == (f"{root / 'accuracy' / 'mlperf_log_accuracy.json'}: missing: TEST01 compares with "
                                 f"the accuracy run; run --mode accuracy (or submission) first")
    assert sorted(p.name for p in run_dir.iterdir()) == ["performance"]  # nothing staged


def test_an_audit_compares_with_its_runs_own_accuracy_log_and_stages_in_the_runs_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real submission-mode run, then its TEST01 audit. The scenario's view is given another accuracy
    log: the audit must compare with the run's own. The system's temp folder is put on another
    filesystem where there is one (tmpfs /dev/shm): staging the audit there, not in the run's folder,
    would fail the final rename into the run's folder."""
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "submission", "--quick", "--set", "target_qps=10",
                   "--results-dir", results) == 0
    root = scenario_root(results, "null", "Offline")
    run_dir = Path(json.loads((root / "run.json").read_text())["results_path"])
    view_log = root / "accuracy" / "mlperf_log_accuracy.json"
    entries = json.loads(view_log.read_text())
    view_log.unlink()  # not written through: the view's file may share the run's
    view_log.write_text(json.dumps([dict(entry, data="FF") for entry in entries]))
    shm = Path("/dev/shm")
    elsewhere = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(elsewhere))
        request = RunRequest(model="null", scenario="Offline", quick=True, overrides=("target_qps=10",),
                             results_dir=results)
        outcome = compliance.run_audit(request, "TEST01", run_dir)
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    # The quick run is INVALID on any machine (see test_cli_run's audits): the comparison fails.
    assert (outcome["accuracy"], outcome["performance"], outcome["verdict"]) == ("PASS", "FAIL", "FAIL")
    assert outcome["performance_detail"][0].startswith("reference score = ")
    verdict = (run_dir / "TEST01" / "verify_accuracy.txt").read_text()
    assert "num_perf_log_data_mismatch = 0\n" in verdict and "num_perf_log_qsl_idx_match = 0\n" not in verdict
    # The logs named as the folder holds them, not by this machine's paths.
    assert verdict.splitlines()[:2] == ["reference accuracy log = accuracy/mlperf_log_accuracy.json",
                                        "test accuracy log = TEST01/accuracy/mlperf_log_accuracy.json"]


def test_an_audit_whose_run_fails_says_which_audit_and_files_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "results" / "box" / "null" / "Offline" / "runs" / "20260101T000000Z-abcdef"
    detail = run_dir / "performance" / "run_1" / "mlperf_log_detail.txt"
    detail.parent.mkdir(parents=True)
    detail.write_text(mllog_line("effective_scenario", "Offline"))
    request = RunRequest(model="no-such-model", scenario="Offline", quick=True, results_dir=tmp_path / "results")
    with pytest.raises(UserError) as caught:
        compliance.run_audit(request, "TEST04", run_dir)
    assert str(caught.value).startswith("TEST04 audit run failed: ") and "no-such-model" in str(caught.value)
    assert sorted(p.name for p in run_dir.iterdir()) == ["performance"]


def test_the_audits_outcomes_are_printed_a_line_each_with_their_scores() -> None:
    detail = ["reference score = 100", "test score = 95", "ratio = 0.9500", "threshold = 10%"]
    outcomes = {"TEST01": {"accuracy": "PASS", "performance": "FAIL", "verdict": "FAIL", "performance_detail": detail},
                "TEST04": {"performance": "PASS", "verdict": "PASS", "performance_detail": detail[:1]}}
    assert compliance.format_outcomes(outcomes).splitlines() == [
        "  TEST01 : FAIL (accuracy PASS, performance FAIL)", "    reference score = 100", "    test score = 95",
        "  TEST04 : PASS (performance PASS)", "    reference score = 100"]


@pytest.mark.parametrize("performance, accuracy, expected", [
    (True, None, {"performance": "PASS", "verdict": "PASS"}),
    (False, None, {"performance": "FAIL", "verdict": "FAIL"}),
    (True, True, {"performance": "PASS", "accuracy": "PASS", "verdict": "PASS"}),
    (True, False, {"performance": "PASS", "accuracy": "FAIL", "verdict": "FAIL"}),
    (False, True, {"performance": "FAIL", "accuracy": "PASS", "verdict": "FAIL"}),
])
def test_an_audit_passes_only_when_each_of_its_checks_passes(performance: bool, accuracy: bool | None,
                                                            expected: dict[str, str]) -> None:
    lines = ["reference = a", "test = b", "scenario = Offline", "reference score = 100", "test score = 99"]
    outcome = compliance.audit_outcome("20260101T000000Z-abcdef", compliance.Verdict(performance, lines),
                                       None if accuracy is None else compliance.Verdict(accuracy, []))
    assert outcome == {"run_id": "20260101T000000Z-abcdef", "performance_detail": lines[3:], **expected}


def test_a_finished_audit_folder_replaces_the_old_one_and_a_leftover_from_a_crash(tmp_path: Path) -> None:
    staged, target = tmp_path / ".work" / "TEST04", tmp_path / "TEST04"
    for folder, name in ((staged, "new.txt"), (target, "old.txt"), (tmp_path / ".TEST04.old", "crash.txt")):
        folder.mkdir(parents=True)
        (folder / name).write_text(name)
    compliance._replace_dir(staged, target)
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert not (tmp_path / ".TEST04.old").exists() and not staged.exists()


def test_a_detail_log_without_a_scenario_or_a_numeric_figure_has_no_score(tmp_path: Path) -> None:
    bare = tmp_path / "bare.txt"
    bare.write_text(mllog_line("result_validity", "VALID"))
    assert compliance.run_score(bare) == ("", None, True)
    flagged = tmp_path / "flag.txt"  # a figure logged as true/false is not a number, as in the official checker
    flagged.write_text(mllog_line("effective_scenario", "Offline") + mllog_line("result_samples_per_second", True))
    assert compliance.run_score(flagged) == ("Offline", None, False)


def test_a_performance_verdict_names_each_log_with_its_validity(tmp_path: Path) -> None:
    ref = detail_log(tmp_path / "r.txt", "Offline", "result_samples_per_second", 100.0)
    got = detail_log(tmp_path / "t.txt", "Offline", "result_samples_per_second", 100.0, valid=False)
    verdict = compliance.verify_performance("TEST04", ref, got)
    assert verdict.lines[:3] == [f"reference = {ref} (VALID)", f"test = {got} (INVALID)", "scenario = Offline"]


# ---- audit outcomes recorded on the audited run ------------------------------------------------

TEST04_OUTCOME = {"TEST04": {"run_id": "20260101T000009Z-aaaaaa", "performance": "FAIL",
                             "performance_detail": [], "verdict": "FAIL"}}


def _run_folder(root: Path, run_id: str, mode: str) -> Path:
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    record = RunRecord(run_id=run_id, command="mlharness run null", model={"name": "null"}, dataset={},
                       backend="null", scenario="Offline", mode=mode, status="ok", results_path=str(run_dir))
    (run_dir / "run.json").write_text(json.dumps(record.to_dict()))
    return run_dir


@pytest.mark.parametrize("mode", ["performance", "submission"])
def test_audit_outcomes_go_on_the_performance_run_they_audited(tmp_path: Path, mode: str) -> None:
    run_dir = _run_folder(tmp_path / "box" / "null" / "Offline", "20260101T000000Z-abcdef", mode)
    recorded = compliance.record_outcomes(run_dir, TEST04_OUTCOME)
    assert recorded is not None and recorded["compliance"] == TEST04_OUTCOME
    assert RunRecord.load(run_dir / "run.json").compliance == TEST04_OUTCOME


def test_audit_outcomes_are_not_put_on_an_accuracy_run_or_a_folder_without_a_record(tmp_path: Path) -> None:
    run_dir = _run_folder(tmp_path / "box" / "null" / "Offline", "20260101T000000Z-abcdef", "accuracy")
    before = (run_dir / "run.json").read_text()
    assert compliance.record_outcomes(run_dir, TEST04_OUTCOME) is None
    assert (run_dir / "run.json").read_text() == before
    empty = tmp_path / "box" / "null" / "Offline" / "runs" / "20260101T000001Z-bbbbbb"
    empty.mkdir()
    assert compliance.record_outcomes(empty, TEST04_OUTCOME) is None


def test_a_sessions_record_gets_the_outcomes_and_another_runs_record_in_the_folder_is_left_alone(
        tmp_path: Path) -> None:
    """`submission run` passes the audited run's record: the run.json in the folder is written only
    when it is that run's."""
    root = tmp_path / "box" / "null" / "Offline"
    run_dir = _run_folder(root, "20260101T000000Z-abcdef", "performance")
    other = json.loads((_run_folder(root, "20260101T000002Z-cccccc", "performance") / "run.json").read_text())
    before = (run_dir / "run.json").read_text()
    recorded = compliance.record_outcomes(run_dir, TEST04_OUTCOME, record=other)
    assert recorded is not None and recorded["run_id"] == other["run_id"] and recorded["compliance"] == TEST04_OUTCOME
    assert (run_dir / "run.json").read_text() == before


def test_a_sessions_record_that_does_not_read_is_one_error_naming_it(tmp_path: Path) -> None:
    run_dir = _run_folder(tmp_path / "box" / "null" / "Offline", "20260101T000000Z-abcdef", "performance")
    with pytest.raises(UserError, match="^the audited run's record: "):
        compliance.record_outcomes(run_dir, TEST04_OUTCOME, record={"schema_version": 99})


# ---- the performance comparison, line by line and at its boundaries ----------------------------

def test_a_test04_latency_verdict_compares_rates_and_says_each_step(tmp_path: Path) -> None:
    ref = detail_log(tmp_path / "r.txt", "SingleStream", "early_stopping_latency_ss", 5000)
    got = detail_log(tmp_path / "t.txt", "SingleStream", "early_stopping_latency_ss", 4000)
    verdict = compliance.verify_performance("TEST04", ref, got)
    assert verdict.lines == [f"reference = {ref} (VALID)", f"test = {got} (VALID)", "scenario = SingleStream",
                             "reference score = 200000", "test score = 250000", "ratio = 1.2500", "threshold = 20%",
                             "rule: test score < reference score x 1.20"]
    assert verdict.passed is False


@pytest.mark.parametrize("test, got, passed", [
    ("TEST04", 100 * (1 + 0.10), False),  # the audit may not be 10% faster: exactly 10% fails
    ("TEST01", 100 * (1 - 0.10), True),   # within ±10%, both ends included, as the official script has it
    ("TEST01", 100 * (1 + 0.10), True),
    ("TEST01", 111.0, False),
])
def test_performance_verdicts_at_the_thresholds_edges(tmp_path: Path, test: str, got: float, passed: bool) -> None:
    verdict = compliance.verify_performance(
        test, detail_log(tmp_path / "r.txt", "Offline", "result_samples_per_second", 100.0),
        detail_log(tmp_path / "t.txt", "Offline", "result_samples_per_second", got))
    assert verdict.passed is passed and f"test score = {got:.6g}" in verdict.lines


def test_scores_under_one_are_compared(tmp_path: Path) -> None:
    verdict = compliance.verify_performance(
        "TEST01", detail_log(tmp_path / "r.txt", "Offline", "result_samples_per_second", 0.5),
        detail_log(tmp_path / "t.txt", "Offline", "result_samples_per_second", 0.5))
    assert verdict.passed is True and "ratio = 1.0000" in verdict.lines


def test_one_invalid_run_fails_the_comparison_and_says_so(tmp_path: Path) -> None:
    verdict = compliance.verify_performance(
        "TEST01", detail_log(tmp_path / "r.txt", "Offline", "result_samples_per_second", 100.0),
        detail_log(tmp_path / "t.txt", "Offline", "result_samples_per_second", 100.0, valid=False))
    assert verdict.passed is False and verdict.lines[-1] == "a run is INVALID: the comparison does not count"


def test_a_missing_score_or_another_scenario_is_a_failed_verdict_with_the_reason(tmp_path: Path) -> None:
    ref = detail_log(tmp_path / "r.txt", "Offline", "result_samples_per_second", 100.0)
    bare = tmp_path / "bare.txt"
    bare.write_text(mllog_line("effective_scenario", "Offline") + mllog_line("result_validity", "VALID"))
    missing = compliance.verify_performance("TEST04", ref, bare)
    assert missing.passed is False and missing.lines[3:] == ["score missing from a detail log"]
    other = detail_log(tmp_path / "t.txt", "SingleStream", "early_stopping_latency_ss", 5000)
    differ = compliance.verify_performance("TEST04", ref, other)
    assert differ.passed is False and differ.lines[3:] == ["scenarios differ: Offline vs SingleStream"]
    zero = compliance.verify_performance("TEST04", ref, detail_log(tmp_path / "z.txt", "Offline",
                                                                "result_samples_per_second", 0))
    assert zero.passed is False and zero.lines[-1].startswith("no comparison: the test run has no positive score")


def test_a_problem_is_said_relative_to_the_tree_it_is_in(tmp_path: Path) -> None:
    problem = checker.Problem(tmp_path / "open" / "Acme" / "systems" / "box.json", "missing: required file")
    assert problem.line(tmp_path / "open" / "Acme") == "systems/box.json: missing: required file"
    assert problem.line() == f"{tmp_path}/open/Acme/systems/box.json: missing: required file"
    assert problem.line(tmp_path / "closed") == f"{tmp_path}/open/Acme/systems/box.json: missing: required file"


def test_the_accuracy_hash_is_read_from_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    accuracy = tmp_path / "accuracy.txt"
    accuracy.write_bytes(b"top1 = caf\xe9\nhash=0a1B\n")
    assert accuracy_txt.read_hash(accuracy) == "0a1B"


def test_an_empty_submitter_folder_is_three_problems_one_per_missing_folder(tmp_path: Path) -> None:
    tree = SubmitterTree(tmp_path, "open", "Acme")
    tree.base.mkdir(parents=True)
    assert _problems(checker.check_tree(tree)) == [
        (tree.src, "missing: src/ must hold the code that ran", "tree"),
        (tree.systems, "missing: systems/ must hold <system>.json per system", "tree"),
        (tree.results, "missing: results/ holds the runs", "tree")]


def test_a_required_file_is_reported_once_and_said_to_be_missing_or_empty(tmp_path: Path) -> None:
    problems: list[checker.Problem] = []
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "full.txt").write_text("x")
    found = [checker._nonempty_file(tmp_path / name, problems, "run") for name in ("gone.txt", "empty.txt", "full.txt")]
    assert found == [False, False, True]
    assert _problems(problems) == [(tmp_path / "gone.txt", "missing: required file", "run"),
                                   (tmp_path / "empty.txt", "empty: required file must have content", "run")]


def test_unknown_benchmark_and_scenario_folders_are_named_with_what_was_expected(tmp_path: Path) -> None:
    tree = SubmitterTree(tmp_path, "open", "Acme")
    for folder in (tree.src, tree.systems, tree.results / "box" / "no-such-bench",
                   tree.results / "box" / "resnet" / "Bogus"):
        folder.mkdir(parents=True)
    found = _problems(checker.check_tree(tree))
    names = ", ".join(BENCHMARKS)
    assert (tree.results / "box" / "no-such-bench", f"unknown benchmark folder 'no-such-bench': expected one of "
            f"{names}, an alias, or a model_mapping.json entry", "tree") in found
    assert (tree.results / "box" / "resnet" / "Bogus",
            "unknown scenario: expected one of " + ", ".join(SCENARIOS), "tree") in found


ALIAS = "resnet50"  # an alias the rules know for resnet


def test_a_closed_division_benchmark_folder_must_have_the_official_name(tmp_path: Path) -> None:
    for division in ("closed", "open"):
        tree = SubmitterTree(tmp_path, division, "Acme")
        for folder in (tree.src, tree.systems, tree.results / "box" / ALIAS, tree.results / "box" / "resnet"):
            folder.mkdir(parents=True, exist_ok=True)
        named = [p for p in _problems(checker.check_tree(tree)) if "official name" in p[1]]
        assert named == ([(tree.results / "box" / ALIAS, "closed division: the folder must be the official name "
                                                         "'resnet'", "tree")] if division == "closed" else [])


@pytest.mark.parametrize("system_type, needed", [
    ("datacenter", None),                # 3d-unet's datacenter scenario is Offline alone
    ("edge", "closed division: edge systems need scenarios SingleStream for 3d-unet-99"),
    (None, "closed division: systems without a system_type (edge and datacenter together) need scenarios "
           "SingleStream for 3d-unet-99"),
])
def test_a_closed_system_needs_the_scenarios_of_its_type(tmp_path: Path, system_type: str | None,
                                                         needed: str | None) -> None:
    tree = SubmitterTree(tmp_path, "closed", "Acme")
    for folder in (tree.src, tree.results / "box" / "3d-unet-99" / "Offline", tree.results / "box" / "3d-unet-99" / "Bogus"):
        folder.mkdir(parents=True)
    tree.systems.mkdir()
    tree.system_json("box").write_text(json.dumps({} if system_type is None else {"system_type": system_type}))
    found = _problems(checker.check_tree(tree))
    bench = tree.results / "box" / "3d-unet-99"
    assert [p for p in found if p[2] == "scenarios"] == ([] if needed is None else [(bench, needed, "scenarios")])
    # The unknown folder sorts before Offline, which is still checked after it.
    assert any(bench / "Offline" in p[0].parents or p[0].parent == bench / "Offline" for p in found)


def test_every_missing_scenario_is_named_and_a_broken_model_mapping_is_one_problem(tmp_path: Path) -> None:
    tree = SubmitterTree(tmp_path, "closed", "Acme")
    for folder in (tree.src, tree.results / "box" / "resnet" / "Offline"):
        folder.mkdir(parents=True)
    tree.systems.mkdir()
    tree.system_json("box").write_text(json.dumps({"system_type": "edge"}))
    tree.model_mapping.write_text("{cut")
    found = _problems(checker.check_tree(tree))
    assert [p for p in found if p[2] == "scenarios"] == [
        (tree.results / "box" / "resnet", "closed division: edge systems need scenarios SingleStream, MultiStream "
                                          "for resnet", "scenarios")]
    assert (tree.model_mapping, "not valid JSON (line 1: Expecting property name enclosed in double quotes): "
                                "expected a JSON object: folder name -> benchmark", "tree") in found


@pytest.mark.parametrize("division, mapping, expected", [
    ("open", "[1, 2]", ["expected a JSON object: folder name -> benchmark"]),
    ("closed", "{}", ["closed division: model_mapping.json is for the open division"]),
    ("open", "{}", []),
    ("open", '{"mine": "nope", "yours": 3, "ours": "resnet"}',
     [f"mine: maps to 'nope', expected one of {', '.join(BENCHMARKS)}",
      f"yours: maps to 3, expected one of {', '.join(BENCHMARKS)}"]),
])
def test_a_model_mapping_must_be_an_object_and_only_in_the_open_division(tmp_path: Path, division: str, mapping: str,
                                                                         expected: list[str]) -> None:
    tree = SubmitterTree(tmp_path, division, "Acme")
    for folder in (tree.src, tree.systems, tree.results):
        folder.mkdir(parents=True)
    tree.model_mapping.write_text(mapping)
    assert _problems(checker.check_tree(tree)) == [(tree.model_mapping, message, "tree") for message in expected]


def test_the_accuracy_check_reads_the_official_line_and_holds_a_closed_run_to_the_target(tmp_path: Path) -> None:
    """accuracy.txt's official line is read past bytes that are not UTF-8; without one, one problem naming the
    file and the format; a closed run exactly at its benchmark's target passes, one below it does not."""
    resnet = benchmark_for("resnet50")
    folder = tmp_path / "accuracy"
    folder.mkdir()
    log = folder / "mlperf_log_accuracy.json"
    log.write_text("[]\n")
    txt = folder / "accuracy.txt"
    hash_line = f"hash={hashlib.sha256(log.read_bytes()).hexdigest()}\n".encode()
    closed = SubmitterTree(tmp_path, "closed", "Acme")

    def problems(value: str | None) -> list[tuple[Path, str]]:
        line = f"accuracy={value}%, good=1, total=1\n".encode() if value is not None else b""
        txt.write_bytes(b"\xff\xfe not UTF-8\n" + line + hash_line)
        return [(p.path, p.message) for p in checker.check_accuracy(closed, folder, resnet) if p.path == txt]

    assert problems(None) == [(txt, "no acc line in the official format (e.g. 'accuracy=76.500%, good=38250, "
                                    "total=50000')")]
    assert problems(repr(resnet.accuracy_target)) == []
    below = problems("75.5")
    assert below == [(txt, "closed division: accuracy 75.5 is below resnet's target 75.695 (99% of the reference)")]


@pytest.mark.parametrize("view, said", [
    ({"note": "no accuracy/: the newest accuracy run r2 differs"}, "no accuracy/: the newest accuracy run r2 differs"),
    ({"note": "another note"}, None), ({"note": 5}, None), ({}, None), (["not", "an", "object"], None), (None, None)])
def test_a_missing_accuracy_run_is_explained_only_by_the_views_own_no_accuracy_note(tmp_path: Path, view: object,
                                                                                   said: str | None) -> None:
    if view is not None:  # None: no view file at all
        (tmp_path / packager.VIEW_FILE).write_text(json.dumps(view))
    assert packager._view_note(tmp_path) == said


def test_the_accuracy_logs_hash_is_checked_against_the_full_log_else_a_truncated_one(tmp_path: Path) -> None:
    """accuracy.txt's hash line: missing, one problem; checked against the full accuracy log kept beside the
    tree when there is one, else against the accuracy log itself while that is within the size the checker
    allows (a larger one is a problem of its own, its hash not checked)."""
    resnet = benchmark_for("resnet50")
    tree = SubmitterTree(tmp_path / "tree", "closed", "Acme")
    folder = tree.base / "results" / "sys1" / "resnet" / "Offline" / "accuracy"
    folder.mkdir(parents=True)
    txt, log = folder / "accuracy.txt", folder / "mlperf_log_accuracy.json"
    full = tree.full_accuracy_log("sys1", "resnet", "Offline")

    def problems(log_bytes: bytes, hashed: bytes | None) -> list[tuple[Path, str, str]]:
        log.write_bytes(log_bytes)
        hash_line = f"hash={hashlib.sha256(hashed).hexdigest()}\n" if hashed is not None else ""
        txt.write_text(f"accuracy={resnet.accuracy_target!r}%, good=1, total=1\n{hash_line}")
        return [(p.path, p.message, p.kind) for p in checker.check_accuracy(tree, folder, resnet)
                if p.path in (txt, log)]

    limit = checker.MAX_ACCURACY_LOG_SIZE
    assert problems(b"[]\n", None) == [(txt, "no 'hash=<sha256 of the accuracy log>' line", "tree")]
    assert problems(b"[]\n", b"[]\n") == []
    assert problems(b"[]\n", b"[1]\n") == [(txt, "hash does not match the full accuracy log "
                                                 "mlperf_log_accuracy.json", "tree")]
    at_limit = b"x" * limit
    assert problems(at_limit, at_limit) == [] and problems(at_limit, b"[]\n")[0][1].startswith("hash does not")
    over = b"x" * (limit + 1)
    assert problems(over, b"[]\n") == [(log, f"not truncated: {limit + 1} bytes, the checker allows {limit}", "tree")]
    full.parent.mkdir(parents=True)
    full.write_bytes(b"[the full log]\n")  # kept apart: the hash is the full log's, whatever the truncated one holds
    assert problems(b"[]\n", b"[the full log]\n") == []
    assert problems(b"[]\n", b"[]\n") == [(txt, f"hash does not match the full accuracy log {full.name}", "tree")]


def test_a_closed_run_below_its_target_is_an_accuracy_problem_and_the_detail_logs_errors_are_the_runs(
        tmp_path: Path) -> None:
    """A closed run below its target is filed as an accuracy problem; a LoadGen error in the accuracy run's
    detail log as a problem of the run."""
    resnet = benchmark_for("resnet50")
    folder = tmp_path / "acc"
    folder.mkdir()
    (folder / "mlperf_log_accuracy.json").write_text("[]\n")
    (folder / "accuracy.txt").write_text("accuracy=10%, good=1, total=10\n")
    (folder / "mlperf_log_detail.txt").write_text(mllog_line("error_runtime", "a LoadGen error", is_error=True))
    found = {(p.path.name, p.kind)
             for p in checker.check_accuracy(SubmitterTree(tmp_path, "closed", "A"), folder, resnet)}
    assert {("accuracy.txt", "accuracy"), ("mlperf_log_detail.txt", "run")} <= found


def test_the_trees_to_check_are_found_from_the_root_a_division_or_a_submitter_folder(tmp_path: Path) -> None:
    for folder in ("open/Acme", "open/Beta", "closed/Acme"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "open" / "notes.txt").write_text("a file, not a submitter\n")
    everything = [SubmitterTree(tmp_path, "closed", "Acme"), SubmitterTree(tmp_path, "open", "Acme"),
                  SubmitterTree(tmp_path, "open", "Beta")]
    assert find_trees(tmp_path) == everything
    assert find_trees(tmp_path / "open") == everything[1:]
    assert find_trees(tmp_path / "open" / "Beta") == [SubmitterTree(tmp_path, "open", "Beta")]
    with pytest.raises(UserError) as caught:
        find_trees(tmp_path / "nowhere")
    assert str(caught.value) == f"{tmp_path / 'nowhere'}: no such submission folder"
    (tmp_path / "other").mkdir()
    with pytest.raises(UserError) as caught:
        find_trees(tmp_path / "other")
    assert str(caught.value) == f"{tmp_path / 'other'}: expected open/<submitter>/ or closed/<submitter>/ folders"


def _record(mode: str, **fields: object) -> RunRecord:
    """A finished LoadGen record of the null model (what packaging reads of it, set by the test)."""
    base: dict = {"run_id": f"run-{mode}", "command": f"mlharness run null --mode {mode}",
                  "model": {"name": "null", "version": "1.0.0", "sha256": "a" * 64}, "dataset": {},
                  "backend": "null", "scenario": "Offline", "mode": mode, "status": "ok", "started_at": "T0"}
    return RunRecord(**(base | fields))


@pytest.mark.parametrize("benchmark, official", [("resnet", "resnet"), ("resnet50", "resnet"), ("bogus", None),
                                                 (None, None)])
def test_a_runs_benchmark_is_its_model_manifests_official_name_or_alias(tmp_path: Path, benchmark: str | None,
                                                                        official: str | None) -> None:
    model = {"name": "null", "path": str(null_model_with(tmp_path, benchmark=benchmark))}
    assert packager._benchmark_of(_record("performance", model=model)) == official


def test_a_run_without_a_record_or_its_model_manifest_has_no_benchmark(tmp_path: Path) -> None:
    """Packaging logs without a record, or a record whose model manifest is gone, maps no benchmark
    (the closed division then refuses it by name) rather than failing on the missing file."""
    assert packager._benchmark_of(None) is None
    assert packager._benchmark_of(_record("performance", model={"name": "null"})) is None
    gone = {"name": "null", "path": str(tmp_path / "moved-away.yaml")}
    assert packager._benchmark_of(_record("performance", model=gone)) is None


def test_the_packaged_user_conf_is_rebuilt_from_the_performance_runs_settings(tmp_path: Path) -> None:
    """What the performance run applied, from its record: the scenario folder's user.conf may be a later
    run's. Without the settings in the record (or without a record), the folder's copy."""
    (tmp_path / "user.conf").write_text("# the folder's copy, a later run's\n")
    settings = {"scenario": "Offline", "mode": "performance", "conf_model": "resnet50",
                "loadgen": {"target_qps": "40", "min_duration": "250"}, "layers": ["mlperf.conf", "model", "preset:quick"]}
    scenario_runs = runs.ScenarioRuns("null", "Offline", tmp_path, performance=_record("performance", settings=settings))
    assert packager._user_conf(scenario_runs) == ("# written by mlharness: layers mlperf.conf < model < preset:quick\n"
                                                  "resnet50.Offline.min_duration = 250\n"
                                                  "resnet50.Offline.target_qps = 40\n")
    without_layers = {k: v for k, v in settings.items() if k != "layers"}
    scenario_runs.performance = _record("performance", settings=without_layers)
    assert packager._user_conf(scenario_runs).splitlines()[0] == "# written by mlharness: layers mlperf.conf"
    for record in (_record("performance", settings={}), None):
        scenario_runs.performance = record
        assert packager._user_conf(scenario_runs) == "# the folder's copy, a later run's\n"


def test_a_packaged_readme_names_the_model_system_backend_and_each_runs_command(tmp_path: Path) -> None:
    """The performance run's model, system and backend head it (the accuracy run's where there is no
    performance record: the manifest may have changed between the two), then each run's command."""
    folder = tmp_path / "box-folder" / "null" / "Offline"
    perf = _record("performance", system_name="tiny-box", software={"versions": {"numpy": "2.0", "loadgen": "6.0"}})
    acc = _record("accuracy", backend="onnxruntime", command=None, software={"versions": {"onnxruntime": "1.0"}},
                  model={"name": "null", "version": "1.0.1", "sha256": "b" * 64}, started_at="")
    assert packager._readme(runs.ScenarioRuns("null", "Offline", folder, performance=perf, accuracy=acc)) == "\n".join([
        "# null 1.0.0 — Offline", "",
        f"Measured with mlharness on tiny-box; backend null; model manifest sha256 {'a' * 64}.", "",
        "## Performance (run run-performance, T0)", "", "Reproduce with:", "", "```",
        "mlharness run null --mode performance", "```", "",
        "## Accuracy (run run-accuracy, )", "", "Reproduce with:", "", "```", "(command not recorded)", "```", "",
        "## Software", "", "- loadgen 6.0", "- numpy 2.0", ""])
    only_accuracy = packager._readme(runs.ScenarioRuns("null", "Offline", folder, accuracy=acc)).splitlines()
    assert only_accuracy[:3] == ["# null 1.0.1 — Offline", "",
                                 f"Measured with mlharness on box-folder; backend onnxruntime; model manifest "
                                 f"sha256 {'b' * 64}."]
    assert "## Performance" not in only_accuracy and only_accuracy[-3:] == ["## Software", "", "- onnxruntime 1.0"]
    no_records = packager._readme(runs.ScenarioRuns("null", "Offline", folder))
    assert no_records == "# null  — Offline\n\nMeasured with mlharness on box-folder; backend ?; model manifest sha256 ?.\n"


def test_a_packaged_readme_lists_each_audits_verdict_and_the_command_that_reruns_them(tmp_path: Path) -> None:
    audits = {"TEST01": {"verdict": "PASS", "run_id": "a1"}, "TEST04": {"verdict": "FAIL", "run_id": "a4"}}

    def compliance_section(perf: RunRecord | None) -> list[str]:
        lines = packager._readme(runs.ScenarioRuns("null", "Offline", tmp_path, performance=perf,
                                                   compliance=audits)).splitlines()
        return lines[lines.index("## Compliance"):]

    section = compliance_section(_record("performance"))
    assert section == ["## Compliance", "", "- TEST01: PASS (audit run a1)", "- TEST04: FAIL (audit run a4)", "",
                       "Reproduce with:", "", "```", "mlharness run null --mode performance --compliance TEST01,TEST04",
                       "```"]
    # A command that ran the audits itself is given as it was; without a performance record, a stand-in.
    assert compliance_section(_record("performance", command="mlharness run null --compliance TEST04"))[8] == \
        "mlharness run null --compliance TEST04"
    assert compliance_section(None)[8] == "mlharness run ... --compliance TEST01,TEST04"


def test_packaged_sources_hold_each_manifest_the_runs_named_with_its_hash_then_and_now(tmp_path: Path) -> None:
    """src/specs/<kind>/ gets every manifest file a run named, and src/manifests.json each one's identity, its
    sha256 at the run and now, and whether it changed since (unknowable without a recorded hash: not said
    changed). A manifest recorded without a path, or whose file is gone, is left out; the rest still go in."""
    specs = tmp_path / "specs"
    specs.mkdir()
    dataset, software, reference = specs / "d.yaml", specs / "s.yaml", specs / "r.yaml"
    dataset.write_text("kind: dataset\n")
    at_run = sha256(dataset)
    dataset.write_text("kind: dataset\n# edited after the run\n")
    software.write_text("kind: software\n")
    reference.write_text("kind: reference\n")

    def ref(path: Path, recorded: str | None) -> dict:
        return {"name": path.stem, "version": "1", "sha256": recorded, "path": str(path)}

    record = _record("performance", model={"name": "gone", "path": str(tmp_path / "gone.yaml")}, dataset=ref(dataset, at_run),
                     hardware={"name": "cpu"}, software={"manifest": ref(software, sha256(software))},
                     reference=ref(reference, None))
    tree = SubmitterTree(tmp_path / "out", "open", "Acme")
    packager._copy_sources(tree, [record])
    assert json.loads((tree.src / "manifests.json").read_text()) == {
        "specs/datasets/d.yaml": {"name": "d", "version": "1", "sha256_at_run": at_run, "sha256_now": sha256(dataset),
                                  "changed_since_run": True},
        "specs/software/s.yaml": {"name": "s", "version": "1", "sha256_at_run": sha256(software),
                                  "sha256_now": sha256(software), "changed_since_run": False},
        "specs/references/r.yaml": {"name": "r", "version": "1", "sha256_at_run": None, "sha256_now": sha256(reference),
                                    "changed_since_run": False}}
    assert sorted(str(p.relative_to(tree.src / "specs")) for p in (tree.src / "specs").rglob("*.yaml")) == [
        "datasets/d.yaml", "references/r.yaml", "software/s.yaml"]
    assert (tree.src / "specs" / "datasets" / "d.yaml").read_text() == dataset.read_text()


def test_the_packaged_code_is_the_checkouts_sources_or_the_installed_package_with_a_note(tmp_path: Path) -> None:
    """From a checkout: its layout (harness/, sut/, native C sources, pyproject.toml). From a package folder (an
    installed wheel, or mutation testing's tree): the package's Python code, and INSTALLED.txt naming the version.
    No __pycache__ either way."""
    from importlib.metadata import version

    root = packager.PACKAGE_ROOT
    packager._copy_code(tmp_path / "code")
    copied = {str(p.relative_to(tmp_path / "code")) for p in (tmp_path / "code").rglob("*") if p.is_file()}
    assert not [p for p in copied if "__pycache__" in p]
    if root.name != "mlharness":
        assert {"harness/running/runner.py", "sut/backends/__init__.py", "pyproject.toml"} <= copied
        assert any(p.startswith("native/") and p.endswith(".c") for p in copied)
        assert packager.INSTALLED_NOTE not in copied
    else:
        assert "running/runner.py" in copied and "pyproject.toml" not in copied
        note = (tmp_path / "code" / packager.INSTALLED_NOTE).read_text()
        assert note.startswith(f"mlharness {version('mlharness')}, installed in {root}: its Python code"), note


CPUINFO_TWO_SOCKETS = "".join(
    f"processor\t: {n}\nphysical id\t: {n // 4}\ncpu cores\t: 4\ncpu MHz\t\t: 2400.321\ncache size\t: 16384 KB\n\n"
    for n in range(8))


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine files the system description reads, given by the test: /proc/cpuinfo (two sockets of four
    cores), /etc/os-release and /sys/class/net (two cards with a device, and lo) under tmp_path/machine; a
    500 GiB root disk (any other path: none). Without psutil unless the test puts it back."""
    import pathlib
    import types

    from mlharness.submission import system_json

    root = tmp_path / "machine"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(CPUINFO_TWO_SOCKETS)
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 12 (a=b)"\n')
    for card in ("eth0/device", "eth1/device", "lo"):
        (root / "sys" / "class" / "net" / card).mkdir(parents=True)
    files = ("/proc/cpuinfo", "/etc/os-release", "/sys/class/net")
    monkeypatch.setattr(system_json, "Path", lambda p: pathlib.Path(root / p.lstrip("/") if p in files else p))
    monkeypatch.setattr(system_json.shutil, "disk_usage",
                        lambda path: types.SimpleNamespace(total=500 * 2**30 if path == "/" else 0))
    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` raises ImportError: /proc/cpuinfo is read
    return root


def _describe(detected: dict, software: dict, hardware_refs: tuple[str, ...] = ("gpu@1", "cpu@1", "gpu@1"),
              fields: dict[str, str] | None = None) -> dict[str, str]:
    from mlharness.submission import system_json

    return system_json.describe(division="open", submitter="Acme", system_name="box", detected=detected,
                                software=software, backends=["onnxruntime", "null", "onnxruntime"],
                                hardware_refs=hardware_refs, fields=fields)


def test_the_system_description_is_what_the_run_detected_and_the_machine_files_say(machine: Path) -> None:
    detected = {"cpu_model": "Xeon 8480", "logical_cpus": 16, "memory_bytes": 64 * 2**30, "os": "Linux 6.1",
                "python": "3.99.1", "gpus": ["NVIDIA H200", "NVIDIA L4"]}
    desc = _describe(detected, {"onnxruntime": "1.20", "numpy": "2.0", "mlcommons-loadgen": "6.0"})
    assert {k: v for k, v in desc.items() if not k.startswith("accelerator_") or k == "accelerator_model_name"} == {
        "division": "open", "submitter": "Acme", "status": "available", "system_name": "box", "system_type": "edge",
        "system_type_detail": "undetected", "number_of_nodes": "1", "host_processor_model_name": "Xeon 8480",
        "host_processors_per_node": "2", "host_processor_core_count": "8", "host_processor_frequency": "2400 MHz",
        "host_processor_caches": "16384 KB (cache size in /proc/cpuinfo)", "host_processor_interconnect": "N/A",
        "host_memory_capacity": "64 GB", "host_memory_configuration": "undetected", "host_storage_capacity": "500 GB",
        "host_storage_type": "undetected", "host_networking": "N/A", "host_networking_topology": "N/A",
        "host_network_card_count": "2", "accelerators_per_node": "2", "accelerator_model_name": "NVIDIA H200",
        "cooling": "undetected", "framework": "null, onnxruntime 1.20",
        "operating_system": "Debian GNU/Linux 12 (a=b) (Linux 6.1)",
        "other_software_stack": "Python 3.99.1, mlcommons-loadgen 6.0, numpy 2.0",
        "hw_notes": "Detected by mlharness; 16 logical CPUs available; hardware manifest(s): cpu@1, gpu@1",
        "sw_notes": "Run with mlharness (LoadGen via mlcommons-loadgen); manifests and code in src/"}
    assert {desc[k] for k in desc if k.startswith("accelerator_") and k != "accelerator_model_name"} == {"N/A"}


def test_the_system_description_falls_back_field_by_field_when_nothing_was_detected(
        machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No detected values, one socket, no cache or frequency line, no os-release, no network card: each field its
    own fallback (this host's CPU count and platform, one socket and card, undetected, N/A)."""
    import platform

    (machine / "proc" / "cpuinfo").write_text("processor\t: 0\nmodel name\t: X\ncpu cores\t: 3\n")
    (machine / "etc" / "os-release").unlink()
    for card in ("eth0", "eth1"):  # lo alone: no card with a device
        shutil.rmtree(machine / "sys" / "class" / "net" / card)
    desc = _describe({}, {})
    assert (desc["host_processor_model_name"], desc["host_processors_per_node"], desc["host_processor_core_count"],
            desc["host_processor_frequency"], desc["host_processor_caches"], desc["host_memory_capacity"],
            desc["host_network_card_count"], desc["accelerators_per_node"], desc["accelerator_model_name"]) == (
        "undetected", "1", "3", "undetected", "undetected", "undetected", "1", "0", "N/A")
    assert desc["operating_system"] == platform.platform()
    assert desc["other_software_stack"] == f"Python {platform.python_version()}"
    assert desc["framework"] == "null, onnxruntime"
    assert desc["hw_notes"].startswith(f"Detected by mlharness; {os.cpu_count()} logical CPUs available;")
    shutil.rmtree(machine / "sys")  # no /sys/class/net at all: one card
    assert _describe({}, {})["host_network_card_count"] == "1"
    (machine / "proc" / "cpuinfo").unlink()  # unreadable: one socket, and the logical count for cores
    assert (_describe({"logical_cpus": 6}, {})["host_processors_per_node"],
            _describe({"logical_cpus": 6}, {})["host_processor_core_count"]) == ("1", "6")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: (_ for _ in ()).throw(OSError("no disk")))
    assert _describe({}, {})["host_storage_capacity"] == "undetected"
    assert _describe({}, {}, hardware_refs=())["hw_notes"].endswith("; hardware manifest(s): none")
    # A host whose CPU count Python cannot tell (os.cpu_count() None; monkeypatched: this one can): one CPU.
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert _describe({}, {})["hw_notes"].startswith("Detected by mlharness; 1 logical CPUs available;")


def test_system_fields_win_over_what_was_detected_but_not_over_the_folders_division_and_submitter(
        machine: Path) -> None:
    from mlharness.submission.system_json import SYSTEM_FIELDS

    desc = _describe({}, {}, fields={"cooling": "liquid", "division": "closed", "submitter": "Other"})
    assert (desc["cooling"], desc["division"], desc["submitter"]) == ("liquid", "open", "Acme")
    with pytest.raises(UserError) as caught:
        _describe({}, {}, fields={"colour": "red"})
    assert str(caught.value) == (f"--system-field colour: not a system description field "
                                 f"(known: {', '.join(SYSTEM_FIELDS)})")


def test_the_physical_core_count_comes_from_psutil_when_it_is_there(machine: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    counts = {False: 12, True: 24}
    monkeypatch.setitem(sys.modules, "psutil", types.SimpleNamespace(cpu_count=lambda logical=True: counts[logical]))
    assert _describe({"logical_cpus": 24}, {})["host_processor_core_count"] == "12"
    counts[False] = None  # psutil cannot tell: the logical count
    assert _describe({"logical_cpus": 24}, {})["host_processor_core_count"] == "24"


def test_packaged_accuracy_text_is_the_headline_our_figures_then_the_full_logs_hash(tmp_path: Path) -> None:
    """The run's headline line first, its other figures kept (blank lines and an old hash line dropped), the full
    log's hash last; a missing, empty or unofficial accuracy.txt is one error naming it."""
    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text("[]\n")
    txt = tmp_path / "accuracy.txt"
    txt.write_text("\naccuracy=50.000%, good=1, total=2\n\ntop5=1.0\nhash=0123\n")
    assert accuracy_txt.official_text(txt, log) == (f"accuracy=50.000%, good=1, total=2\ntop5=1.0\n"
                                                    f"hash={sha256(log)}\n")
    for text, line, why in (("", 1, "''"), ("\n \n\n", 1, "''"), ("top1=0.5\n", 1, "'top1=0.5'"),
                            ("\n\ntop1=0.5\n", 3, "'top1=0.5'")):  # only blank lines: line 1, as for an empty file
        txt.write_text(text)
        with pytest.raises(UserError) as caught:
            accuracy_txt.official_text(txt, log)
        assert str(caught.value) == (f"{txt}: line {line}: expected the official headline 'accuracy=<pct>%, good=<n>, "
                                     f"total=<n>', got {why}")
    with pytest.raises(UserError) as caught:
        accuracy_txt.official_text(tmp_path / "missing.txt", log)
    assert str(caught.value) == f"{tmp_path / 'missing.txt'}: cannot read accuracy.txt: No such file or directory"


def test_an_accuracy_log_at_the_size_allowed_is_kept_whole_and_a_byte_more_is_truncated(tmp_path: Path) -> None:
    log = tmp_path / "mlperf_log_accuracy.json"
    limit, viewable = checker.MAX_ACCURACY_LOG_SIZE, accuracy_txt.VIEWABLE_SIZE
    log.write_bytes(b"a" * (limit - 1) + b"z")
    assert accuracy_txt.truncated_bytes(log) == log.read_bytes()
    log.write_bytes(b"a" * limit + b"z")
    assert accuracy_txt.truncated_bytes(log) == b"a" * viewable + b"\n\n...\n\n" + b"a" * (viewable - 1) + b"z"


def test_packaging_accuracy_without_the_runs_log_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "accuracy.txt").write_text("accuracy=50.000%, good=1, total=2\n")
    with pytest.raises(UserError) as caught:
        accuracy_txt.write_packaged_accuracy(tmp_path, tmp_path / "packaged", tmp_path / "full.json")
    assert str(caught.value) == (f"{tmp_path / 'mlperf_log_accuracy.json'}: missing: the accuracy run's log is needed "
                                 f"to package accuracy/")
    assert not (tmp_path / "packaged").exists() and not (tmp_path / "full.json").exists()


def test_each_system_description_problem_is_filed_as_a_system_problem_naming_the_field(tmp_path: Path) -> None:
    """systems/<system>.json: not an object; then each field missing, empty or not a string, a count that is no
    integer, a division or submitter other than the folders', an unknown status or system_type: one problem each,
    filed under "system" (what --allow-invalid never waives)."""
    from mlharness.submission.rules import SYSTEM_FIELDS, SYSTEM_STATUS, SYSTEM_TYPES

    tree = SubmitterTree(tmp_path, "open", "Acme")
    (tree.results / "box").mkdir(parents=True)
    tree.systems.mkdir(parents=True)
    path = tree.system_json("box")

    def found() -> list[tuple[str, str]]:
        return [(p.message, p.kind) for p in checker.check_tree(tree) if p.path == path]

    path.write_text("[]")
    assert found() == [("expected a JSON object", "system")]
    data = {key: "1" for key in SYSTEM_FIELDS} | {"division": "closed", "submitter": "Beta", "status": "Sold",
                                                  "system_type": "laptop", "cooling": 0, "host_processors_per_node": "two"}
    del data["host_networking"]
    path.write_text(json.dumps(data))
    assert found() == [
        ("host_networking: missing field", "system"),
        ("cooling: expected a non-empty string (write \"0\", not 0), got 0", "system"),
        ("host_processors_per_node: expected a count that parses as an integer, got 'two'", "system"),
        ("division: 'closed' does not match the folder 'open'", "system"),
        ("submitter: 'Beta' does not match the folder 'Acme'", "system"),
        (f"status: expected one of {', '.join(SYSTEM_STATUS)}, got 'Sold'", "system"),
        (f"system_type: expected one of {', '.join(SYSTEM_TYPES)}, got 'laptop'", "system")]
    path.write_text(json.dumps(data | {"division": "open", "submitter": "Acme", "status": "Available",
                                       "system_type": "edge", "cooling": "air", "host_processors_per_node": "2",
                                       "host_networking": "N/A"}))
    assert found() == []  # the status read without regard to case


def _performance_detail(path: Path, scenario: str, **changed: object) -> Path:
    """A detail log with every value the checker reads, each as a submission needs it; `changed` replaces some
    (None leaves the key out)."""
    from mlharness.submission.rules import SEEDS

    resnet = benchmark_for("resnet50")
    values = {"result_validity": "VALID", "effective_scenario": scenario, "effective_min_duration_ms": 600_000,
              "effective_performance_sample_count": resnet.performance_sample_count, "effective_min_query_count": 1,
              "effective_samples_per_query": 1, "early_stopping_met": True} | {f"effective_{k}": v for k, v in SEEDS.items()}
    values |= changed
    path.write_text("".join(mllog_line(key, value) for key, value in values.items() if value is not None))
    return path


def test_a_performance_log_as_a_submission_needs_it_has_no_problem_and_each_departure_is_one(tmp_path: Path) -> None:
    from mlharness.submission.rules import SEEDS

    resnet = benchmark_for("resnet50")

    def problems(**changed: object) -> list[tuple[str, str]]:
        detail = _performance_detail(tmp_path / "mlperf_log_detail.txt", "SingleStream", **changed)
        found = checker.check_performance_log(detail, "SingleStream", resnet)
        assert all(p.path == detail for p in found)  # each problem names the log it is in
        return [(p.message, p.kind) for p in found]

    assert problems() == []
    assert problems(result_validity=None) == [("LoadGen marked the run unknown, expected VALID", "run")]
    seed = next(iter(SEEDS))
    assert problems(**{f"effective_{seed}": 7}) == [
        (f"{seed}: expected LoadGen's mlperf.conf seed {SEEDS[seed]}, found 7", "run")]
    assert problems(early_stopping_met=False) == [("SingleStream: early stopping condition not met", "run")]
    detail = tmp_path / "mlperf_log_detail.txt"
    with detail.open("a") as log:
        log.write(mllog_line("error_runtime", "x" * 300, is_error=True))
    found = [(p.message, p.kind) for p in checker.check_performance_log(detail, "SingleStream", resnet)]
    assert found == [(f"LoadGen error: {('error_runtime: ' + 'x' * 300)[:200]}", "run"),
                     ("SingleStream: early stopping condition not met", "run")]
    sample_count = resnet.performance_sample_count
    assert problems(effective_performance_sample_count=sample_count - 1) == [
        (f"performance_sample_count: expected >= {sample_count} for resnet, found {sample_count - 1}", "run")]
    # Offline is held to its query count, not to early stopping.
    offline = _performance_detail(tmp_path / "offline.txt", "Offline", early_stopping_met=None)
    assert checker.check_performance_log(offline, "Offline", resnet) == []
    offline = _performance_detail(tmp_path / "offline.txt", "Offline", effective_min_query_count=0)
    assert [(p.path, p.message, p.kind) for p in checker.check_performance_log(offline, "Offline", resnet)] == [
        (offline, "min_query_count: expected >= 1", "run")]


def test_a_scenario_folders_measurements_extra_files_and_recorded_overrides_are_each_a_problem(tmp_path: Path) -> None:
    """measurements.json's empty or missing fields; a file in performance/run_1 the official checker does not
    expect (the accuracy log may lie there); a packaged run that overrode protected settings, as provenance says."""
    from mlharness.submission.rules import MEASUREMENTS_FIELDS

    tree = SubmitterTree(tmp_path, "open", "Acme")
    where = tree.scenario("box", "resnet", "SingleStream")
    perf = where / "performance" / "run_1"
    perf.mkdir(parents=True)
    for name in packager.PERFORMANCE_FILES:
        (perf / name).write_text("x\n")
    _performance_detail(perf / "mlperf_log_detail.txt", "SingleStream")
    (perf / "mlperf_log_accuracy.json").write_text("[]\n")
    (perf / "notes.txt").write_text("mine\n")
    (perf / "a.log").write_text("mine too\n")
    (where / "measurements.json").write_text(json.dumps({MEASUREMENTS_FIELDS[0]: " "}))
    entry = {"performance": {"run_id": "p1", "overridden_protected": ["min_duration", "seed"]},
             "accuracy": {"run_id": "a1", "overridden_protected": ["min_query_count"]}}
    found = [(p.path, p.message, p.kind) for p in checker.check_scenario(
        tree, where, benchmark_for("resnet50"), {str(where.relative_to(tree.base)): entry})]
    measurements = where / "measurements.json"
    for key in MEASUREMENTS_FIELDS:
        assert (measurements, f"{key}: expected a non-empty value", "tree") in found
    assert (perf, "unexpected files a.log, notes.txt (the checker compares the list)", "tree") in found
    assert (where, "performance run p1 overrode protected settings min_duration, seed", "run") in found
    assert (where, "accuracy run a1 overrode protected settings min_query_count", "run") in found


@pytest.mark.parametrize("text", ["{}", '{"entries": [5, {"run": 1}, {"folder": "results/box/resnet/Offline"}]}', "{cut",
                                  "[]", '{"entries": null}'])
def test_a_provenance_file_without_entries_or_unreadable_names_no_packaged_run(tmp_path: Path, text: str) -> None:
    """src/mlharness_runs.json as found in a tree (edited, or written by another tool): read defensively."""
    tree = SubmitterTree(tmp_path, "open", "Acme")
    tree.src.mkdir(parents=True)
    tree.provenance.write_text(text)
    expected = {"results/box/resnet/Offline": {"folder": "results/box/resnet/Offline"}} if "folder" in text else {}
    assert checker._provenance(tree) == expected


def test_a_closed_scenario_folder_checks_its_audits_logs_against_its_own_scenario(tmp_path: Path) -> None:
    """In the closed division each of the benchmark's audits is checked (a missing one named); an audit's
    performance log is held to the folder's scenario. The open division checks no audit."""
    resnet = benchmark_for("resnet50")
    for division in ("closed", "open"):
        tree = SubmitterTree(tmp_path / division, division, "Acme")
        where = tree.scenario("box", "resnet", "SingleStream")
        audit = where / "TEST04" / "performance" / "run_1"
        audit.mkdir(parents=True)
        _performance_detail(audit / "mlperf_log_detail.txt", "SingleStream")
        found = [(p.path, p.message, p.kind) for p in checker.check_scenario(tree, where, resnet, {})
                 if p.kind == "compliance" or "TEST0" in str(p.path)]
        if division == "open":
            assert found == []
            continue
        assert (where / "TEST01", "missing: closed division needs TEST01 for resnet", "compliance") in found
        assert not [message for _, message, _ in found if "log is for scenario" in message], found
        assert (where / "TEST04" / "verify_performance.txt", "missing: required file", "compliance") in found


def test_an_accuracy_run_on_part_of_the_dataset_or_with_a_loadgen_error_is_said_so(tmp_path: Path) -> None:
    """The accuracy run's detail log: a run over fewer samples than the benchmark's dataset is a `dataset`
    problem (waivable, as in the official checker), the whole dataset none; a LoadGen error is the run's, cut at
    200 characters."""
    resnet = benchmark_for("resnet50")
    folder = tmp_path / "acc"
    folder.mkdir()
    (folder / "mlperf_log_accuracy.json").write_text("[]\n")
    (folder / "accuracy.txt").write_text(f"accuracy=80.000%, good=1, total=1\n"
                                         f"hash={sha256(folder / 'mlperf_log_accuracy.json')}\n")
    detail = folder / "mlperf_log_detail.txt"

    def problems() -> list[tuple[str, str]]:
        return [(p.message, p.kind) for p in checker.check_accuracy(SubmitterTree(tmp_path, "open", "A"), folder, resnet)]

    detail.write_text(mllog_line("qsl_reported_total_count", resnet.dataset_size))
    assert problems() == []
    detail.write_text(mllog_line("qsl_reported_total_count", 1024) + mllog_line("error_runtime", "y" * 300, is_error=True))
    assert problems() == [
        (f"LoadGen error: {('error_runtime: ' + 'y' * 300)[:200]}", "run"),
        (f"accuracy run covers 1024 of resnet's {resnet.dataset_size} dataset samples (qsl_reported_total_count; "
         f"--skip-dataset-size-check waives this, as in the official checker)", "dataset")]


@pytest.mark.parametrize("summary, said", [("Result is : VALID\n", None), ("Result is : INVALID\n", "INVALID"),
                                           ("Scenario : Offline\n", "missing"), (None, "missing")])
def test_a_run_is_submission_grade_only_when_its_summary_says_valid(tmp_path: Path, summary: str | None,
                                                                   said: str | None) -> None:
    path = tmp_path / "performance" / "run_1" / "mlperf_log_summary.txt"
    if summary is not None:
        path.parent.mkdir(parents=True)
        path.write_text(summary)
    found = packager.run_problems(runs.ScenarioRuns("null", "Offline", tmp_path))
    assert found == ([f"{path}: LoadGen result is {said}, expected VALID"] if said else [])


def test_packaging_refuses_a_bad_division_or_submitter_and_missing_runs_naming_the_first(tmp_path: Path) -> None:
    def refused(**options: object) -> str:
        with pytest.raises(UserError) as caught:
            packager.package(packager.PackageOptions(**({"division": "open", "submitter": "Acme", "out": tmp_path / "out",
                                                         "results_dir": tmp_path / "results"} | options)))
        return str(caught.value)

    assert refused(division="mixed") == "--division: expected one of open, closed, got 'mixed'"
    assert refused(submitter="") == "--submitter: expected a folder name, got ''"
    assert refused(submitter="a/b") == "--submitter: expected a folder name, got 'a/b'"
    where = tmp_path / "results" / "box" / "null" / "Offline"
    (where / "performance" / "run_1").mkdir(parents=True)
    first = where / "performance" / "run_1" / packager.PERFORMANCE_FILES[0]
    assert refused() == (f"{len(packager.PERFORMANCE_FILES) + 1} problem(s); first: {first}: missing: no performance "
                         f"run to package")
    for name in packager.PERFORMANCE_FILES[1:]:
        (where / "performance" / "run_1" / name).write_text("x\n")
    assert refused() == f"2 problem(s); first: {first}: missing: no performance run to package"
    first.write_text("Result is : INVALID\n")
    assert refused() == f"{where / 'accuracy'}: missing: no accuracy run to package (mlharness run ... --mode accuracy)"
    (where / "accuracy").mkdir()
    (where / "accuracy" / "mlperf_log_accuracy.json").write_text("[]\n")
    assert refused() == (f"refusing to package runs that are not submission-grade (1 problem(s)); first: {first}: "
                         f"LoadGen result is INVALID, expected VALID; pass --allow-invalid to package them marked "
                         f"NOT_FOR_SUBMISSION")
    assert not (tmp_path / "out").exists()


def test_a_protected_setting_of_unknown_origin_is_said_so() -> None:
    record = _record("performance", settings={"loadgen": {"min_duration": "1", "min_query_count": "1"},
                                              "origin": {"min_query_count": "user.conf"}})
    assert packager._origins(record, ["min_duration", "min_query_count"]) == ["min_duration<-?",
                                                                             "min_query_count<-user.conf"]


def test_a_performance_run_whose_logs_a_later_run_overwrote_is_refused_not_packaged(tmp_path: Path) -> None:
    """The scenario folder's performance logs must be the ones the chosen performance record describes (its
    summary, line by line); a record without a performance summary is not compared."""
    from mlharness.records.loadgen_logs import parse_summary

    where = tmp_path / "results" / "box" / "null" / "Offline"
    summary = where / "performance" / "run_1" / "mlperf_log_summary.txt"
    summary.parent.mkdir(parents=True)
    summary.write_text("Scenario : Offline\nResult is : VALID\n")
    mine = parse_summary(summary)
    for performance, refused in ((mine, False), (mine | {"raw": {**mine["raw"], "Result is": "INVALID"}}, True),
                                 (None, False)):
        (where / "run.json").write_text(json.dumps(_record("performance", performance=performance).to_dict()))
        if not refused:
            (found,) = runs.collect(tmp_path / "results")
            assert found.performance is not None and found.performance.run_id == "run-performance"
            continue
        with pytest.raises(UserError) as caught:
            runs.collect(tmp_path / "results")
        assert str(caught.value) == (f"{summary}: run run-performance's performance logs were overwritten by a later "
                                     f"run; package the latest run or rerun it")


def test_the_results_database_gives_a_scenario_folder_only_its_own_systems_runs(tmp_path: Path) -> None:
    """The database of a results folder used from two systems (a CPU and a CUDA run of one host) holds both, and
    other models' runs; a model's folder takes its own model's and system's records from it, never a newer other."""
    from mlharness.store.result_store import ResultStore

    results = tmp_path / "results"
    where = results / "box" / "null" / "Offline"
    where.mkdir(parents=True)
    with ResultStore(results / "mlharness.sqlite") as store:
        for run_id, model, system, started in (("mine", "null", "box", "T1"), ("theirs", "null", "box_cuda0", "T2"),
                                               ("another-models", "tiny", "box", "T3")):
            store.add_run(_record("performance", run_id=run_id, model={"name": model}, system_name=system,
                                  started_at=started, results_path=str(where)))
    assert [r.run_id for r in runs.candidate_records(results, where)] == ["mine"]


def test_system_fields_come_from_files_then_flags_and_each_bad_one_is_named(tmp_path: Path) -> None:
    from mlharness.submission import system_json

    fields = tmp_path / "fields.json"
    fields.write_text(json.dumps({"cooling": "air", "hw_notes": "from the file"}))
    assert system_json.parse_fields(["hw_notes = a=b ", "host_storage_type=NVMe"], [str(fields)]) == {
        "cooling": "air", "hw_notes": "a=b", "host_storage_type": "NVMe"}
    for item in ("cooling", "=air", " =air"):
        with pytest.raises(UserError) as caught:
            system_json.parse_fields([item], [])
        assert str(caught.value) == f"--system-field {item!r}: expected KEY=VALUE"
    for text, why in (("{cut", ": Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
                      ("[1]", "")):
        fields.write_text(text)
        with pytest.raises(UserError) as caught:
            system_json.parse_fields([], [str(fields)])
        assert str(caught.value) == f"{fields}: expected a JSON object of system description fields{why}"


def test_a_sessions_steps_file_gives_its_runs_records_and_pins_pick_by_mode(tmp_path: Path) -> None:
    """Without a database, the performance run's record may be only in the session's steps file (run.json holds the
    later accuracy run's): both are candidates. A pinned run replaces the run of its own mode only; a pin that is
    not in this folder does not stop the next one."""
    where = tmp_path / "results" / "box" / "null" / "Offline"
    where.mkdir(parents=True)
    perf, acc = _record("performance", started_at="T1"), _record("accuracy", started_at="T2")
    older = _record("accuracy", run_id="run-older", started_at="T0")
    (where / runs.STEPS_FILE).write_text(json.dumps({"schema_version": 1, "records": {"performance": perf.to_dict()}}))
    (where / "run.json").write_text(json.dumps(acc.to_dict()))
    found = runs.candidate_records(tmp_path / "results", where)
    assert [r.run_id for r in found] == ["run-accuracy", "run-performance"]
    chosen = runs.ScenarioRuns("null", "Offline", where, performance=perf, accuracy=acc)
    assert runs._apply_pins(chosen, found + [older], ["elsewhere", "run-older"]) == {"run-older"}
    assert (chosen.performance.run_id, chosen.accuracy.run_id) == ("run-performance", "run-older")


def test_a_folder_name_is_its_benchmark_when_the_mapping_does_not_name_it() -> None:
    assert benchmark_for("resnet", {"my-bert": "bert-99"}) is BENCHMARKS["resnet"]
    assert benchmark_for("my-bert", {"my-bert": "bert-99"}) is BENCHMARKS["bert-99"]


def _scenario_with(results: Path, where: str, *records: RunRecord, logs: tuple[str, ...] = ("performance",)) -> Path:
    """results/<where> holding these records (the last one in run.json, the others in the steps file by mode)
    and the named log folders."""
    folder = results / where
    folder.mkdir(parents=True)
    for logs_folder in logs:
        (folder / logs_folder).mkdir()
    *steps, latest = records
    if steps:
        (folder / runs.STEPS_FILE).write_text(json.dumps({"schema_version": 1,
                                                          "records": {r.mode: r.to_dict() for r in steps}}))
    (folder / "run.json").write_text(json.dumps(latest.to_dict()))
    return folder


def test_collect_walks_visible_scenario_folders_that_hold_logs_and_keeps_every_one(tmp_path: Path) -> None:
    """Folders starting with a dot (a hidden system, a run's staging folder) are not walked; a scenario folder
    without performance/ or accuracy/ is passed over without ending the walk; one with accuracy/ only is
    packaged with its accuracy run."""
    results = tmp_path / "results"
    with pytest.raises(UserError) as caught:
        runs.collect(results)  # not even made yet
    assert str(caught.value) == f"{results}: no recorded runs match (model any, scenarios any)"
    _scenario_with(results, "box/null/MultiStream", _record("performance", run_id="none-here"), logs=())
    _scenario_with(results, "box/null/Offline", _record("accuracy", run_id="acc-only"), logs=("accuracy",))
    _scenario_with(results, "box/null/.staging-x", _record("performance", run_id="staged"))
    _scenario_with(results, ".old-box/null/Offline", _record("performance", run_id="hidden-system"))
    _scenario_with(results, "box/null/SingleStream", _record("performance", run_id="ss", scenario="SingleStream"))
    found = runs.collect(results)
    assert [(r.scenario, r.performance and r.performance.run_id, r.accuracy and r.accuracy.run_id) for r in found] == [
        ("Offline", None, "acc-only"), ("SingleStream", "ss", None)]


def test_pins_and_left_out_records_count_across_every_scenario_folder(tmp_path: Path) -> None:
    """A pin used in one folder stays used after the next folder; a pin naming a record left out in an earlier
    folder is refused with why it was left out."""
    results = tmp_path / "results"
    bricks = _record("performance", run_id="bricks-1", kind="bricks")
    _scenario_with(results, "box/null/Offline", _record("performance", run_id="older", started_at="T0"),
                   _record("performance", run_id="newer", started_at="T1"))
    _scenario_with(results, "box/null/Server", bricks)
    _scenario_with(results, "box/null/SingleStream", _record("performance", run_id="ss", scenario="SingleStream"))
    (offline, _, single) = runs.collect(results, pinned=["older"])
    assert (offline.performance.run_id, single.performance.run_id) == ("older", "ss")
    with pytest.raises(UserError) as caught:
        runs.collect(results, pinned=["bricks-1"])
    assert str(caught.value) == (f"--run bricks-1: {results / 'box/null/Server'}: run bricks-1 left out: a 'bricks' "
                                 f"record, not a loadgen test (a submission packages LoadGen runs only)")


def test_candidate_records_keep_every_ok_loadgen_run_newest_first_and_name_a_bad_steps_record(tmp_path: Path) -> None:
    """A failed record found first does not end the search; a record with no start time sorts oldest; a steps
    file's bad record is named by its file and mode."""
    results = tmp_path / "results"
    where = _scenario_with(results, "box/null/Offline", _record("performance", status="failed"),
                           _record("accuracy", run_id="undated", started_at=""),
                           _record("accuracy", run_id="dated", started_at="2026-12-07T00:00:00Z"))
    assert [r.run_id for r in runs.candidate_records(results, where)] == ["dated", "undated"]
    steps = where / runs.STEPS_FILE
    steps.write_text(json.dumps({"schema_version": 1, "records": {"performance": {"run_id": "cut"}}}))
    with pytest.raises(UserError) as caught:
        runs.candidate_records(results, where)
    assert str(caught.value).startswith(f"{steps}: records.performance")
