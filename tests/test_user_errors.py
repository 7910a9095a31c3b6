"""Mistakes a user can make are one line on stderr (`mlharness: error: ...`) and exit status 1, never a
traceback: LoadGen settings LoadGen would refuse or replace, a compliance comparison without a figure,
run records from a newer mlharness or cut short, a missing optional package, a TensorRT or CUDA
device the backend cannot use. Runs are short (--quick, the null model) and use the real LoadGen."""
from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from mlharness.errors import UserError, require
from mlharness.records import run_record
from mlharness.records.run_record import RUN_SCHEMA_VERSION, RunRecord
from mlharness.running.settings import build_settings, validate_loadgen_settings
from mlharness.submission import compliance
from mlharness.specs.manifests import load_manifest
from mlharness.sut import backends
from tests.support import REPO, detail_log, read_run, run_cli, scenario_root, tiny_torch_model, write_manifest


def one_error(capfd: pytest.CaptureFixture[str], prefix: str = "mlharness: error: ") -> str:
    """The single line on stderr (after the prefix); fails on a traceback or a second line."""
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(prefix), err
    return lines[0][len(prefix):]


def nothing_ran(results: Path) -> bool:
    return not list(results.glob("*/*/*/performance")) and not list(results.glob("*/*/*/failed-*"))


# ---- 1. LoadGen settings -------------------------------------------------------------------------

@pytest.mark.parametrize("scenario, setting, expected", [
    # LoadGen logs error_invalid_test_settings and runs with 1 instead
    ("Offline", "target_qps=-5", "--set target_qps=-5: target_qps: expected a number of queries per second > 0, "
                                 "got -5 (set by cli)"),
    ("Offline", "target_qps=fast", "target_qps: expected a number of queries per second > 0, got fast"),
    # strtoull wraps -5 round to 2^64-5 ms: LoadGen crashes (SIGSEGV)
    ("Offline", "min_duration=-5", "min_duration: expected a duration in whole ms >= 0, got -5"),
    ("Offline", "min_duration=1.5", "min_duration: expected a duration in whole ms >= 0, got 1.5"),
    ("Offline", "min_duration=010", "would read a leading 0 as octal"),
    # LoadGen reads percent and indexes its sorted latencies with it: 100 reads past the end
    ("SingleStream", "target_latency_percentile=100", "target_latency_percentile: expected a percentile in "
                                                      "percent, 0 < p < 100 (90 = p90), got 100"),
    ("SingleStream", "target_latency=0", "target_latency: expected a latency in ms > 0 and <= 9223372036854, got 0"),  # runs forever
    ("MultiStream", "samples_per_query=0", "samples_per_query: expected a sample count >= 1, got 0"),  # SIGSEGV
    ("Server", "target_latency=0.5", "target_latency: expected a latency in whole ms >= 1 (LoadGen reads "
                                     "Server's as an integer), got 0.5"),
    ("Offline", "performance_issue_unique=yes", "performance_issue_unique: expected 0 or 1 (or true/false), got yes"),
    ("Offline", "accuracy_log_rng_seed=18446744073709551616", "accuracy_log_rng_seed: expected a seed <= "
                                                             "18446744073709551615"),
    # read only from LoadGen's own mlperf.conf: the value would be ignored without a word
    ("Offline", "qsl_rng_seed=5", "qsl_rng_seed: cannot be set: LoadGen reads it only from its built-in mlperf.conf"),
    ("Server", "server_num_issue_query_threads=2", "server_num_issue_query_threads: cannot be set"),
    # a maximum below the --quick preset's minimum
    ("Offline", "max_duration=100", "--set max_duration=100: max_duration: expected 0 (no limit) or at least "
                                    "min_duration 250 ("),
])
def test_loadgen_settings_are_checked_before_the_run(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                     scenario: str, setting: str, expected: str) -> None:
    assert run_cli("run", "null", "--scenario", scenario, "--quick", "--set", setting,
                   "--results-dir", tmp_path) == 1
    message = one_error(capfd)
    assert expected in message
    assert message.endswith("(set by cli)")
    assert nothing_ran(tmp_path)


def test_a_maximum_below_a_preset_minimum_names_both_layers(tmp_path: Path,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--scenario", "SingleStream", "--quick", "--set", "max_query_count=10",
                   "--results-dir", tmp_path) == 1
    message = one_error(capfd)
    assert re.search(r"max_query_count: expected 0 \(no limit\) or at least min_query_count 32 "
                     r"\(\S*quick.yaml: \*, set by preset:quick\), got 10 \(set by cli\)$", message), message


def test_a_user_conf_value_that_is_not_a_number_names_the_file_and_line(tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.min_query_count = 5\n*.Offline.target_qps = fast\n")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--user-conf", conf,
                   "--results-dir", tmp_path / "r") == 1
    assert one_error(capfd) == (f"{conf}: line 2: target_qps: expected a number of queries per second > 0, "
                                f"got fast (set by user.conf)")


def test_a_preset_value_that_is_not_a_number_names_the_preset(tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("settings:\n  Offline:\n    min_query_count: many\n")
    assert run_cli("run", "null", "--scenario", "Offline", "--preset", preset, "--results-dir", tmp_path / "r") == 1
    assert one_error(capfd) == (f"{preset}: Offline: min_query_count: expected a query count >= 0, got many "
                                f"(set by preset:mine)")


def test_both_issue_modes_and_an_index_past_the_samples_are_refused() -> None:
    args = {"scenario": "Offline", "mode": "performance", "conf_model": "m", "model_name": "m"}
    with pytest.raises(UserError, match=r"performance_issue_same: expected 0 while performance_issue_unique 1"):
        build_settings(**args, overrides=["performance_issue_unique=1", "performance_issue_same=1"])
    with pytest.raises(UserError, match="performance_issue_same_index: expected a sample index below the "
                                        "performance sample count 5, got 5"):
        build_settings(**args, overrides=["performance_issue_same=1", "performance_issue_same_index=5",
                                          "performance_sample_count_override=5"])
    settings = build_settings(**args, overrides=["performance_issue_same=1", "performance_issue_same_index=9"])
    with pytest.raises(UserError, match="below the performance sample count 8, got 9"):
        validate_loadgen_settings(settings, performance_sample_count=8)  # the QSL's count, from the runner


def test_every_loadgen_key_has_a_rule() -> None:
    from mlharness.running import settings

    assert set(settings.LOADGEN_KEYS) == set(settings._LOADGEN_VALUES) | set(settings._IGNORED_KEYS)


def test_booleans_reach_loadgen_as_integers(tmp_path: Path) -> None:
    """LoadGen's FromConfig refuses `true` (its values are numbers); true/false are written as 1/0."""
    settings = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m",
                              model_hints={"Offline": {"print_timestamps": False}},
                              overrides=["performance_issue_unique=True"])
    assert settings.loadgen["performance_issue_unique"] == "1" and settings.loadgen["print_timestamps"] == "0"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "performance_issue_unique=true",
                   "--results-dir", tmp_path) == 0
    detail = (scenario_root(tmp_path, "null", "Offline") / "performance" / "run_1" / "mlperf_log_detail.txt")
    assert '"requested_performance_issue_unique", "value": true' in detail.read_text()


# ---- 2. compliance verdicts without a figure -----------------------------------------------------


@pytest.mark.parametrize("test, ref, got, reason", [
    ("TEST04", 0, 30e6, "the reference run has no positive score"),   # 1e9 / 0 was a ZeroDivisionError
    ("TEST04", 30e6, 0, "the test run has no positive score"),
    ("TEST01", 0, 0, "the reference and test runs have no positive score"),
    ("TEST04", "n/a", 30e6, "score missing from a detail log"),
])
def test_a_run_without_a_figure_fails_the_audit_with_the_reason(tmp_path: Path, test: str, ref: object,
                                                                got: object, reason: str) -> None:
    verdict = compliance.verify_performance(
        test, detail_log(tmp_path / "r.txt", "SingleStream", "early_stopping_latency_ss", ref, valid=False),
        detail_log(tmp_path / "t.txt", "SingleStream", "early_stopping_latency_ss", got, valid=False))
    assert not verdict.passed
    assert reason in verdict.text() and verdict.text().endswith("TEST FAIL\n")


def test_submission_run_whose_latency_run_has_no_figure_fails_the_audit(tmp_path: Path,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """32 SingleStream queries are too few for LoadGen's early stopping estimate: it logs 0 (as a short
    resnet50-light submission run does), and TEST04 compares rates, 1e9 / 0."""
    assert run_cli("submission", "run", "--model", "null", "--scenarios", "SingleStream", "--division", "closed",
                   "--quick", "--set", "max_query_count=32", "--set", "min_duration=0", "--compliance", "TEST04",
                   "--results-dir", tmp_path) == 1
    assert one_error(capfd, prefix="") == "compliance failed: SingleStream/TEST04"
    verify = (scenario_root(tmp_path, "null", "SingleStream") / "TEST04" / "verify_performance.txt").read_text()
    assert "reference score = 0\ntest score = 0\nno comparison: the reference and test runs have no positive score" \
        in verify and verify.endswith("TEST FAIL\n")


def test_a_malformed_accuracy_log_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text('[{"seq_id": 0, "data": "00"}]')
    with pytest.raises(UserError, match=r"mlperf_log_accuracy.json: entry 0: expected \{qsl_idx: integer, data"):
        compliance.verify_accuracy(log, log)


# ---- 3. run records: newer schema, truncated, migrated -------------------------------------------

def _record(run_id: str = "20260101T000000Z-abcdef", **fields: object) -> dict:
    return RunRecord(run_id=run_id, command="mlharness run null", model={"name": "null"}, dataset={}, backend="null",
                     scenario="Offline", mode="performance", status="ok", **fields).to_dict()


def test_import_refuses_a_newer_record_and_stores_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "runs"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    (folder / "a" / "run.json").write_text(json.dumps(_record("20260101T000000Z-aaaaaa")))
    newer = folder / "b" / "run.json"
    newer.write_text(json.dumps(_record("20260101T000000Z-bbbbbb") | {"schema_version": 7}))
    db = tmp_path / "db.sqlite"
    assert run_cli("results", "import", folder, "--db", db) == 1
    assert one_error(capfd) == (f"{newer}: schema_version 7 is newer than this mlharness reads "
                                f"({RUN_SCHEMA_VERSION}); upgrade mlharness")
    assert not db.exists()  # the good record beside it was not stored either


def test_import_refuses_a_truncated_record(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "run.json"
    cut.write_text(json.dumps(_record(), indent=1)[:200])
    assert run_cli("results", "import", cut, "--db", tmp_path / "db.sqlite") == 1
    message = one_error(capfd)
    assert message.startswith(f"{cut}: not valid JSON: line ") and "truncated" in message
    assert not (tmp_path / "db.sqlite").exists()


@pytest.mark.parametrize("change, expected", [
    ({"schema_version": None}, "schema_version: expected a run record's version"),
    ({"schema_version": "1"}, "schema_version: expected a run record's version"),
    ({"run_id": 5}, "run_id: expected a run id string, got 5"),
])
def test_a_record_with_a_bad_version_or_id_is_refused(tmp_path: Path, change: dict, expected: str) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_record() | change))
    with pytest.raises(UserError, match=re.escape(f"{path}: {expected}")):
        RunRecord.load(path)
    data = _record()
    del data["scenario"]
    with pytest.raises(UserError, match="here: scenario: missing"):
        RunRecord.from_json_dict(data, "here")


def test_older_records_are_migrated_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the results database migrates: MIGRATIONS[n] takes version n + 1 to n + 2, in order."""
    monkeypatch.setattr(run_record, "MIGRATIONS", [lambda d: d | {"command": d["command"] + " (from v1)"},
                                                   lambda d: d | {"backend": d["backend"].upper()}])
    monkeypatch.setattr(run_record, "RUN_SCHEMA_VERSION", 3)
    record = RunRecord.from_json_dict(_record() | {"schema_version": 1}, "old.json")
    assert (record.schema_version, record.command, record.backend) == (3, "mlharness run null (from v1)", "NULL")


def test_readers_that_write_a_record_back_keep_fields_they_do_not_know(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_record() | {"added_later": {"kept": True}}))
    assert run_record.read_record_file(path)["added_later"] == {"kept": True}
    assert not hasattr(RunRecord.load(path), "added_later")


def test_gate_refuses_a_newer_run_json(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    newer = tmp_path / "run.json"
    newer.write_text(json.dumps(_record() | {"schema_version": RUN_SCHEMA_VERSION + 1}))
    assert run_cli("gate", "--baseline", newer, "--candidate", newer, "--rule", "offline.samples_per_second:-5%",
                   "--results-dir", tmp_path) == 1
    assert "is newer than this mlharness reads" in one_error(capfd)


# ---- 4. optional packages ------------------------------------------------------------------------

def _hide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, package: str) -> None:
    """Make `package` missing here (None in sys.modules) and in child processes (a shadowing module
    on PYTHONPATH that raises ModuleNotFoundError as a missing package does)."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)
    shim = tmp_path / "shim" / package
    shim.mkdir(parents=True)
    message = f"No module named {package!r}"
    (shim / "__init__.py").write_text(f"raise ModuleNotFoundError({message!r}, name={package!r})\n")
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim.parent), str(REPO), *([inherited] if inherited else [])]))


def test_gate_statistics_without_scipy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    for side, values in (("base", (100.0, 101.0)), ("cand", (80.0, 81.0))):
        (tmp_path / side).mkdir()
        for i, value in enumerate(values):
            record = _record(f"2026010{i}T000000Z-{side}{i}", performance={"samples_per_second": value})
            (tmp_path / side / f"{i}.json").write_text(json.dumps(record))
    _hide(monkeypatch, tmp_path, "scipy")
    assert run_cli("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "cand", "--rule",
                   "offline.samples_per_second:-5%", "--results-dir", tmp_path) == 1
    assert one_error(capfd) == ("scipy is not installed (needed for the gate's Mann-Whitney U test); "
                                "pip install 'mlharness[gates]'")


def test_a_backend_without_its_framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    _hide(monkeypatch, tmp_path, "onnxruntime")
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--quick", "--results-dir", tmp_path / "r") == 1
    assert ("onnxruntime is not installed (needed for the onnxruntime backend); pip install "
            "'mlharness[onnxruntime]'") in one_error(capfd)


def test_require_names_a_broken_install_and_every_extra_it_names_exists() -> None:
    with pytest.raises(UserError, match=r"^no_such_pkg_x is not installed \(needed for testing\); "
                                        r"pip install 'mlharness\[gates\]'$"):
        require("no_such_pkg_x.sub", "gates", "testing")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set(backends._EXTRAS.values())
    for source in [*REPO.glob("harness/**/*.py"), *REPO.glob("sut/**/*.py")]:
        named |= set(re.findall(r"""require\(\s*["'][\w.]+["'],\s*["'](\w+)["']""", source.read_text()))
    assert named >= {"gates", "onnxruntime", "text"} and named <= set(extras), named - set(extras)
    assert any(dep.startswith("scipy==") for dep in extras["gates"])


# ---- 5. TensorRT in the hardware manifest --------------------------------------------------------

def _hardware(folder: Path, body: str, name: str = "trt.yaml") -> Path:
    return write_manifest(folder, name, "kind: hardware\nname: trt\nversion: 1.0.0\n" + textwrap.dedent(body))


def test_tensorrt_section_is_read_and_resolved(tmp_path: Path) -> None:
    path = _hardware(tmp_path, "device: cuda:1\ntensorrt: {enabled: true, fp16: true, engine_cache: trt-cache}\n")
    trt = load_manifest(path).tensorrt
    assert (trt.enabled, trt.fp16, trt.engine_cache) == (True, True, str(tmp_path / "trt-cache"))
    assert load_manifest(_hardware(tmp_path, "device: cuda:0\n", "plain.yaml")).tensorrt is None


@pytest.mark.parametrize("body, expected", [
    ("device: cuda:0\ntensorrt: true\n", "tensorrt: expected a mapping {enabled, fp16, engine_cache}, got True"),
    ("device: cuda:0\ntensorrt: {enabled: 'yes'}\n", "tensorrt.enabled: expected true or false, got 'yes'"),
    ("device: cuda:0\ntensorrt: {int8: true}\n", "tensorrt.int8: expected no such field (allowed: enabled, "
                                                 "engine_cache, fp16)"),
    ("device: cuda:0\ntensorrt: {engine_cache: ''}\n", "tensorrt.engine_cache: expected a folder for built engines "
                                                     "(relative to this file), got ''"),
    ("device: cpu\ntensorrt: {enabled: true}\n", "tensorrt.enabled: expected false on device cpu (TensorRT runs on "
                                                 "a cuda:N device), got True"),
])
def test_bad_tensorrt_fields_are_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str], body: str,
                                          expected: str) -> None:
    path = _hardware(tmp_path, body)
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--hardware", path,
                   "--results-dir", tmp_path / "r") == 1
    assert one_error(capfd) == f"{path}: {expected}"


def _ort_backend(hardware: Path):  # noqa: ANN202 - an OnnxRuntimeBackend, not loaded
    from mlharness.sut.backends.onnxruntime_backend import OnnxRuntimeBackend

    return OnnxRuntimeBackend(model=load_manifest(REPO / "specs" / "models" / "resnet50-light.yaml"), sources={},
                              hardware=load_manifest(hardware), options={})


def test_tensorrt_reaches_the_providers_with_its_options(tmp_path: Path) -> None:
    """The provider list a GPU build would get (this machine has none: the list is given)."""
    pytest.importorskip("onnxruntime")
    backend = _ort_backend(_hardware(tmp_path, "device: cuda:1\ntensorrt: {fp16: true, engine_cache: cache}\n"))
    every = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    names, options = backend._providers(every)
    assert names == every
    assert options == [{"device_id": 1, "trt_fp16_enable": True, "trt_engine_cache_enable": True,
                        "trt_engine_cache_path": str(tmp_path / "cache")}, {"device_id": 1}, {}]
    assert (tmp_path / "cache").is_dir()
    with pytest.raises(UserError, match=re.escape("trt.yaml: tensorrt: enabled, but onnxruntime ")
                       + r".*has no TensorrtExecutionProvider \(providers: CUDAExecutionProvider, CPUExecutionProvider\)"):
        backend._providers(every[1:])
    off = _ort_backend(_hardware(tmp_path, "device: cuda:0\ntensorrt: {enabled: false}\n", "off.yaml"))
    assert off._providers(every) == (every[1:], [{"device_id": 0}, {}])


def test_tensorrt_without_its_provider_here_names_the_manifest_and_providers(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has TensorRT")
    path = _hardware(tmp_path, "device: cuda:0\ntensorrt: {enabled: true}\n")
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--quick", "--hardware", path,
                   "--results-dir", tmp_path / "r") == 1
    message = one_error(capfd)
    assert f"{path}: " in message and "(providers: " in message and "CPUExecutionProvider" in message


# ---- 6. a device the backend does not support ----------------------------------------------------

def test_null_backend_on_a_cuda_device(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--backend", "null", "--hardware", "cuda0", "--scenario", "Offline", "--quick",
                   "--results-dir", tmp_path) == 1
    assert f"{REPO / 'specs' / 'hardware' / 'cuda0.yaml'}: device: the null backend runs on cpu only, got cuda:0" \
        in one_error(capfd)


def test_onnxruntime_without_cuda_on_a_cuda_device(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    assert run_cli("run", "resnet50-light", "--hardware", "cuda0", "--scenario", "Offline", "--quick",
                   "--results-dir", tmp_path) == 1
    message = one_error(capfd)
    assert "cuda0.yaml: device: cuda:0 needs onnxruntime with CUDAExecutionProvider, but no CUDA device is visible " \
           "to onnxruntime" in message
    assert f"(providers: {', '.join(ort.get_available_providers())})" in message


def test_torch_on_a_cuda_device_it_cannot_see(tmp_path: Path, specs_copy: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    write_manifest(specs_copy / "models", "tiny-torch.yaml", tiny_torch_model("tiny-torch"))
    device = f"cuda:{torch.cuda.device_count()}"  # one past the last device torch sees (cuda:0 without a GPU)
    hardware = _hardware(tmp_path, f"device: '{device}'\n", "gpu.yaml")
    assert run_cli("run", "tiny-torch", "--hardware", hardware, "--scenario", "Offline", "--quick",
                   "--results-dir", tmp_path / "r") == 1
    message = one_error(capfd)
    expected = "no CUDA device is visible to torch" if not torch.cuda.is_available() else "CUDA device(s)"
    assert f"{hardware}: device: " in message and expected in message and f"got {device}" in message


def test_the_backend_and_device_are_recorded_on_cpu(tmp_path: Path) -> None:
    assert run_cli("run", "resnet50-light", "--scenario", "Offline", "--quick", "--set", "min_duration=100",
                   "--results-dir", tmp_path) == 0
    info = read_run(tmp_path, "resnet50-light", "Offline")["backend_info"]
    assert info["providers"] == ["CPUExecutionProvider"] and info["provider_options"] == [{}]
    assert info["tensorrt"] is None and info["device"] == "cpu"
