"""The rules of mlharness.running.settings as tables of known answers, called in-process: what each
LoadGen key and harness key accepts and the one-line error for what it refuses, the pairs checked
together, user.conf and preset parsing, the layers' precedence and the record of where each key came
from, and the merged user.conf text LoadGen reads. The one LoadGen call (apply_to_loadgen, once per
process) runs in a child process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mlharness.errors import UserError
from mlharness.running.presets import load_preset, scenarios_root
from mlharness.running.settings import (
    HARNESS_DEFAULTS,
    HARNESS_KEYS,
    LOADGEN_KEYS,
    MODES,
    PROTECTED_KEYS,
    SCENARIOS,
    Settings,
    build_settings,
    parse_user_conf,
    validate_loadgen_settings,
)
from tests.support import REPO

MAX_MS = (2**63 - 1) // 10**6  # 9223372036854: LoadGen's signed 64-bit nanoseconds, in ms
U64 = 2**64 - 1


def error(call: Any, *args: Any, **kwargs: Any) -> str:
    """The UserError's one line, or '' when the call is accepted."""
    try:
        call(*args, **kwargs)
    except UserError as exc:
        text = str(exc)
        assert "\n" not in text, text
        return text
    return ""


def cli(scenario: str, *sets: str, count: int | None = None) -> str:
    """The error for these `--set key=value` flags in a scenario ('' when accepted)."""
    settings = Settings(scenario=scenario, mode="performance", conf_model="m")
    for item in sets:
        key, _, value = item.partition("=")
        settings.set(key, value, "cli", f"--set {item}")
    return error(validate_loadgen_settings, settings, performance_sample_count=count)


def refused(item: str, expected: str, got: str | None = None) -> str:
    """The message for one refused `--set key=value`."""
    key, _, value = item.partition("=")
    return f"--set {item}: {key}: expected {expected}, got {value if got is None else got} (set by cli)"


# ---- LoadGen values, one key at a time ------------------------------------------------------------

QPS = "a number of queries per second > 0"
LAT = f"a latency in ms > 0 and <= {MAX_MS}"
SERVER_LAT = "a latency in whole ms >= 1 (LoadGen reads Server's as an integer)"
PCT = "a percentile in percent, 0 < p < 100 (90 = p90)"
OCTAL = " (LoadGen would read a leading 0 as octal)"

LOADGEN_VALUES = [
    # scenario, --set, expected (None: accepted)
    ("Offline", "target_qps=0.5", None),
    ("Offline", "target_qps=1e3", None),
    ("Offline", "target_qps=+3", None),
    ("Offline", "target_qps=.5", None),
    ("Offline", "target_qps=5.", None),
    ("Offline", "target_qps=0", QPS),
    ("Offline", "target_qps=-5", QPS),
    ("Offline", "target_qps=fast", QPS),
    ("Offline", "target_qps=inf", QPS),
    ("Offline", "target_qps=1e400", QPS),  # strtod overflows to inf
    ("Offline", "target_qps=nan", QPS),
    ("Offline", "target_qps=1e30", None),  # no ceiling on a rate
    ("SingleStream", "target_latency=0.01", None),
    ("SingleStream", f"target_latency={MAX_MS}", None),
    ("SingleStream", f"target_latency={MAX_MS + 1}", LAT),
    ("SingleStream", "target_latency=0", LAT),
    ("MultiStream", "target_latency=-1", LAT),
    ("Server", "target_latency=1", None),
    ("Server", f"target_latency={MAX_MS}", None),
    ("Server", "target_latency=0", SERVER_LAT),
    ("Server", "target_latency=0.5", SERVER_LAT),
    ("Server", "target_latency=010", SERVER_LAT + OCTAL),
    ("Server", f"target_latency={MAX_MS + 1}", f"a latency in whole ms <= {MAX_MS} (LoadGen reads Server's as an integer)"),
    ("Server", "ttft_latency=1", None),
    ("Server", "ttft_latency=0", "a latency in whole ms >= 1"),
    ("Server", f"ttft_latency={MAX_MS + 1}", f"a latency in whole ms <= {MAX_MS}"),
    ("Server", "tpot_latency=1", None),
    ("Server", "tpot_latency=0.5", "a latency in whole ms >= 1"),
    ("SingleStream", "target_latency_percentile=90", None),
    ("SingleStream", "target_latency_percentile=0.1", None),
    ("SingleStream", "target_latency_percentile=99.99", None),
    ("SingleStream", "target_latency_percentile=0", PCT),
    ("SingleStream", "target_latency_percentile=100", PCT),
    ("SingleStream", "target_latency_percentile=high", PCT),
    ("Offline", "min_duration=0", None),
    ("Offline", f"min_duration={MAX_MS}", None),
    ("Offline", f"min_duration={MAX_MS + 1}", f"a duration in whole ms <= {MAX_MS}"),
    ("Offline", "min_duration=-5", "a duration in whole ms >= 0"),
    ("Offline", "min_duration=1.5", "a duration in whole ms >= 0"),
    ("Offline", "min_duration=010", "a duration in whole ms >= 0" + OCTAL),
    ("Offline", "max_duration=0", None),
    ("Offline", "max_duration=1e3", "a duration in whole ms (0 = no limit) >= 0"),
    ("Offline", "min_query_count=0", None),
    ("Offline", f"min_query_count={U64}", None),
    ("Offline", f"min_query_count={U64 + 1}", f"a query count <= {U64}"),
    ("Offline", "min_query_count=many", "a query count >= 0"),
    ("Offline", f"max_query_count={U64 + 1}", f"a query count (0 = no limit) <= {U64}"),
    ("MultiStream", "samples_per_query=1", None),
    ("MultiStream", "samples_per_query=0", "a sample count >= 1"),
    ("MultiStream", "samples_per_query=-1", "a sample count >= 1"),
    ("Offline", "performance_sample_count_override=0", None),
    ("Offline", "performance_sample_count_override=x", "a sample count (0 = the dataset's) >= 0"),
    ("Offline", "performance_issue_same_index=0", None),
    ("Offline", "performance_issue_same_index=-1", "a sample index >= 0"),
    ("Server", "max_async_queries=0", None),
    ("Server", "max_async_queries=1.0", "a query count (0 = no limit) >= 0"),
    ("Offline", "accuracy_log_sampling_target=7", None),
    ("Offline", "accuracy_log_sampling_target=-7", "a sample count >= 0"),
    ("Server", "token_latency_scaling_factor=1", None),
    ("Server", "token_latency_scaling_factor=0", "a token count >= 1"),
    ("Offline", "accuracy_log_rng_seed=0", None),
    ("Offline", f"accuracy_log_rng_seed={U64}", None),
    ("Offline", f"accuracy_log_rng_seed={U64 + 1}", f"a seed <= {U64}"),
    ("Offline", "accuracy_log_rng_seed=-1", "an unsigned 64-bit integer"),
    ("Offline", "accuracy_log_rng_seed=007", "an unsigned 64-bit integer" + OCTAL),
    # the value as the user wrote it: whitespace inside or nothing at all is quoted
    ("Offline", "target_qps=1 2", (QPS, "'1 2'")),
    ("Offline", "min_query_count=", ("a query count >= 0", "''")),
]
BOOLEANS = ["performance_issue_unique", "performance_issue_same", "coalesce_queries", "print_timestamps",
            "sample_concatenate_permutation", "use_token_latencies", "infer_token_latencies"]
LOADGEN_VALUES += [("Server", f"{key}={value}", None) for key in BOOLEANS for value in ("0", "1", "true", "False")]
LOADGEN_VALUES += [("Server", f"{key}={value}", "0 or 1 (or true/false)") for key in BOOLEANS for value in ("yes", "2")]


@pytest.mark.parametrize("scenario, item, expected", LOADGEN_VALUES)
def test_each_loadgen_value_is_accepted_or_refused_in_one_line(scenario: str, item: str, expected: Any) -> None:
    if expected is None:
        assert cli(scenario, item) == ""
    elif isinstance(expected, tuple):
        assert cli(scenario, item) == refused(item, *expected)
    else:
        assert cli(scenario, item) == refused(item, expected)


IGNORED = {key: "LoadGen reads it only from its built-in mlperf.conf, so a value here would be ignored"
           for key in ("qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed", "accuracy_log_probability",
                       "test05", "test05_qsl_rng_seed", "test05_sample_index_rng_seed", "test05_schedule_rng_seed")}
IGNORED["server_num_issue_query_threads"] = ("LoadGen's FromConfig never reads it (and the SUT registers no issue "
                                             "threads), so a value here would be ignored")


@pytest.mark.parametrize("key", sorted(IGNORED))
def test_a_key_loadgen_would_ignore_cannot_be_set(key: str) -> None:
    assert cli("Server", f"{key}=5") == f"--set {key}=5: {key}: cannot be set: {IGNORED[key]} (set by cli)"


def test_every_loadgen_key_is_either_checked_or_refused() -> None:
    checked = {item.partition("=")[0] for _, item, _ in LOADGEN_VALUES}
    assert checked | set(IGNORED) == set(LOADGEN_KEYS)


def test_the_first_bad_key_in_name_order_is_the_one_named() -> None:
    assert cli("Offline", "target_qps=0", "min_duration=-1") == refused("min_duration=-1", "a duration in whole ms >= 0")


def test_a_key_set_without_a_layer_is_blamed_on_an_unknown_one() -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m", loadgen={"target_qps": "0"})
    assert error(validate_loadgen_settings, settings) == f"?: target_qps: expected {QPS}, got 0 (set by ?)"
    settings.origin["target_qps"] = "model"  # a layer but no place: the layer stands for the place
    assert error(validate_loadgen_settings, settings) == f"model: target_qps: expected {QPS}, got 0 (set by model)"


# ---- pairs ------------------------------------------------------------------------------------------

def at_least(low: str, value: str) -> str:
    return f"0 (no limit) or at least {low} {value} (--set {low}={value}, set by cli)"


@pytest.mark.parametrize("scenario, sets, expected", [
    ("Offline", ["min_duration=10", "max_duration=5"], refused("max_duration=5", at_least("min_duration", "10"))),
    ("Offline", ["min_duration=10", "max_duration=10"], ""),
    ("Offline", ["min_duration=10", "max_duration=11"], ""),
    ("Offline", ["min_duration=10", "max_duration=0"], ""),  # 0: no limit
    ("Offline", ["max_duration=5"], ""),
    ("Offline", ["min_duration=5"], ""),
    ("Server", ["min_query_count=10", "max_query_count=9"], refused("max_query_count=9", at_least("min_query_count", "10"))),
    ("SingleStream", ["min_query_count=10", "max_query_count=9"], refused("max_query_count=9", at_least("min_query_count", "10"))),
    ("MultiStream", ["min_query_count=10", "max_query_count=10"], ""),
    ("Server", ["min_query_count=10", "max_query_count=0"], ""),
    # Offline's one query holds min_query_count samples: a smaller maximum query count is fine
    ("Offline", ["min_query_count=10", "max_query_count=9"], ""),
    ("Offline", ["min_query_count=10", "max_query_count=9", "min_duration=10", "max_duration=9"],
     refused("max_duration=9", at_least("min_duration", "10"))),
    ("Offline", ["performance_issue_unique=1", "performance_issue_same=1"],
     refused("performance_issue_same=1", "0 while performance_issue_unique 1 (--set performance_issue_unique=1, "
                                          "set by cli) (LoadGen refuses both)")),
    ("Offline", ["performance_issue_unique=true", "performance_issue_same=True"],
     refused("performance_issue_same=True", "0 while performance_issue_unique 1 (--set performance_issue_unique=true, "
                                            "set by cli) (LoadGen refuses both)", got="1")),
    ("Offline", ["performance_issue_unique=1", "performance_issue_same=0"], ""),
    ("Offline", ["performance_issue_unique=0", "performance_issue_same=1"], ""),
])
def test_settings_that_only_make_sense_together(scenario: str, sets: list[str], expected: str) -> None:
    assert cli(scenario, *sets) == expected


def index_refused(index: int, count: int) -> str:
    return refused(f"performance_issue_same_index={index}", f"a sample index below the performance sample count {count}")


@pytest.mark.parametrize("sets, count, expected", [
    (["performance_issue_same=1", "performance_issue_same_index=5", "performance_sample_count_override=5"], None,
     index_refused(5, 5)),
    (["performance_issue_same=1", "performance_issue_same_index=4", "performance_sample_count_override=5"], None, ""),
    (["performance_issue_same=1", "performance_issue_same_index=9"], 8, index_refused(9, 8)),  # the QSL's count
    (["performance_issue_same=1", "performance_issue_same_index=8"], 8, index_refused(8, 8)),
    (["performance_issue_same=1", "performance_issue_same_index=7"], 8, ""),
    (["performance_issue_same=1", "performance_issue_same_index=9"], None, ""),  # count not known yet
    # the override is the count LoadGen uses, whatever the QSL's; an override of 0 means the QSL's
    (["performance_issue_same=1", "performance_issue_same_index=9", "performance_sample_count_override=20"], 8, ""),
    (["performance_issue_same=1", "performance_issue_same_index=9", "performance_sample_count_override=4"], 20,
     index_refused(9, 4)),
    (["performance_issue_same=1", "performance_issue_same_index=9", "performance_sample_count_override=0"], 8,
     index_refused(9, 8)),
    # the index matters only when the same sample is issued
    (["performance_issue_same=0", "performance_issue_same_index=9", "performance_sample_count_override=5"], 5, ""),
    (["performance_issue_same_index=9", "performance_sample_count_override=5"], 5, ""),
])
def test_the_same_index_must_be_below_the_sample_count(sets: list[str], count: int | None, expected: str) -> None:
    assert cli("Offline", *sets, count=count) == expected


# ---- harness values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, expected", [
    ("max_batch_size", "4", 4), ("max_batch_size", 4, 4), ("max_batch_size", "1", 1),
    ("workers", "2", 2), ("workers", 1, 1),
    ("intra_op_threads", "0", 0), ("inter_op_threads", 3, 3), ("dataset_limit", "1", 1), ("dataset_limit", "10", 10),
    ("warmup_queries", "0", 0), ("warmup_queries", "4", 4),
    ("warmup_seconds", "0", 0.0), ("warmup_seconds", "1.5", 1.5), ("warmup_seconds", 2, 2.0),
    ("load_timeout", "0.5", 0.5), ("load_timeout", "600", 600.0),
    ("enable_trace", "1", True), ("enable_trace", "true", True), ("enable_trace", "YES", True),
    ("enable_trace", "On", True), ("enable_trace", True, True),
    ("enable_trace", "0", False), ("enable_trace", "false", False), ("enable_trace", "no", False),
    ("enable_trace", False, False), ("endpoint_binary", "off", False), ("endpoint_model", " resnet ", "resnet"),
])
def test_a_harness_value_is_read_as_its_kind(key: str, value: Any, expected: Any) -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m")
    settings.set(key, value, "cli", f"--set {key}={value}")
    assert settings.harness == {key: expected} and type(settings.harness[key]) is type(expected)
    assert settings.loadgen == {} and settings.origin == {key: "cli"} and settings.where == {key: f"--set {key}={value}"}


@pytest.mark.parametrize("key, value, expected", [
    ("max_batch_size", "0", "expected an integer >= 1, got 0"),
    ("max_batch_size", "-3", "expected an integer >= 1, got -3"),
    ("max_batch_size", "zero", "expected an integer, got 'zero'"),
    ("max_batch_size", "1.5", "expected an integer, got '1.5'"),
    ("max_batch_size", None, "expected an integer, got None"),
    ("max_batch_size", float("inf"), "expected an integer, got inf"),
    ("workers", "0", "expected an integer >= 1, got 0"),
    ("intra_op_threads", "-1", "expected an integer >= 0, got -1"),
    ("inter_op_threads", "x", "expected an integer, got 'x'"),
    ("dataset_limit", "-1", "expected an integer >= 1 (the first N samples of the dataset; leave it unset for all of "
                            "them), got -1"),
    ("dataset_limit", "0", "expected an integer >= 1 (the first N samples of the dataset; leave it unset for all of "
                           "them), got 0"),
    ("warmup_queries", "-1", "expected an integer >= 0, got -1"),
    ("warmup_seconds", "-0.5", "expected a number of seconds >= 0, got -0.5"),
    ("warmup_seconds", "soon", "expected a number of seconds, got 'soon'"),
    ("warmup_seconds", "nan", "expected a number of seconds, got 'nan'"),
    ("warmup_seconds", "inf", "expected a number of seconds, got 'inf'"),
    ("load_timeout", "0", "expected a number of seconds > 0, got 0"),
    ("load_timeout", "-1", "expected a number of seconds > 0, got -1"),
    ("load_timeout", "-inf", "expected a number of seconds, got '-inf'"),
    ("load_timeout", None, "expected a number of seconds, got None"),
    ("enable_trace", "2", "expected true or false, got '2'"),  # a boolean never read as false by default
    ("cuda_graphs", "maybe", "expected true or false, got 'maybe'"),
    ("endpoint_model", "a b", "expected a model name without spaces, got 'a b'"),
    ("endpoint_timeout", "0", "expected a number of seconds > 0, got 0"),
])
def test_a_bad_harness_value_is_one_line(key: str, value: Any, expected: str) -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m")
    assert error(settings.set, key, value, "cli", "WHERE") == f"WHERE: {key}: {expected}"
    assert settings.harness == {} and settings.origin == {} and settings.where == {}


def test_the_harness_defaults_are_valid_values_of_their_keys() -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m")
    for key, value in HARNESS_DEFAULTS.items():
        settings.set(key, value, "default", "default")
    assert settings.harness == HARNESS_DEFAULTS and set(HARNESS_DEFAULTS) <= HARNESS_KEYS


def test_an_unknown_key_names_the_closest_known_one() -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m")
    assert error(settings.set, "max_batch", 4, "cli", "--set max_batch=4") == \
        "--set max_batch=4: unknown setting 'max_batch' (did you mean 'max_batch_size'?)"
    assert error(settings.set, "qps", 4, "cli", "--set qps=4") == \
        "--set qps=4: unknown setting 'qps' (not a LoadGen user.conf key or a harness key; README lists them)"
    assert settings.origin == {} and settings.where == {}


# ---- LoadGen text, the merged user.conf, the record -----------------------------------------------------

@pytest.mark.parametrize("key, value, text", [
    ("print_timestamps", True, "1"), ("print_timestamps", False, "0"), ("coalesce_queries", "TRUE", "1"),
    ("coalesce_queries", "false", "0"), ("use_token_latencies", 1, "1"), ("use_token_latencies", "yes", "yes"),
    ("target_qps", 12.5, "12.5"), ("target_qps", "true", "true"),  # not a boolean key: as written
    ("min_query_count", 7, "7"),
])
def test_loadgen_values_become_user_conf_text(key: str, value: Any, text: str) -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m")
    settings.set(key, value, "model", "there")
    assert settings.loadgen == {key: text} and settings.harness == {}
    assert settings.origin == {key: "model"} and settings.where == {key: "there"}


def test_the_merged_user_conf_names_the_layers_and_holds_each_key_once_sorted() -> None:
    settings = build_settings(scenario="Server", mode="performance", conf_model="resnet50", model_name="rn",
                              model_hints={"Server": {"target_qps": 10, "target_latency": 15}},
                              overrides=["target_qps=20", "min_duration=100", "workers=2"])
    assert settings.user_conf_text() == ("# written by mlharness: layers mlperf.conf < model < cli\n"
                                         "resnet50.Server.min_duration = 100\n"
                                         "resnet50.Server.target_latency = 15\n"
                                         "resnet50.Server.target_qps = 20\n")
    empty = Settings(scenario="Offline", mode="accuracy", conf_model="m")
    assert empty.user_conf_text() == "# written by mlharness: layers mlperf.conf\n"


def test_the_record_holds_what_was_set_and_by_which_layer() -> None:
    settings = build_settings(scenario="Offline", mode="accuracy", conf_model="resnet50", model_name="rn",
                              model_hints={"*": {"target_qps": 10}}, overrides=["max_batch_size=8"])
    record = settings.as_record()
    assert record == {"scenario": "Offline", "mode": "accuracy", "conf_model": "resnet50",
                      "loadgen": {"target_qps": "10"}, "harness": {"max_batch_size": 8},
                      "origin": {"target_qps": "model", "max_batch_size": "cli"},
                      "layers": ["mlperf.conf", "model", "cli"]}
    assert json.loads(json.dumps(record)) == record
    record["loadgen"]["target_qps"] = "1"
    record["harness"].clear()
    record["origin"].clear()
    record["layers"].append("x")
    assert settings.loadgen == {"target_qps": "10"} and settings.harness == {"max_batch_size": 8}
    assert settings.origin == {"target_qps": "model", "max_batch_size": "cli"} and settings.layers == ["model", "cli"]


def test_overridden_protected_keys_are_listed_sorted() -> None:
    settings = Settings(scenario="Offline", mode="performance", conf_model="m")
    assert settings.overridden_protected() == []
    for key in ("target_qps", "min_query_count", "workers", "accuracy_log_rng_seed", "min_duration"):
        settings.set(key, 5, "cli", "x")
    assert settings.overridden_protected() == ["accuracy_log_rng_seed", "min_duration", "min_query_count"]
    every = Settings(scenario="Offline", mode="performance", conf_model="m")
    for key in sorted(LOADGEN_KEYS):
        every.set(key, 1, "cli", "x")
    assert every.overridden_protected() == sorted(PROTECTED_KEYS)


# ---- user.conf ------------------------------------------------------------------------------------------

USER_CONF = """\
# a comment line

*.Offline.target_qps = 5
resnet50.Offline.min_duration = 300   # the conf model
rn.Offline.min_query_count=7
rn.*.max_query_count = 9
*.*.print_timestamps = 1
other.Offline.target_qps = 99
*.Server.target_qps = 77
*.Offline.performance_issue_same_index = 1 = 2
*.Offline.max_duration = 8 # a comment # with a second mark
"""


def test_user_conf_lines_for_this_model_and_scenario(tmp_path: Path) -> None:
    path = tmp_path / "user.conf"
    path.write_text(USER_CONF)
    expected = [("target_qps", "5", 3), ("min_duration", "300", 4), ("min_query_count", "7", 5),
                ("max_query_count", "9", 6), ("print_timestamps", "1", 7), ("performance_issue_same_index", "1 = 2", 10),
                ("max_duration", "8", 11)]
    assert parse_user_conf(path, "resnet50", "rn", "Offline") == expected
    # the content a request carries is read instead of the file
    assert parse_user_conf(tmp_path / "gone.conf", "resnet50", "rn", "Offline", text=USER_CONF) == expected
    assert parse_user_conf(path, "resnet50", "rn", "Server") == [
        ("max_query_count", "9", 6), ("print_timestamps", "1", 7), ("target_qps", "77", 9)]
    assert parse_user_conf(path, "other", "x", "Offline") == [
        ("target_qps", "5", 3), ("print_timestamps", "1", 7), ("target_qps", "99", 8),
        ("performance_issue_same_index", "1 = 2", 10), ("max_duration", "8", 11)]
    assert parse_user_conf(path, "m", "m", "Offline", text="") == []


@pytest.mark.parametrize("line", [
    "this is not a setting", "*.Offline.target_qps", "Offline.target_qps = 5", "a.b.Offline.target_qps = 5",
    "*.Offline.target_qps =", "*.Offline.target_qps =   # no value", "= 5",
])
def test_a_malformed_user_conf_line_names_the_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "user.conf"
    text = f"*.Offline.min_duration = 1\n\n  {line}  \n"
    assert error(parse_user_conf, path, "m", "m", "Offline", text=text) == \
        f"{path}: line 3: expected 'model.Scenario.key = value', got {line!r}"


def test_a_malformed_line_for_another_model_is_refused_too(tmp_path: Path) -> None:
    text = "other.Server.target_qps\n"
    assert "line 1: expected" in error(parse_user_conf, tmp_path / "u", "m", "m", "Offline", text=text)


def test_an_unreadable_user_conf_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.conf"
    assert error(parse_user_conf, missing, "m", "m", "Offline") == \
        f"{missing}: cannot read user.conf: No such file or directory"
    assert error(parse_user_conf, tmp_path, "m", "m", "Offline") == f"{tmp_path}: cannot read user.conf: Is a directory"


# ---- presets -----------------------------------------------------------------------------------------------

@pytest.fixture
def presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "presets"
    folder.mkdir()
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(folder))
    (folder / "fast.yaml").write_text("settings:\n  '*': {min_duration: 5, min_query_count: 3}\n"
                                      "  Offline: {min_duration: 7}\n  Server:\n")
    (folder / "bare.yaml").write_text("description: no settings\n")
    (folder / "list.yaml").write_text("- 1\n- 2\n")
    (folder / "flat.yaml").write_text("settings: [min_duration]\n")
    (folder / "scalar.yaml").write_text("settings:\n  Offline: 5\n")
    (folder / "unknown.yaml").write_text("settings:\n  Offline: {min_durations: 5}\n")
    (folder / "scope.yaml").write_text("settings:\n  Offlne: {min_duration: 5}\n")
    (folder / "two.yaml").write_text("settings:\n  Offlne: {min_duration: 5}\n  Server: {min_duration: [5]}\n")
    return folder


def test_a_preset_is_found_by_name_in_the_scenarios_folder_or_by_path(presets: Path) -> None:
    assert scenarios_root() == presets
    assert load_preset("fast") == {"path": presets / "fast.yaml", "settings": {
        "*": {"min_duration": 5, "min_query_count": 3}, "Offline": {"min_duration": 7}, "Server": None}}
    assert load_preset(str(presets / "fast.yaml"))["path"] == presets / "fast.yaml"
    assert load_preset("bare") == {"path": presets / "bare.yaml", "settings": {}}


def test_the_shipped_presets_are_found_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHARNESS_SCENARIOS", raising=False)
    import mlharness.scenarios

    # The shipped package's folder: scenarios/ in a checkout, mlharness/scenarios/ in a mutation run's tree.
    assert scenarios_root() == Path(mlharness.scenarios.__file__).parent
    assert load_preset("quick")["settings"]["*"] == {"min_duration": 250, "min_query_count": 32}


@pytest.mark.parametrize("name, expected", [
    ("nope", "{folder}/nope.yaml: no such scenario preset"),
    ("{folder}/nope.yml", "{folder}/nope.yml: no such scenario preset"),
    ("list", "{folder}/list.yaml: <document>: expected a mapping {{description, settings}}, got [1, 2]"),
    ("flat", "{folder}/flat.yaml: settings: expected a mapping Scenario|'*' -> {{key: value}}, got ['min_duration']"),
    ("scalar", "{folder}/scalar.yaml: settings.Offline: expected a mapping, got 5"),
    ("unknown", "{folder}/unknown.yaml: settings.Offline.min_durations: expected a setting name (did you mean "
                "'min_duration'?), got 'min_durations'"),
    ("scope", "{folder}/scope.yaml: settings.Offlne: expected one of *, SingleStream, MultiStream, Server, Offline, "
              "got 'Offlne'"),
])
def test_a_bad_preset_is_one_line_a_problem(presets: Path, name: str, expected: str) -> None:
    assert error(load_preset, name.format(folder=presets)).startswith(expected.format(folder=presets))


def test_a_preset_applies_star_then_the_scenario_and_records_where(presets: Path) -> None:
    offline = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m", presets=["fast"])
    assert offline.loadgen == {"min_duration": "7", "min_query_count": "3"}
    assert offline.origin == {"min_duration": "preset:fast", "min_query_count": "preset:fast"}
    assert offline.where == {"min_duration": f"{presets}/fast.yaml: Offline", "min_query_count": f"{presets}/fast.yaml: *"}
    assert offline.layers == ["preset:fast"]
    server = build_settings(scenario="Server", mode="performance", conf_model="m", model_name="m", presets=["fast"])
    assert server.loadgen == {"min_duration": "5", "min_query_count": "3"}  # an empty scenario entry sets nothing


def test_every_problem_of_a_preset_is_named_at_once(presets: Path) -> None:
    with pytest.raises(UserError) as caught:
        load_preset("two")
    assert str(caught.value).splitlines() == [
        f"{presets}/two.yaml: settings.Offlne: expected one of *, SingleStream, MultiStream, Server, Offline, "
        "got 'Offlne'",
        f"{presets}/two.yaml: settings.Server.min_duration: expected a number, a string or true/false, got [5]"]


def test_later_presets_override_earlier_ones(presets: Path) -> None:
    (presets / "slow.yaml").write_text("settings:\n  '*': {min_duration: 9}\n")
    settings = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m",
                              presets=["fast", str(presets / "slow.yaml")])
    assert settings.loadgen == {"min_duration": "9", "min_query_count": "3"}
    assert settings.layers == ["preset:fast", "preset:slow"]


# ---- layering -----------------------------------------------------------------------------------------

def test_each_layer_is_recorded_with_where_it_set_each_key(tmp_path: Path, presets: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.min_query_count = 11\nrn.Offline.max_batch_size = 2\n")  # rn: the model's name
    settings = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="rn",
                              model_hints={"*": {"target_qps": 10, "min_duration": 1, "max_batch_size": 1},
                                           "Offline": {"target_qps": 20}, "Server": {"target_qps": "bad"}},
                              presets=["fast"], user_conf=conf, overrides=[" target_qps = 30 ", "workers=3"])
    assert settings.loadgen == {"target_qps": "30", "min_duration": "7", "min_query_count": "11"}
    assert settings.harness == {"max_batch_size": 2, "workers": 3}
    assert settings.origin == {"target_qps": "cli", "min_duration": "preset:fast", "min_query_count": "user.conf",
                               "max_batch_size": "user.conf", "workers": "cli"}
    assert settings.where == {"target_qps": "--set  target_qps = 30 ", "min_duration": f"{presets}/fast.yaml: Offline",
                              "min_query_count": f"{conf}: line 1", "max_batch_size": f"{conf}: line 2",
                              "workers": "--set workers=3"}
    assert settings.layers == ["model", "preset:fast", "user.conf", "cli"]


def test_model_hints_record_the_model_and_scope() -> None:
    settings = build_settings(scenario="SingleStream", mode="performance", conf_model="m", model_name="rn",
                              model_hints={"*": {"min_duration": 1}, "SingleStream": {"target_latency": 2}})
    assert settings.where == {"min_duration": "model rn: attributes.settings: *",
                              "target_latency": "model rn: attributes.settings: SingleStream"}
    assert settings.origin == {"min_duration": "model", "target_latency": "model"} and settings.layers == ["model"]
    bad = error(build_settings, scenario="Offline", mode="performance", conf_model="m", model_name="rn",
                model_hints={"Offline": ["target_qps"]})
    assert bad == "model rn: attributes.settings: Offline: expected a mapping of settings"


def test_no_layers_means_loadgen_defaults_only(tmp_path: Path) -> None:
    settings = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m",
                              model_hints={}, overrides=[])
    assert (settings.loadgen, settings.harness, settings.origin, settings.layers) == ({}, {}, {}, [])
    conf = tmp_path / "user.conf"
    conf.write_text("# nothing for this model\nother.Offline.target_qps = 1\n")
    only_conf = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m", user_conf=conf)
    assert only_conf.layers == ["user.conf"] and only_conf.loadgen == {}


def test_a_request_carrying_user_conf_text_does_not_read_the_file(tmp_path: Path) -> None:
    settings = build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m",
                              user_conf=tmp_path / "gone.conf", user_conf_text="m.Offline.target_qps = 3\n")
    assert settings.loadgen == {"target_qps": "3"} and settings.where == {"target_qps": f"{tmp_path}/gone.conf: line 1"}


def test_the_merged_settings_are_validated(tmp_path: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.target_qps = 0\n")
    assert error(build_settings, scenario="Offline", mode="performance", conf_model="m", model_name="m",
                 user_conf=conf) == f"{conf}: line 1: target_qps: expected {QPS}, got 0 (set by user.conf)"
    # a bad value below is fine once a layer above replaces it
    assert build_settings(scenario="Offline", mode="performance", conf_model="m", model_name="m", user_conf=conf,
                          overrides=["target_qps=4"]).loadgen == {"target_qps": "4"}


def test_a_set_value_may_hold_an_equals_sign() -> None:
    assert error(build_settings, scenario="Offline", mode="performance", conf_model="m", model_name="m",
                 overrides=["target_qps=1=2"]) == refused("target_qps=1=2", QPS)


@pytest.mark.parametrize("item", ["target_qps", "=5", "  =5", ""])
def test_a_set_flag_must_be_key_equals_value(item: str) -> None:
    assert error(build_settings, scenario="Offline", mode="performance", conf_model="m", model_name="m",
                 overrides=[item]) == f"--set {item!r}: expected key=value"


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", [m for m in MODES if m != "find-peak"])
def test_every_scenario_and_mode_is_accepted(scenario: str, mode: str) -> None:
    settings = build_settings(scenario=scenario, mode=mode, conf_model="m", model_name="m")
    assert (settings.scenario, settings.mode, settings.conf_model) == (scenario, mode, "m")


def test_find_peak_is_for_server_only() -> None:
    assert build_settings(scenario="Server", mode="find-peak", conf_model="m", model_name="m").mode == "find-peak"
    assert error(build_settings, scenario="Offline", mode="find-peak", conf_model="m", model_name="m") == \
        "--mode find-peak: only the Server scenario has a peak to find, got Offline"


@pytest.mark.parametrize("scenario, mode, expected", [
    ("offline", "performance", "--scenario: expected one of SingleStream, MultiStream, Server, Offline, got 'offline'"),
    ("Offline", "perf", "--mode: expected one of performance, accuracy, submission, find-peak, got 'perf'"),
])
def test_an_unknown_scenario_or_mode_lists_the_choices(scenario: str, mode: str, expected: str) -> None:
    assert error(build_settings, scenario=scenario, mode=mode, conf_model="m", model_name="m") == expected


# ---- what LoadGen is given (its own process: LoadGen takes one configuration per process) ------------------

APPLY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import mlperf_loadgen as lg
    from mlharness.errors import UserError
    from mlharness.running import settings as S

    folder = Path(sys.argv[1])
    out = {"loaded_before": S.loadgen_config_loaded()}
    # built by hand, so that this child reaches only the functions that give LoadGen its settings
    s = S.Settings(scenario="Server", mode="performance", conf_model="resnet50", layers=["cli"],
                   loadgen={"target_qps": "123.5", "target_latency": "17", "min_query_count": "7",
                            "max_async_queries": "3", "print_timestamps": "1"})
    conf = folder / "user.conf"
    conf.write_text(s.user_conf_text())
    test = S.apply_to_loadgen(s, conf)
    out["loaded_after"] = S.loadgen_config_loaded()
    out["scenario"] = test.scenario == lg.TestScenario.Server
    out["values"] = [test.server_target_qps, test.server_target_latency_ns, test.min_query_count,
                     test.server_max_async_queries, test.print_timestamps]
    modes = {}
    for mode in ("performance", "accuracy", "find-peak"):
        s.mode = mode
        try:
            again = S.apply_to_loadgen(s, conf)
        except Exception as exc:
            modes[mode] = type(exc).__name__
            continue
        modes[mode] = [name for name in ("PerformanceOnly", "AccuracyOnly", "FindPeakPerformance")
                       if again.mode == getattr(lg.TestMode, name)] + [again is test]
    out["modes"] = modes
    s.mode = "accuracy"
    for name, change in (("other_text", lambda: conf.write_text(conf.read_text() + "# more\\n")),
                         ("other_model", lambda: setattr(s, "conf_model", "bert")),
                         ("other_scenario", lambda: setattr(s, "scenario", "Offline"))):
        saved = (conf.read_text(), s.conf_model, s.scenario)
        change()
        try:
            S.apply_to_loadgen(s, conf)
            out[name] = "applied"
        except RuntimeError as exc:
            out[name] = str(exc)
        conf.write_text(saved[0]); s.conf_model, s.scenario = saved[1], saved[2]
    print(json.dumps(out))
""")

REJECT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from mlharness.errors import UserError
    from mlharness.running import settings as S

    conf = Path(sys.argv[1]) / "user.conf"
    conf.write_text("m.Offline.min_query_count = many\\n")  # past the checks: LoadGen's own refusal
    s = S.Settings(scenario="Offline", mode="performance", conf_model="m")
    try:
        S.apply_to_loadgen(s, conf)
    except UserError as exc:
        print(exc)
    print(S.loadgen_config_loaded())
""")


def child(script: str, folder: Path) -> str:
    done = subprocess.run([sys.executable, "-c", script, str(folder)], check=False, cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_loadgen_is_configured_once_from_the_merged_user_conf(tmp_path: Path) -> None:
    out = json.loads(child(APPLY, tmp_path).splitlines()[-1])
    assert out["loaded_before"] is False and out["loaded_after"] is True and out["scenario"] is True
    assert out["values"] == [123.5, 17_000_000, 7, 3, True]
    assert out["modes"] == {"performance": ["PerformanceOnly", True], "accuracy": ["AccuracyOnly", True],
                            "find-peak": ["FindPeakPerformance", True]}
    refusal = ("LoadGen was already configured in this process with other settings; run each benchmark in its "
               "own process (mlharness.running.launcher)")
    assert out["other_text"] == out["other_model"] == out["other_scenario"] == refusal


def test_a_configuration_loadgen_rejects_is_one_line(tmp_path: Path) -> None:
    lines = child(REJECT, tmp_path).splitlines()
    assert lines[-2:] == [f"{tmp_path}/user.conf: LoadGen rejected the settings (FromConfig returned -22)", "False"]
