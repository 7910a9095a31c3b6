"""Accuracy mode end to end with known answers, reference PASS/FAIL, and user code failing mid-run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import failing_null_model, read_run, run_cli, scenario_root, write_manifest


def _reference(folder: Path, top1: float, tolerance: float, outputs: str = "") -> Path:
    from mlharness.specs.manifests import load_manifest

    model = load_manifest(folder.parent / "models" / "null.yaml")
    dataset = load_manifest(folder.parent / "datasets" / "null-samples.yaml")
    return write_manifest(folder, "null-ref.yaml", f"""\
        kind: reference
        name: null-on-null-samples
        version: 1.0.0
        model: {{name: "null", version: 1.0.0, sha256: {model.sha256}}}
        dataset: {{name: null-samples, version: 1.0.0, sha256: {dataset.sha256}}}
        backend: "null"
        accuracy:
          top1: {{expected: {top1}, tolerance: {tolerance}}}
          top5: {{expected: 1.0, tolerance: 0.0}}
        {outputs}
        """)


def test_null_accuracy_known_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path) == 0
    root = scenario_root(tmp_path, "null", "Offline")
    text = (root / "accuracy" / "accuracy.txt").read_text().splitlines()
    # labels alternate 0/1 and every score ties, so class 0 ranks first: exactly half right at top-1
    assert text[0] == "accuracy=50.000%, good=512, total=1024"
    assert "top1=0.500000" in text and "top5=1.000000" in text
    entries = json.loads((root / "accuracy" / "mlperf_log_accuracy.json").read_text())
    assert len(entries) == 1024 and len(bytes.fromhex(entries[0]["data"])) == 4000
    record = read_run(tmp_path, "null", "Offline")
    assert record["accuracy"]["values"] == {"top1": 0.5, "top5": 1.0}
    assert "top1=0.5000" in capsys.readouterr().out


def test_reference_pass_and_fail_show_both_numbers(tmp_path: Path, specs_copy: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ref = _reference(specs_copy / "references", 0.5, 0.0,
                     "outputs:\n          - {sample: 3, values: [0.0, 0.0, 0.0], atol: 0.0}")
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path / "a") == 0
    text = (scenario_root(tmp_path / "a", "null", "Offline") / "accuracy" / "accuracy.txt").read_text()
    assert "top1: expected 0.500000 ± 0, measured 0.500000: PASS" in text
    assert "output of sample 3: max |diff| 0 (atol 0): PASS" in text and text.endswith("result=PASS\n")

    ref.write_text(ref.read_text().replace("expected: 0.5, tolerance: 0.0", "expected: 0.9, tolerance: 0.01"))
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path / "b") == 1
    text = (scenario_root(tmp_path / "b", "null", "Offline") / "accuracy" / "accuracy.txt").read_text()
    assert "top1: expected 0.900000 ± 0.01, measured 0.500000: FAIL" in text and text.endswith("result=FAIL\n")
    assert "reference : FAIL" in capsys.readouterr().out


def test_submission_mode_leaves_accuracy_and_performance(tmp_path: Path) -> None:
    assert run_cli("run", "null", "--scenario", "SingleStream", "--mode", "submission", "--quick",
                   "--results-dir", tmp_path) == 0
    root = scenario_root(tmp_path, "null", "SingleStream")
    assert (root / "accuracy" / "accuracy.txt").is_file()
    assert (root / "accuracy" / "mlperf_log_summary.txt").is_file()
    assert (root / "performance" / "run_1" / "mlperf_log_summary.txt").is_file()
    for name in ("measurements.json", "user.conf", "README.md", "run.json"):
        assert (root / name).stat().st_size > 0
    measurements = json.loads((root / "measurements.json").read_text())
    for key in ("input_data_types", "retraining", "starting_weights_filename", "weight_data_types",
                "weight_transformations"):
        assert measurements[key]
    assert "mlharness run null --scenario SingleStream --mode submission" in (root / "README.md").read_text()


@pytest.mark.parametrize("scenario", ["Offline", "Server", "SingleStream"])
def test_postprocess_raising_mid_run_ends_cleanly(tmp_path: Path, specs_copy: Path, scenario: str,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """One line on stderr, read from file descriptor 2: the run happens in a spawned child that
    writes to the inherited descriptors, which capsys (sys.stderr only) never sees."""
    write_manifest(specs_copy / "models", "flaky.yaml", failing_null_model(postprocess_calls=5))
    results = tmp_path / "r"
    assert run_cli("run", "flaky", "--scenario", scenario, "--quick", "--set", "min_duration=300",
                   "--results-dir", results) == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("mlharness: error: ") and "sample " in err
    assert "postprocess raised RuntimeError: postprocess blew up" in err
    failed = list(results.glob(f"*/flaky/{scenario}/failed-*"))
    assert len(failed) == 1
    record = json.loads((failed[0] / "run.json").read_text())
    assert record["status"] == "failed" and "postprocess blew up" in record["error"]
    # LoadGen's own logs up to the failure are kept
    assert (failed[0] / "performance" / "run_1" / "mlperf_log_detail.txt").stat().st_size > 0
    assert not list(results.glob(f"*/flaky/{scenario}/performance"))


def test_preprocess_failure_names_the_sample(tmp_path: Path, specs_copy: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "flaky.yaml", failing_null_model(bad_sample=17))
    assert run_cli("run", "flaky", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path) == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("mlharness: error: "), err
    assert "sample 17: preprocess raised ValueError: cannot read this one" in err


def test_failed_run_keeps_earlier_good_results(tmp_path: Path, specs_copy: Path) -> None:
    write_manifest(specs_copy / "models", "flaky.yaml", failing_null_model())
    assert run_cli("run", "flaky", "--scenario", "Offline", "--quick", "--results-dir", tmp_path) == 0
    root = scenario_root(tmp_path, "flaky", "Offline")
    good_summary = (root / "performance" / "run_1" / "mlperf_log_summary.txt").read_bytes()
    good_run = json.loads((root / "run.json").read_text())
    write_manifest(specs_copy / "models", "flaky.yaml", failing_null_model(postprocess_calls=2))
    assert run_cli("run", "flaky", "--scenario", "Offline", "--quick", "--results-dir", tmp_path) == 1
    assert (root / "performance" / "run_1" / "mlperf_log_summary.txt").read_bytes() == good_summary
    assert json.loads((root / "run.json").read_text())["run_id"] == good_run["run_id"]
    assert len(list(root.glob("failed-*"))) == 1


def test_reference_notes_a_changed_manifest_and_ignores_other_versions(tmp_path: Path, specs_copy: Path) -> None:
    ref = _reference(specs_copy / "references", 0.5, 0.0)
    model_file = specs_copy / "models" / "null.yaml"
    model_file.write_text(model_file.read_text() + "# edited after the reference was made\n")
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path / "a") == 0
    text = (scenario_root(tmp_path / "a", "null", "Offline") / "accuracy" / "accuracy.txt").read_text()
    assert "note: the reference was made with model null@1.0.0 sha256" in text and "result=PASS" in text

    ref.write_text(ref.read_text().replace('model: {name: "null", version: 1.0.0', 'model: {name: "null", version: 0.9.0'))
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path / "b") == 0
    record = read_run(tmp_path / "b", "null", "Offline")
    assert record["reference"] is None and record["accuracy"]["verdict"] is None
