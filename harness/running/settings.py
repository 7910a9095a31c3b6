"""Run settings from layered sources, lowest first: LoadGen's built-in mlperf.conf < the model's
expected figures < the configuration `mlharness tune` found on this system < a scenario preset in
scenarios/ < user.conf < --set flags. The merged LoadGen
keys are written as one user.conf and applied with a single FromConfig call; harness keys
(batching, threads) go to the SUT. Each value remembers which layer set it."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from mlharness.errors import UserError
from mlharness.running.presets import load_preset
from mlharness.running.setting_keys import HARNESS_KEYS, LOADGEN_KEYS, MODES, SCENARIOS, setting_hint  # noqa: F401  (read here)

# Harness keys whose value is one of a few names (ONNX Runtime's session options; `mlharness tune` searches them).
CHOICE_KEYS: dict[str, tuple[str, ...]] = {"graph_optimization": ("all", "extended", "basic", "disable_all"),
                                           "execution_mode": ("sequential", "parallel"),
                                           # a generative model's scheduling in Offline and Server (mlharness.sut.llm.token_sut)
                                           "llm_batching": ("continuous", "static"),
                                           # a run against an OpenAI-compatible server (mlharness.sut.network.token_exchange)
                                           "endpoint_api": ("auto", "chat", "completions"),
                                           "endpoint_token_count": ("server", "client")}
# Defaults of the harness keys that have one outside the model manifest (see README: harness keys).
HARNESS_DEFAULTS: dict[str, Any] = {"workers": 1, "warmup_queries": 4, "warmup_seconds": 0.0, "load_timeout": 600.0,
                                    "batch_wait_ms": 0.0, "llm_batching": "continuous",
                                    # Offline: rows whose outputs are postprocessed together (mlharness.sut.output_groups)
                                    "postprocess_group_rows": 64,
                                    # a run against a server (mlharness.sut.network, docs/network.md)
                                    "endpoint_concurrency": 64, "endpoint_timeout": 30.0,
                                    "endpoint_connect_timeout": 10.0, "endpoint_binary": True,
                                    "issue_lag_limit_ms": 2.0, "endpoint_api": "auto", "endpoint_token_count": "server",
                                    "endpoint_retries": 3}
_FLOAT_KEYS = frozenset({"warmup_seconds", "load_timeout", "batch_wait_ms", "endpoint_timeout",
                         "endpoint_connect_timeout", "issue_lag_limit_ms"})
_BOOLEAN_KEYS = frozenset({"enable_trace", "cuda_graphs", "endpoint_binary"})
_TEXT_KEYS = frozenset({"endpoint_model"})  # a name the server knows the model by ("org/name" on vLLM)
_ZERO_OK_KEYS = frozenset({"intra_op_threads", "inter_op_threads", "warmup_queries", "warmup_seconds",
                           "batch_wait_ms", "postprocess_group_rows", "endpoint_retries"})
# What a value below the minimum means to a user who typed it (dataset_limit=0 is not "all": it is unset).
_MINIMUM_NOTES = {"dataset_limit": " (the first N samples of the dataset; leave it unset for all of them)"}
# What a submission must not override (checked by the packager and recorded here).
PROTECTED_KEYS = frozenset({"qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed",
                            "performance_sample_count_override", "min_duration", "min_query_count",
                            "accuracy_log_rng_seed"})


@dataclass
class Settings:
    scenario: str
    mode: str
    conf_model: str
    loadgen: dict[str, str] = field(default_factory=dict)
    harness: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # key -> layer that set it
    layers: list[str] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)  # key -> where it was set (flag, file and line)

    def set(self, key: str, value: Any, layer: str, where: str) -> None:
        if key in LOADGEN_KEYS:
            self.loadgen[key] = _loadgen_text(key, value)
        elif key in HARNESS_KEYS:
            self.harness[key] = _harness_value(key, value, where)
        else:
            raise UserError(f"{where}: unknown setting {key!r} ({setting_hint(key)})")
        self.origin[key] = layer
        self.where[key] = where

    def user_conf_text(self) -> str:
        """The merged LoadGen settings as one user.conf, the file FromConfig reads once."""
        lines = [f"# written by mlharness: layers {' < '.join(['mlperf.conf'] + self.layers)}"]
        lines += [f"{self.conf_model}.{self.scenario}.{k} = {v}" for k, v in sorted(self.loadgen.items())]
        return "\n".join(lines) + "\n"

    def overridden_protected(self) -> list[str]:
        return sorted(k for k in self.loadgen if k in PROTECTED_KEYS)

    def as_record(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "mode": self.mode, "conf_model": self.conf_model,
                "loadgen": dict(self.loadgen), "harness": dict(self.harness),
                "origin": dict(self.origin), "layers": ["mlperf.conf"] + self.layers}


def _harness_value(key: str, value: Any, where: str) -> Any:
    if key in CHOICE_KEYS:
        text = str(value).strip().lower()
        if text not in CHOICE_KEYS[key]:
            raise UserError(f"{where}: {key}: expected one of {', '.join(CHOICE_KEYS[key])}, got {value!r}")
        return text
    if key in _BOOLEAN_KEYS:
        text = str(value).strip().lower()
        if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise UserError(f"{where}: {key}: expected true or false, got {value!r}")
        return text in ("1", "true", "yes", "on")
    if key in _TEXT_KEYS:
        text = str(value).strip()
        if not text or any(c.isspace() for c in text):
            raise UserError(f"{where}: {key}: expected a model name without spaces, got {value!r}")
        return text
    kind = "a number of seconds" if key in _FLOAT_KEYS else "an integer"
    try:
        number = float(value) if key in _FLOAT_KEYS else int(value)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{where}: {key}: expected {kind}, got {value!r}") from None
    if key in _FLOAT_KEYS and not math.isfinite(number):
        raise UserError(f"{where}: {key}: expected {kind}, got {value!r}")
    if key in _ZERO_OK_KEYS:
        if number < 0:
            raise UserError(f"{where}: {key}: expected {kind} >= 0, got {value}")
    elif key in _FLOAT_KEYS and number <= 0:
        raise UserError(f"{where}: {key}: expected {kind} > 0, got {value}")
    elif key not in _FLOAT_KEYS and number < 1:
        raise UserError(f"{where}: {key}: expected {kind} >= 1{_MINIMUM_NOTES.get(key, '')}, got {value}")
    return number


# ---- LoadGen values ---------------------------------------------------------------------------
# What LoadGen 6.0.17 makes of each user.conf value (mlcommons/inference loadgen/test_settings_internal.cc,
# TestSettings::FromConfig): a value must be one integer or real token; integers are read with strtoull
# (a fraction is cut off, -5 wraps round to 2^64-5, a leading 0 means octal), reals with strtod, and
# booleans are integers. LoadGen itself checks almost nothing: a negative target_qps is replaced by 1,
# a zero latency or samples_per_query hangs or crashes it, a percentile of 100 reads past its
# latencies. So every value is checked here, before anything starts.

_INTEGER = re.compile(r"^(0|[1-9][0-9]*)$")
_REAL = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_UINT64_MAX = 2**64 - 1
_MAX_MS = (2**63 - 1) // 10**6  # LoadGen keeps durations and latencies in signed 64-bit nanoseconds


class _Rule(NamedTuple):
    kind: str  # "real" (> low), "whole" (>= low), "percent", "seed", "bool"
    low: float
    meaning: str
    in_ms: bool = False  # bounded by what LoadGen can hold in nanoseconds
    note: str = ""


_LOADGEN_VALUES: dict[str, _Rule] = {
    "target_qps": _Rule("real", 0, "a number of queries per second"),
    "target_latency": _Rule("real", 0, "a latency in ms", True),  # Server: whole ms (see _value_rule)
    "ttft_latency": _Rule("whole", 1, "a latency in whole ms", True),
    "tpot_latency": _Rule("whole", 1, "a latency in whole ms", True),
    "target_latency_percentile": _Rule("percent", 0, "a percentile in percent"),
    "min_duration": _Rule("whole", 0, "a duration in whole ms", True),
    "max_duration": _Rule("whole", 0, "a duration in whole ms (0 = no limit)", True),
    "min_query_count": _Rule("whole", 0, "a query count"),
    "max_query_count": _Rule("whole", 0, "a query count (0 = no limit)"),
    "samples_per_query": _Rule("whole", 1, "a sample count"),
    "performance_sample_count_override": _Rule("whole", 0, "a sample count (0 = the dataset's)"),
    "performance_issue_same_index": _Rule("whole", 0, "a sample index"),
    "max_async_queries": _Rule("whole", 0, "a query count (0 = no limit)"),
    "accuracy_log_sampling_target": _Rule("whole", 0, "a sample count"),
    "token_latency_scaling_factor": _Rule("whole", 1, "a token count"),
    "accuracy_log_rng_seed": _Rule("seed", 0, "a seed"),
    **{key: _Rule("bool", 0, "a boolean") for key in (
        "performance_issue_unique", "performance_issue_same", "coalesce_queries", "print_timestamps",
        "sample_concatenate_permutation", "use_token_latencies", "infer_token_latencies")},
}
_BOOL_KEYS = frozenset(k for k, rule in _LOADGEN_VALUES.items() if rule.kind == "bool")
# Keys FromConfig reads only from LoadGen's built-in mlperf.conf, or not at all: a user.conf value is ignored.
_IGNORED_KEYS = {
    **{key: "LoadGen reads it only from its built-in mlperf.conf, so a value here would be ignored" for key in (
        "qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed", "accuracy_log_probability", "test05",
        "test05_qsl_rng_seed", "test05_sample_index_rng_seed", "test05_schedule_rng_seed")},
    "server_num_issue_query_threads": "LoadGen's FromConfig never reads it (and the SUT registers no issue "
                                      "threads), so a value here would be ignored",
}


def _loadgen_text(key: str, value: Any) -> str:
    """A setting as user.conf text; booleans (YAML true, 'false') become LoadGen's 1/0."""
    if key in _BOOL_KEYS and str(value).lower() in ("true", "false"):
        return "1" if str(value).lower() == "true" else "0"
    return str(value)


def _value_rule(key: str, scenario: str) -> _Rule:
    if key == "target_latency" and scenario == "Server":
        return _Rule("whole", 1, "a latency in whole ms", True, " (LoadGen reads Server's as an integer)")
    return _LOADGEN_VALUES[key]


def _number_problem(key: str, text: str, scenario: str) -> tuple[str, float | None]:
    """(what was expected, the number) for one value; the expectation is '' when the value is fine."""
    rule = _value_rule(key, scenario)
    if rule.kind == "bool":
        return ("" if text in ("0", "1") else "0 or 1 (or true/false)"), None
    high = _MAX_MS if rule.in_ms else _UINT64_MAX
    if rule.kind in ("whole", "seed"):
        if not _INTEGER.match(text):
            octal = " (LoadGen would read a leading 0 as octal)" if re.match(r"^0[0-9]+$", text) else ""
            what = "an unsigned 64-bit integer" if rule.kind == "seed" else f"{rule.meaning} >= {rule.low:g}"
            return f"{what}{rule.note}{octal}", None
        number = int(text)
        if number < rule.low:
            return f"{rule.meaning} >= {rule.low:g}{rule.note}", number
        return ("" if number <= high else f"{rule.meaning} <= {high}{rule.note}"), number
    number = float(text) if _REAL.match(text) else math.nan
    number = number if math.isfinite(number) else math.nan
    if rule.kind == "percent":
        # LoadGen reads percent (90 = p90) and indexes its sorted latencies with p: 100 reads past them.
        return ("" if 0 < number < 100 else f"{rule.meaning}, 0 < p < 100 (90 = p90)"), number
    if not rule.low < number <= (high if rule.in_ms else math.inf):
        ceiling = f" and <= {high}" if rule.in_ms else ""  # a value past it must not read as "> 0"
        return f"{rule.meaning} > {rule.low:g}{ceiling}", None
    return "", number


def _shown(text: str) -> str:
    return text if re.match(r"^\S+$", text) else repr(text)


def _blame(settings: Settings, key: str) -> tuple[str, str]:
    """(where the key was set, which layer set it) for a message."""
    layer = settings.origin.get(key, "?")
    return settings.where.get(key, layer), layer


def validate_loadgen_settings(settings: Settings, performance_sample_count: int | None = None) -> None:
    """Refuse, in one line naming the key, the value and where it was set, any LoadGen setting that
    LoadGen would refuse, replace, ignore or crash on. `performance_sample_count` (the QSL's, when
    known) bounds performance_issue_same_index."""
    numbers: dict[str, float] = {}
    for key, text in sorted(settings.loadgen.items()):
        where, layer = _blame(settings, key)
        if key in _IGNORED_KEYS:
            raise UserError(f"{where}: {key}: cannot be set: {_IGNORED_KEYS[key]} (set by {layer})")
        expected, number = _number_problem(key, text, settings.scenario)
        if expected:
            raise UserError(f"{where}: {key}: expected {expected}, got {_shown(text)} (set by {layer})")
        if number is not None:
            numbers[key] = number
    _check_pairs(settings, numbers, performance_sample_count)


def _check_pairs(settings: Settings, numbers: dict[str, float], performance_sample_count: int | None) -> None:
    """The settings that only make sense together: a maximum below its minimum, both issue modes."""
    def refuse(key: str, expected: str) -> None:
        where, layer = _blame(settings, key)
        raise UserError(f"{where}: {key}: expected {expected}, got {_shown(settings.loadgen[key])} (set by {layer})")

    def other(key: str) -> str:
        where, layer = _blame(settings, key)
        return f"{key} {settings.loadgen[key]} ({where}, set by {layer})"

    pairs = [("min_duration", "max_duration")]
    if settings.scenario != "Offline":  # Offline's one query holds min_query_count samples
        pairs.append(("min_query_count", "max_query_count"))
    for low, high in pairs:
        if low in numbers and numbers.get(high) and numbers[high] < numbers[low]:
            refuse(high, f"0 (no limit) or at least {other(low)}")
    if settings.loadgen.get("performance_issue_unique") == "1" and settings.loadgen.get("performance_issue_same") == "1":
        refuse("performance_issue_same", f"0 while {other('performance_issue_unique')} (LoadGen refuses both)")
    if settings.loadgen.get("performance_issue_same") == "1" and "performance_issue_same_index" in numbers:
        count = int(numbers.get("performance_sample_count_override") or 0) or performance_sample_count
        if count and numbers["performance_issue_same_index"] >= count:
            refuse("performance_issue_same_index", f"a sample index below the performance sample count {count}")


def parse_user_conf(path: Path, conf_model: str, model_name: str, scenario: str,
                    text: str | None = None) -> list[tuple[str, str, int]]:
    """(key, value, line) for the lines of a LoadGen user.conf that apply to this model and scenario;
    `text` is its content when already read (a RunRequest carries it), else the file is read."""
    if text is None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(f"{path}: cannot read user.conf: {exc.strerror or exc}") from None
    found = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        lhs, sep, value = line.partition("=")
        parts = lhs.strip().split(".")
        if not sep or len(parts) != 3 or not value.strip():
            raise UserError(f"{path}: line {number}: expected 'model.Scenario.key = value', got {raw.strip()!r}")
        model, scen, key = parts
        if model in ("*", conf_model, model_name) and scen in ("*", scenario):
            found.append((key, value.strip(), number))
    return found


def _apply_scoped(settings: Settings, scoped: dict[str, Any], layer: str, where: str) -> None:
    """Apply a {'*' | Scenario: {key: value}} mapping: '*' first, then the scenario's own entries."""
    for scope in ("*", settings.scenario):
        entries = scoped.get(scope) or {}
        if not isinstance(entries, dict):
            raise UserError(f"{where}: {scope}: expected a mapping of settings")
        for key, value in entries.items():
            settings.set(str(key), value, layer, f"{where}: {scope}")


def build_settings(*, scenario: str, mode: str, conf_model: str, model_name: str,
                   model_hints: dict[str, Any] | None = None, presets: list[str] = (),
                   user_conf: Path | None = None, overrides: list[str] = (),
                   user_conf_text: str | None = None, tuned: dict[str, Any] | None = None,
                   tuned_where: str = "tuned", scenarios_root: Path | None = None) -> Settings:
    """The run's settings, layer by layer (see the module docstring); `tuned` is the configuration
    `mlharness tune` found for this model on this system, between the model manifest and presets."""
    if scenario not in SCENARIOS:
        raise UserError(f"--scenario: expected one of {', '.join(SCENARIOS)}, got {scenario!r}")
    if mode not in MODES:
        raise UserError(f"--mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if mode == "find-peak" and scenario != "Server":
        raise UserError(f"--mode find-peak: only the Server scenario has a peak to find, got {scenario}")
    settings = Settings(scenario=scenario, mode=mode, conf_model=conf_model)
    if model_hints:
        settings.layers.append("model")
        _apply_scoped(settings, model_hints, "model", f"model {model_name}: attributes.settings")
    if tuned:
        settings.layers.append("tuned")
        for key, value in tuned.items():
            settings.set(str(key), value, "tuned", tuned_where)
    for preset in presets:
        loaded = load_preset(preset, scenarios_root)
        settings.layers.append(f"preset:{loaded['path'].stem}")
        _apply_scoped(settings, loaded["settings"], f"preset:{loaded['path'].stem}", str(loaded["path"]))
    if user_conf is not None:
        settings.layers.append("user.conf")
        for key, value, line in parse_user_conf(user_conf, conf_model, model_name, scenario, user_conf_text):
            settings.set(key, value, "user.conf", f"{user_conf}: line {line}")
    if overrides:
        settings.layers.append("cli")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected key=value")
        settings.set(key.strip(), value.strip(), "cli", f"--set {item}")
    validate_loadgen_settings(settings)
    return settings


# LoadGen applies FromConfig once per process (a second call logs "Multiple conf files are used"
# and skips mlperf.conf), so the TestSettings it fills is kept and reused by the tests of one run.
_LOADED: dict[str, Any] = {}
_MODES = {"performance": "PerformanceOnly", "accuracy": "AccuracyOnly", "find-peak": "FindPeakPerformance"}


def loadgen_config_loaded() -> bool:
    """True once this process has applied a LoadGen configuration (a run has its own process: mlharness.running.launcher)."""
    return bool(_LOADED)


def apply_to_loadgen(settings: Settings, user_conf_path: Path) -> Any:
    """A LoadGen TestSettings: scenario and mode set in code, everything else from one FromConfig.
    Later tests of the same run (same user.conf, model and scenario) reuse it with another mode."""
    import mlperf_loadgen as lg

    key = (user_conf_path.read_text(), settings.conf_model, settings.scenario)
    if not _LOADED:
        test = lg.TestSettings()
        test.scenario = getattr(lg.TestScenario, settings.scenario)
        status = test.FromConfig(str(user_conf_path), settings.conf_model, settings.scenario)
        if status != 0:
            raise UserError(f"{user_conf_path}: LoadGen rejected the settings (FromConfig returned {status})")
        _LOADED.update(key=key, test=test)
    elif _LOADED["key"] != key:
        raise RuntimeError("LoadGen was already configured in this process with other settings; "
                           "run each benchmark in its own process (mlharness.running.launcher)")
    test = _LOADED["test"]
    test.mode = getattr(lg.TestMode, _MODES[settings.mode])
    return test
