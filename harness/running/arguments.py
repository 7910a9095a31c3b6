"""A run request as `mlharness run` arguments, both ways, from one table (REQUEST_FLAGS): the commands
parse their run-request flags from it (`add_request_arguments`, `request_fields`), and `run_arguments`
writes a request back as the argv that repeats it (a run's "reproduce with", a submission step's, a
tune trial's), after the environment settings a resolved request carries (ENVIRONMENT, as VAR=value).
A field with a flag that one direction forgot is what made a tune trial's recorded command reproduce
another run; tests/test_request_arguments.py checks the round trip."""
from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable

from mlharness.running.request import DEFAULT_RESULTS_DIR, DEFAULT_RUN_TIMEOUT, RunRequest
from mlharness.running.settings import MODES, SCENARIOS

# How a field is spelled on the command line:
#   value   --flag VALUE, left out at the field's default
#   switch  --flag when the field is True (store_true)
#   off     --flag when the field is False (store_false: --no-tuned)
#   repeat  --flag VALUE once per item (append)
#   comma   --flag A,B (the command parses and checks the list: profiling levels, compliance tests)
FORMS = ("value", "switch", "off", "repeat", "comma")


@dataclass(frozen=True)
class RequestFlag:
    flag: str
    field: str
    form: str
    help: str
    options: dict[str, Any] = field(default_factory=dict)  # further argparse keyword arguments
    # False: where the run's results go and how it is shown, not what runs; `run_arguments` writes
    # it only when asked for a complete command.
    decides_run: bool = True


# Order is the order of `mlharness run --help`.
REQUEST_FLAGS: tuple[RequestFlag, ...] = (
    RequestFlag("--scenario", "scenario", "value", "LoadGen scenario", {"required": True, "choices": SCENARIOS}),
    RequestFlag("--mode", "mode", "value", "LoadGen mode (default: performance)",
                {"default": "performance", "choices": MODES}),
    RequestFlag("--dataset", "dataset", "value", "dataset manifest name or path (default: the model's)"),
    RequestFlag("--backend", "backend", "value", "backend name (default: the model manifest's framework)"),
    RequestFlag("--software", "software", "value", "software manifest (default: the one named after the backend)"),
    RequestFlag("--hardware", "hardware", "value", "hardware manifest (default: cpu)", {"default": "cpu"}),
    RequestFlag("--reference", "reference", "value",
                "reference log to compare with (default: found by model/dataset/backend)"),
    RequestFlag("--endpoint", "endpoint", "value",
                "benchmark the model served at URL instead of running it here: grpc://HOST:PORT or "
                "http://HOST:PORT (the Open Inference Protocol), openai+http://HOST:PORT/v1 (an "
                "OpenAI-compatible LLM server; docs/network.md)", {"metavar": "URL"}),
    RequestFlag("--quick", "quick", "switch", "short smoke-run preset (scenarios/quick.yaml)"),
    RequestFlag("--preset", "presets", "repeat", "extra scenario preset from scenarios/ (repeatable)"),
    RequestFlag("--user-conf", "user_conf", "value", "LoadGen user.conf (model.Scenario.key = value)"),
    RequestFlag("--results-dir", "results_dir", "value", "results tree root (default: results)",
                {"default": str(DEFAULT_RESULTS_DIR)}, decides_run=False),
    RequestFlag("--set", "overrides", "repeat", "override a setting (repeatable)", {"metavar": "KEY=VALUE"}),
    RequestFlag("--no-tuned", "use_tuned", "off",
                "ignore the configuration `mlharness tune` stored for this model and system"),
    RequestFlag("--quiet", "quiet", "switch", "no progress display (the plan and live progress on stderr)",
                decides_run=False),
    RequestFlag("--timeout", "timeout", "value",
                f"stop and fail the run after this many seconds (default {DEFAULT_RUN_TIMEOUT:g})",
                {"type": float, "default": DEFAULT_RUN_TIMEOUT, "metavar": "SECONDS"}),
    RequestFlag("--profile", "profile", "comma",
                "profile the test: a comma list of harness,model,framework,python,system, or full",
                {"metavar": "LEVELS"}),
    RequestFlag("--compliance", "compliance", "comma",
                "after the run, run these audits (TEST01,TEST04) into <Scenario>/TEST0x/", {"metavar": "TESTS"}),
)
FLAGS = {spec.flag: spec for spec in REQUEST_FLAGS}
ALWAYS_WRITTEN = ("--scenario", "--mode")  # a recorded command names both, default or not
# The environment's settings a resolved request carries (mlharness.running.resolve.resolved_for_run), as
# (variable, field, default): a recorded command names those not at their default as VAR=value before
# `mlharness`, so that it repeats them too.
ENVIRONMENT: tuple[tuple[str, str, Any], ...] = (("MLHARNESS_SPECS", "specs_root", None),
                                                 ("MLHARNESS_HANDOFF", "handoff", "native"),
                                                 ("MLHARNESS_ISSUE", "issue_path", "native"),
                                                 ("MLHARNESS_SCENARIOS", "scenarios_root", None))
# RunRequest fields no flag sets: the positional model, what a command decides itself (the typed command,
# the bricks command's own options), and what is read when the request is resolved for a run.
FIELDS_WITHOUT_FLAGS = ("model", "user_conf_text", "command", "audit_config", "specs_root", "kind", "batch",
                        "measured_run", "variants", "brick_time_cap", "brick_estimate", "handoff", "issue_path",
                        "resolved", "scenarios_root")


def _default(spec: RequestFlag) -> Any:
    return next(f.default for f in fields(RunRequest) if f.name == spec.field)


def add_request_arguments(parser: argparse.ArgumentParser, flags: Iterable[str] | None = None,
                          help_text: dict[str, str] | None = None) -> None:
    """Add the run-request flags (all, or those named in `flags`); `help_text` replaces a flag's help
    where a command means something more specific by it."""
    chosen = list(FLAGS) if flags is None else list(flags)
    help_text = help_text or {}
    unknown = [flag for flag in chosen if flag not in FLAGS]
    if unknown:
        raise ValueError(f"not run-request flags: {', '.join(unknown)}")
    actions = {"switch": "store_true", "off": "store_false", "repeat": "append"}
    for flag in chosen:
        spec = FLAGS[flag]
        kwargs = {"help": help_text.get(flag, spec.help), **spec.options}
        if spec.form in actions:
            kwargs["action"] = actions[spec.form]
        if spec.form == "off":
            kwargs["dest"] = spec.field
        parser.add_argument(flag, **kwargs)


def _dest(spec: RequestFlag) -> str:
    return spec.field if spec.form == "off" else spec.flag.lstrip("-").replace("-", "_")


def request_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The RunRequest fields set by whichever run-request flags this parser declared. A comma list is
    split here and checked by the command (`mlharness run` expands --profile full and checks the tests)."""
    found: dict[str, Any] = {}
    for spec in REQUEST_FLAGS:
        if not hasattr(args, _dest(spec)):
            continue
        value = getattr(args, _dest(spec))
        if spec.form == "repeat":
            value = list(value or [])
        elif spec.form == "comma":
            value = [item.strip() for item in (value or "").split(",") if item.strip()]
        elif spec.field in ("user_conf", "results_dir"):
            value = Path(value) if value else None
        found[spec.field] = value
    return found


def request_from_args(args: argparse.Namespace, **fixed: Any) -> RunRequest:
    """A RunRequest from the parsed run-request flags plus what the command decides itself
    (model, and whatever it parsed further); validated when built."""
    return RunRequest(**(request_fields(args) | fixed))


def run_arguments(request: RunRequest, complete: bool = False) -> list[str]:
    """The `mlharness` arguments that repeat this request: every field with a flag that is not at its
    default; `complete` adds where its results go and how it is shown (--results-dir, --quiet)."""
    parts = ["run", request.model]
    for spec in REQUEST_FLAGS:
        value = getattr(request, spec.field)
        if (not spec.decides_run and not complete) or (value == _default(spec) and spec.flag not in ALWAYS_WRITTEN):
            continue
        if spec.form == "value":
            parts += [spec.flag, str(value)]  # a float's str reads back as the same float
        elif spec.form in ("switch", "off"):
            parts.append(spec.flag)
        elif spec.form == "repeat":
            for item in value:
                parts += [spec.flag, str(item)]
        elif value:  # comma
            parts += [spec.flag, ",".join(value)]
    return parts


def environment_assignments(request: RunRequest) -> list[str]:
    """VAR=value for each environment setting the request carries that is not at its default."""
    return [f"{variable}={getattr(request, name)}" for variable, name, default in ENVIRONMENT
            if getattr(request, name) not in (None, default)]


def command_line(request: RunRequest, complete: bool = False) -> str:
    """The run's command as a shell line (run.json's `command`, the README's "Reproduce with"), with
    the environment settings it carries."""
    return shlex.join([*environment_assignments(request), "mlharness", *run_arguments(request, complete)])


def with_environment(request: RunRequest, assignments: list[str]) -> RunRequest:
    """The request with the environment settings named by a command's VAR=value words (command_line's)."""
    fields_of = {variable: name for variable, name, _ in ENVIRONMENT}
    found: dict[str, str] = {}
    for word in assignments:
        variable, _, value = word.partition("=")
        if variable not in fields_of:
            raise ValueError(f"{word!r}: not an environment setting of a run ({', '.join(fields_of)})")
        found[fields_of[variable]] = value
    return replace(request, **found)
