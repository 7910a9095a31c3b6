"""The profiling levels: the tracer registry (built-in levels and those of `mlharness.tracers` entry
points) and `--profile` parsing. Its own module, so the session and the package both use it without
importing each other."""
from __future__ import annotations

import importlib
from typing import Any

from mlharness.errors import UserError
from mlharness.specs import plugins

ENTRY_POINT_GROUP = "mlharness.tracers"

# level -> "module:Class" of its Tracer (imported when the level starts) or the class itself.
_TRACERS: dict[str, Any] = {
    "harness": "mlharness.profiling.harness_tracer:HarnessTracer",
    "model": "mlharness.profiling.model_tracer:ModelTracer",
    "framework": "mlharness.profiling.framework_tracer:FrameworkTracer",
    "python": "mlharness.profiling.python_tracer:PythonTracer",
    "system": "mlharness.profiling.system_tracer:SystemTracer",
}


def register(level: str, tracer: Any) -> None:
    """Add a level: `tracer` is a Tracer subclass whose `level` is this name, or its "module:Class"."""
    _TRACERS[level] = tracer


_plugins = plugins.PluginEntryPoints(ENTRY_POINT_GROUP, _TRACERS)  # read at first use, loaded when used


def levels() -> list[str]:
    """Every level, the built-in ones first, then those of entry points."""
    return list(_TRACERS) + [name for name in _plugins() if name not in _TRACERS]


def tracer_class(level: str) -> type:
    from mlharness.profiling.tracer import Tracer

    if level not in _TRACERS and level in _plugins():
        ep = _plugins()[level]
        tracer = plugins.load_entry_point(ep)
        if not (isinstance(tracer, type) and issubclass(tracer, Tracer) and tracer.level == level):
            raise UserError(f"entry point {ep.group}:{level} = {ep.value}: expected a Tracer subclass with "
                            f"level = {level!r}, got {tracer!r}")
        register(level, tracer)
    target = _TRACERS.get(level)
    if target is None:
        raise UserError(f"--profile: expected one of {', '.join(levels())}, got {level!r}")
    if isinstance(target, str):
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)
    return target


def parse_levels(text: str) -> list[str]:
    """`--profile` value: a comma list of levels, or `full` for all of them."""
    known = levels()
    items = [item.strip() for item in text.split(",") if item.strip()]
    # Checked before `full` stands for every level: `full,gpu` asked for a level that does not exist.
    unknown = [item for item in items if item not in known and item != "full"]
    if unknown or not items:
        named = f" (unknown: {', '.join(dict.fromkeys(unknown))})" if unknown else ""
        raise UserError(f"--profile: expected a comma list of {', '.join(known)} or 'full', got {text!r}{named}")
    if "full" in items:
        items = known
    chosen = list(dict.fromkeys(items))
    for level in chosen:
        if level not in _TRACERS:
            tracer_class(level)  # a third-party level loads now: a broken one fails before the run
    return chosen
