"""`mlharness submission run --restart` and `submission package --force` (and its refusal to
overwrite without it), on a real short session: the null model named as ResNet-50, Offline only."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import REPO, null_model_with, run_cli, wait_for, yaml_block

MODEL = "null-resnet"
SESSION = ("submission", "run", "--model", MODEL, "--scenarios", "Offline", "--quick", "--set", "target_qps=20000")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One finished session (Offline performance and accuracy) under a private specs copy."""
    root = tmp_path_factory.mktemp("submission-cli")
    specs = root / "specs"
    shutil.copytree(REPO / "specs", specs)
    manifest = null_model_with(specs / "models", name=MODEL, benchmark="resnet50")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLHARNESS_SPECS", str(specs))
        results = root / "results"
        assert run_cli(*SESSION, "--results-dir", results) == 0
        yield {"root": root, "specs": specs, "manifest": manifest.name, "results": results}


@pytest.fixture
def specs_env(session: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_SPECS", str(session["specs"]))


def state_file(results: Path) -> Path:
    (path,) = results.glob(f"*/{MODEL}/submission_run.json")
    return path


def state(results: Path) -> dict:
    return json.loads(state_file(results).read_text())


def steps_file(results: Path) -> Path:
    (path,) = results.glob(f"*/{MODEL}/Offline/submission_steps.json")
    return path


def steps_record(results: Path) -> dict:
    return json.loads(steps_file(results).read_text())["records"]


def db_ids(results: Path) -> set[str]:
    with ResultStore(results / "mlharness.sqlite") as store:
        return {row["run_id"] for row in store.list_runs()}


def test_restart_runs_every_finished_step_again(session: dict, specs_env: None, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    shutil.copytree(session["results"], results)
    first = state(results)["steps"]
    assert {k: v["status"] for k, v in first.items()} == {"Offline/performance": "done", "Offline/accuracy": "done"}
    before = db_ids(results)
    assert before == {first["Offline/performance"]["run_id"], first["Offline/accuracy"]["run_id"]}
    # The same command again resumes: both steps are finished.
    assert run_cli(*SESSION, "--results-dir", results) == 0
    out = capsys.readouterr().out
    skipped = re.findall(r"^\[\d/2\] null-resnet Offline \w+: done earlier \(run (\S+)\), skipped$", out, re.MULTILINE)
    assert sorted(skipped) == sorted(step["run_id"] for step in first.values())  # each step's own run
    assert "started" not in out and db_ids(results) == before
    # --restart: both run again, as new runs, and the state and steps files name the new ones.
    assert run_cli(*SESSION, "--results-dir", results, "--restart") == 0
    out = capsys.readouterr().out
    assert re.findall(r"^\[(\d)/2\] null-resnet Offline (\w+): started$", out, re.MULTILINE) == [
        ("1", "performance"), ("2", "accuracy")]
    assert "skipped" not in out
    second = state(results)["steps"]
    assert {k: v["status"] for k, v in second.items()} == {"Offline/performance": "done", "Offline/accuracy": "done"}
    new = {second[k]["run_id"] for k in second}
    assert not new & before and db_ids(results) == before | new
    records = steps_record(results)
    assert {records["performance"]["run_id"], records["accuracy"]["run_id"]} == new
    # And the session after a restart resumes from the restarted steps.
    assert run_cli(*SESSION, "--results-dir", results) == 0
    assert capsys.readouterr().out.count("skipped") == 2 and state(results)["steps"] == second


def test_a_redone_step_runs_again_with_the_scenarios_later_steps_and_not_its_earlier_ones(
        session: dict, specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step run again takes its scenario's later steps with it (as --redo says), never its earlier ones."""
    results = tmp_path / "results"
    shutil.copytree(session["results"], results)
    for redo, again in (("Offline/performance", ["performance", "accuracy"]), ("Offline/accuracy", ["accuracy"])):
        assert run_cli(*SESSION, "--results-dir", results, "--redo", redo) == 0
        out = capsys.readouterr().out
        assert re.findall(r"^\[\d/2\] null-resnet Offline (\w+): started$", out, re.MULTILINE) == again, redo
        assert out.count("skipped") == 2 - len(again)


def test_a_closed_division_session_plans_the_compliance_tests_of_the_models_benchmark(
        specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plan, as a --redo of no step names it before anything runs: the model's MLPerf benchmark (its
    `mlperf_benchmark`, ResNet-50 here) decides the audits of a closed session; an open one has none."""
    results = tmp_path / "results"
    for division, audits in (("closed", ["TEST01", "TEST04"]), ("open", [])):
        assert run_cli("submission", "run", "--model", MODEL, "--scenarios", "Offline", "--quick", "--division",
                       division, "--redo", "nothing", "--results-dir", results) == 1
        steps = ", ".join(f"Offline/{step}" for step in ["performance", "accuracy", *audits])
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"mlharness: error: --redo nothing: not a step of this run; expected a scenario or one of: {steps}")
    assert not results.exists()


def test_a_session_whose_settings_changed_starts_its_steps_over_and_says_so(
        session: dict, specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the runs are made of (here a user.conf given, then its text changed) is the session's fingerprint:
    another starts the steps over, said in one line naming the state file; the same again resumes. A state
    file that does not read starts over too."""
    results, conf = tmp_path / "results", tmp_path / "user.conf"
    shutil.copytree(session["results"], results)
    changed = f"{state_file(results)}: settings changed since the last session; starting the steps over"

    def started() -> list[str]:
        out = capsys.readouterr().out
        steps = re.findall(r"^\[\d/2\] null-resnet Offline (\w+): started$", out, re.MULTILINE)
        return steps + (["(said changed)"] if changed in out.splitlines() else [])

    conf.write_text("*.Offline.min_query_count = 100\n")
    assert run_cli(*SESSION, "--results-dir", results, "--user-conf", conf) == 0
    assert started() == ["performance", "accuracy", "(said changed)"]
    assert run_cli(*SESSION, "--results-dir", results, "--user-conf", conf) == 0
    assert started() == []
    conf.write_text("*.Offline.min_query_count = 200\n")  # the same file, other text
    assert run_cli(*SESSION, "--results-dir", results, "--user-conf", conf) == 0
    assert started() == ["performance", "accuracy", "(said changed)"]
    state_file(results).write_text("{not json")
    assert run_cli(*SESSION, "--results-dir", results, "--user-conf", conf) == 0
    assert started() == ["performance", "accuracy"]
    assert state(results)["steps"].keys() == {"Offline/performance", "Offline/accuracy"}


def specs_with_postprocess(session: dict, tmp_path: Path, code: str) -> Path:
    """A copy of the session's specs whose model runs `code` (defining postprocess(outputs, ctx)) on each answer."""
    specs = tmp_path / "specs"
    shutil.copytree(session["specs"], specs)
    model = specs / "models" / session["manifest"]
    model.write_text(model.read_text().replace("attributes:", "postprocess: |\n" + yaml_block(code) + "attributes:", 1))
    return specs


def test_a_step_that_fails_is_kept_failed_and_the_same_command_resumes_from_it(
        session: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A step whose run fails (here the model's postprocess, while a file says so): said failed on the progress
    line, kept in the state file with its error, the session stopped in one line saying how to resume; the same
    command again runs that step (and the rest), not a new session, and keeps what each step did."""
    flag, results = tmp_path / "fail", tmp_path / "results"
    monkeypatch.setenv("MLHARNESS_SPECS", str(specs_with_postprocess(
        session, tmp_path, f"import os\ndef postprocess(outputs, ctx):\n    if os.path.exists({str(flag)!r}):\n"
                           "        raise RuntimeError('asked to fail')\n    return outputs['scores']\n")))
    flag.touch()
    began = time.monotonic()
    assert run_cli(*SESSION, "--results-dir", results) == 1
    took = time.monotonic() - began
    out, err = capsys.readouterr()
    failed = re.search(rf"^\[1/2\] {MODEL} Offline performance: failed \((\d+\.\d) s\)", out, re.MULTILINE)
    assert failed and float(failed[1]) <= round(took, 1) + 0.1, out  # the step's time, within the command's
    kept = state(results)["steps"]
    assert list(kept) == ["Offline/performance"] and kept["Offline/performance"]["status"] == "failed"
    error = kept["Offline/performance"]["error"]
    assert error.startswith("run failed") and "asked to fail" in error, error
    assert err.splitlines()[-1] == (f"mlharness: error: [1/2] {MODEL} Offline performance failed: {error} "
                                    "(run the same command again to resume)")
    flag.unlink()
    began = time.monotonic()
    assert run_cli(*SESSION, "--results-dir", results) == 0
    took = time.monotonic() - began
    out = capsys.readouterr().out
    assert re.findall(r"^\[(\d)/2\] null-resnet Offline (\w+): started$", out, re.MULTILINE) == [
        ("1", "performance"), ("2", "accuracy")]
    done = re.findall(r"^\[(\d)/2\] null-resnet Offline (\w+): done \((\d+\.\d) s\)", out, re.MULTILINE)
    assert [(number, step) for number, step, _ in done] == [("1", "performance"), ("2", "accuracy")]
    assert all(float(seconds) <= round(took, 1) + 0.1 for _, _, seconds in done), done
    steps = state(results)["steps"]
    assert {k: v["status"] for k, v in steps.items()} == {"Offline/performance": "done", "Offline/accuracy": "done"}
    # The session's last two lines: what it did (in the command's own time) and where its state is; what next.
    said, then = out.splitlines()[-2:]
    seconds = re.fullmatch(rf"submission run: 2 step\(s\) for {MODEL} in (\d+) s; state in (.+)", said)
    assert seconds and int(seconds[1]) <= round(took) and Path(seconds[2]) == state_file(results), said
    assert then == (f"next: mlharness submission package --division open --submitter <NAME> --out <DIR> "
                    f"--results-dir {results} --model {MODEL}")
    printed = {f"Offline/{step}": float(seconds) for _, step, seconds in done}
    for key, step in steps.items():  # how long it took, to a tenth of a second (as printed), beside its run
        assert isinstance(step["seconds"], float) and step["seconds"] == round(step["seconds"], 1), step
        assert abs(step["seconds"] - printed[key]) <= 0.1 and step["seconds"] <= round(took, 1) + 0.1, step
        assert set(step) >= {"run_id", "summary"}
    # Each step's summary (printed under it, kept in the state) is the run's figures without its header or folder.
    summary = steps["Offline/performance"]["summary"]
    assert summary[0].startswith("LoadGen result : ") and not any("results :" in line for line in summary), summary
    assert "\n".join(f"    {line}" for line in summary) in out
    # The steps file is made at schema 1, and each step's record has the command that reproduces it whole.
    assert json.loads(steps_file(results).read_text())["schema_version"] == 1
    command = shlex.split(steps_record(results)["performance"]["command"])
    assert command[command.index("--results-dir") + 1] == str(results.resolve()), command


def test_a_step_stopped_by_ctrl_c_is_kept_failed_and_the_session_exits_130(
        session: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while a step runs (once the model is answering): the run is interrupted, the step kept failed with
    why, and the session exits 130 as `run` does, saying how to resume."""
    answering, results = tmp_path / "answering", tmp_path / "results"
    monkeypatch.setenv("MLHARNESS_SPECS", str(specs_with_postprocess(
        session, tmp_path, f"import time\ndef postprocess(outputs, ctx):\n    open({str(answering)!r}, 'w').close()\n"
                           "    time.sleep(120)\n    return outputs['scores']\n")))

    def interrupt_once_answering() -> None:
        wait_for(answering.exists, "the model answering")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_answering, daemon=True).start()
    assert run_cli(*SESSION, "--results-dir", results) == 130
    kept = state(results)["steps"]
    assert list(kept) == ["Offline/performance"] and kept["Offline/performance"]["status"] == "failed"
    error = kept["Offline/performance"]["error"]
    assert error.startswith("run failed: interrupted by SIGINT"), error
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"mlharness: error: [1/2] {MODEL} Offline performance failed: {error} (run the same command again to resume)")


def test_an_audit_that_cannot_run_fails_its_step_with_the_audits_own_line_and_exit_status_1(
        specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An audit refused before it runs (the performance run's detail log it compares with is gone) is a user's
    error, not a failed run: its step is kept failed with the audit's one line, and the session exits 1."""
    results = tmp_path / "results"
    command = (*SESSION, "--compliance", "TEST04", "--results-dir", results)
    assert run_cli(*command) in (0, 1)  # whether the audit passes does not matter here
    detail = Path(steps_record(results)["performance"]["results_path"]) / "performance" / "run_1" / "mlperf_log_detail.txt"
    detail.unlink()
    capsys.readouterr()
    assert run_cli(*command, "--redo", "Offline/TEST04") == 1
    error = f"{detail}: missing: TEST04 compares with the performance run; run it first"
    assert state(results)["steps"]["Offline/TEST04"] == {"status": "failed", "error": error}
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"mlharness: error: [3/3] {MODEL} Offline TEST04 failed: {error} (run the same command again to resume)")


def test_a_session_without_quick_says_about_how_long_each_timed_step_will_take(
        specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --quick, a performance step is expected to last LoadGen's minimum duration (600 s, and a tenth), an
    audit as long as its scenario's performance step took, an accuracy step nothing said. The quick preset's
    settings, named as a preset, keep the runs short; whether the audit passes does not matter here."""
    results = tmp_path / "results"
    command = ("submission", "run", "--model", MODEL, "--scenarios", "Offline", "--preset", "quick", "--set",
               "target_qps=20000", "--compliance", "TEST04", "--results-dir", results)
    assert run_cli(*command) in (0, 1)
    started = re.findall(rf"^\[\d/3\] {MODEL} Offline .*: started.*$", capsys.readouterr().out, re.MULTILINE)
    took = state(results)["steps"]["Offline/performance"]["seconds"]
    assert started == [f"[1/3] {MODEL} Offline performance: started (about 660 s)",
                       f"[2/3] {MODEL} Offline accuracy: started",
                       f"[3/3] {MODEL} Offline TEST04: started (about {took:.0f} s)"]
    # A performance step run again is still expected to last the minimum duration, not its last time.
    assert run_cli(*command, "--redo", "Offline/performance") in (0, 1)
    out = capsys.readouterr().out
    assert f"[1/3] {MODEL} Offline performance: started (about 660 s)" in out.splitlines()


def test_an_audit_step_reports_its_verdict_and_scores_and_a_resumed_session_names_its_run(
        specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under an audit step: its verdict, then the reference and test scores it compared; the state keeps its run
    and verdict (those the run's record has), and a resumed session names them, with the same exit status."""
    results = tmp_path / "results"
    command = (*SESSION, "--compliance", "TEST04", "--results-dir", results)
    code = run_cli(*command)
    lines = capsys.readouterr().out.splitlines()
    audit = steps_record(results)["performance"]["compliance"]["TEST04"]
    kept = state(results)["steps"]["Offline/TEST04"]
    assert (kept["run_id"], kept["verdict"], code) == (audit["run_id"], audit["verdict"], 0 if audit["verdict"] == "PASS" else 1)
    (done,) = [n for n, line in enumerate(lines) if line.startswith(f"[3/3] {MODEL} Offline TEST04: done (")]
    said = lines[done + 1:done + 4]
    assert said[0] == f"    TEST04: {audit['verdict']}" and said[1].startswith("    reference score")
    assert said[2].startswith("    test score") and kept["summary"] == [line.strip() for line in said]
    assert run_cli(*command) == code
    assert (f"[3/3] {MODEL} Offline TEST04: done earlier (run {audit['run_id']}, {audit['verdict']}), skipped"
            in capsys.readouterr().out.splitlines())


def package(session: dict, out: Path, *extra: str) -> int:
    return run_cli("submission", "package", "--division", "open", "--submitter", "Acme", "--out", out,
                   "--results-dir", session["results"], "--allow-invalid", "--skip-dataset-size-check", *extra)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below a folder and its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def packaged(session: dict, specs_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """A packaged tree, with files of the user's own beside it and inside it."""
    out = tmp_path / "out"
    assert package(session, out) == 0
    capsys.readouterr()
    base = out / "open" / "Acme"
    assert (base / "results").is_dir() and (base / "systems").is_dir()
    (base / "notes-inside.txt").write_text("written into the packaged tree by hand\n")
    (out / "open" / "Other").mkdir()
    (out / "open" / "Other" / "keep.txt").write_text("another submitter's folder\n")
    (out / "README.txt").write_text("mine\n")
    return {"out": out, "base": base, "before": snapshot(out)}


def test_package_refuses_to_overwrite_and_changes_nothing(session: dict, packaged: dict,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out, base = packaged["out"], packaged["base"]
    assert package(session, out) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"mlharness: error: {base}: already exists; pass --force to replace it"
    assert snapshot(out) == packaged["before"]  # every file as it was, the hand-written one included
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "full_accuracy_logs", "open"]  # no staging folder


def test_force_replaces_only_the_submitter_folder(session: dict, packaged: dict,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out, base = packaged["out"], packaged["base"]
    assert package(session, out, "--force") == 0
    assert capsys.readouterr().out.startswith(f"packaged {base}\n")
    after = snapshot(out)
    # The tree was made again: the hand-written file inside it is gone, everything else packaged is back.
    assert not (base / "notes-inside.txt").exists()
    assert set(after) == set(packaged["before"]) - {"open/Acme/notes-inside.txt"}
    # What was not the submitter folder is untouched.
    for name in ("README.txt", "open/Other/keep.txt"):
        assert after[name] == packaged["before"][name]
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "full_accuracy_logs", "open"]
    assert sorted(p.name for p in (out / "open").iterdir()) == ["Acme", "Other"]  # no .old or staging folder


def test_force_that_fails_keeps_the_old_tree(session: dict, packaged: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """--force without --allow-invalid: refused before anything is replaced."""
    out = packaged["out"]
    assert run_cli("submission", "package", "--division", "open", "--submitter", "Acme", "--out", out,
                   "--results-dir", session["results"], "--force") == 1
    assert "refusing to package runs that are not submission-grade" in capsys.readouterr().err
    assert snapshot(out) == packaged["before"]
