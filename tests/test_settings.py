"""Settings precedence: mlperf.conf < model hints < scenario preset < user.conf < --set, and what LoadGen used."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.records.loadgen_logs import parse_summary
from mlharness.running.settings import build_settings
from tests.support import read_run, run_cli, scenario_root

HINTS = {"*": {"min_query_count": 5}, "Offline": {"target_qps": 10, "min_duration": 100}}


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    user_conf = tmp_path / "user.conf"
    user_conf.write_text("# comment\n*.Offline.min_duration = 300\nresnet50.Offline.target_qps = 33\n"
                         "other.Offline.target_qps = 99\n*.Server.target_qps = 77\n")
    settings = build_settings(scenario="Offline", mode="performance", conf_model="resnet50", model_name="m",
                              model_hints=HINTS, presets=["quick"], user_conf=user_conf,
                              overrides=["min_query_count=7", "max_batch_size=4"])
    # model hint (10) < user.conf for this model (33); other model's and other scenario's lines ignored
    assert settings.loadgen["target_qps"] == "33" and settings.origin["target_qps"] == "user.conf"
    # model hint (100) < quick preset (250) < user.conf (300)
    assert settings.loadgen["min_duration"] == "300"
    # preset quick Offline (1) < CLI (7)
    assert settings.loadgen["min_query_count"] == "7" and settings.origin["min_query_count"] == "cli"
    assert settings.harness == {"max_batch_size": 4}
    assert settings.layers == ["model", "preset:quick", "user.conf", "cli"]
    assert "resnet50.Offline.target_qps = 33" in settings.user_conf_text()


def test_preset_overrides_model_hints() -> None:
    settings = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m",
                              model_hints=HINTS, presets=["quick"])
    assert settings.loadgen["min_duration"] == "250" and settings.origin["min_duration"] == "preset:quick"
    assert settings.loadgen["target_qps"] == "10" and settings.origin["target_qps"] == "model"


@pytest.mark.parametrize("kwargs, message", [
    ({"overrides": ["no_such_key=1"]}, "--set no_such_key=1: unknown setting 'no_such_key'"),
    ({"overrides": ["target_qps"]}, "expected key=value"),
    ({"overrides": ["max_batch_size=zero"]}, "max_batch_size: expected an integer"),
    ({"overrides": ["workers=0"]}, "workers: expected an integer >= 1"),
    ({"scenario": "Nope"}, "--scenario: expected one of"),
    ({"mode": "find-peak"}, "only the Server scenario"),
])
def test_bad_settings_are_one_line_errors(kwargs: dict, message: str) -> None:
    args = {"scenario": "Offline", "mode": "performance", "conf_model": "m", "model_name": "m"} | kwargs
    with pytest.raises(UserError, match=message.replace("[", r"\[")):
        build_settings(**args)


def test_bad_user_conf_line_names_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.target_qps = 5\nthis is not a setting\n")
    with pytest.raises(UserError, match=r"user.conf: line 2: expected 'model.Scenario.key = value'"):
        build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m", user_conf=conf)


def test_loadgen_uses_the_merged_settings_and_they_are_saved(tmp_path: Path) -> None:
    user_conf = tmp_path / "user.conf"
    user_conf.write_text("*.SingleStream.min_query_count = 50\n*.SingleStream.min_duration = 200\n")
    assert run_cli("run", "null", "--scenario", "SingleStream", "--quick", "--user-conf", user_conf,
                   "--set", "min_duration=250", "--results-dir", tmp_path / "r") == 0
    root = scenario_root(tmp_path / "r", "null", "SingleStream")
    summary = parse_summary(root / "performance" / "run_1" / "mlperf_log_summary.txt")
    assert summary["raw"]["min_duration (ms)"] == 250  # CLI beat user.conf
    assert summary["raw"]["min_query_count"] == 50  # user.conf beat the quick preset
    saved = (root / "user.conf").read_text()
    assert "null.SingleStream.min_duration = 250" in saved and "null.SingleStream.min_query_count = 50" in saved
    record = read_run(tmp_path / "r", "null", "SingleStream")
    assert record["settings"]["origin"]["min_duration"] == "cli"
    assert record["settings"]["origin"]["min_query_count"] == "user.conf"


def _conf_problems(detail: Path) -> tuple[list[str], int]:
    from mlharness.records.loadgen_logs import detail_problems, detail_values

    errors = [e for e in detail_problems(detail)["errors"] if "conf" in e.lower()]
    return errors, detail_values(detail, ("effective_qsl_rng_seed",))["effective_qsl_rng_seed"]


def test_every_test_reads_mlperf_conf_once(tmp_path: Path) -> None:
    """LoadGen applies FromConfig once per process: submission mode reuses one TestSettings for its two
    tests, and a second run in the same process goes to a fresh process. No test may log
    'Multiple conf files are used' or lose mlperf.conf's seeds."""
    for results in (tmp_path / "first", tmp_path / "second"):
        assert run_cli("run", "null", "--scenario", "Offline", "--mode", "submission", "--quick",
                       "--results-dir", results) == 0
        root = scenario_root(results, "null", "Offline")
        for detail in (root / "accuracy" / "mlperf_log_detail.txt",
                       root / "performance" / "run_1" / "mlperf_log_detail.txt"):
            errors, seed = _conf_problems(detail)
            assert errors == [] and seed != 0, (detail, errors, seed)


def test_a_request_carries_its_user_conf_content(tmp_path: Path) -> None:
    """The request holds the user.conf's settings, not only its path: the run applies them even when
    the file is gone by the time the run's process reads the request (another process, a host)."""
    from mlharness import RunRequest, run
    from mlharness.running.resolve import resolved_for_run

    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.target_qps = 12345\n")
    # Read when resolved for the run (the launcher does it when the request is submitted), not when built.
    request = resolved_for_run(RunRequest(model="null", scenario="Offline", quick=True, user_conf=conf,
                                          results_dir=tmp_path / "results"))
    conf.unlink()
    record = run(request)
    assert record.settings["loadgen"]["target_qps"] == "12345" and record.settings["origin"]["target_qps"] == "user.conf"
