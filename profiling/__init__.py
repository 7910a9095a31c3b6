"""Across-stack profiling of a LoadGen test: one tracer per level (harness, model, framework,
python, system, and any a third-party package registers through the `mlharness.tracers` entry
point group), merged into one Chrome-trace timeline with a summary. Importing this package loads
no deep-learning framework; a level imports what it needs when it starts."""
from __future__ import annotations

import importlib
from typing import Any

from harness.errors import UserError
from specs import manifests

ENTRY_POINT_GROUP = "mlharness.tracers"

# level -> "module:Class" of its Tracer (imported when the level starts) or the class itself.
_TRACERS: dict[str, Any] = {
    "harness": "profiling.harness_tracer:HarnessTracer",
    "model": "profiling.model_tracer:ModelTracer",
    "framework": "profiling.framework_tracer:FrameworkTracer",
    "python": "profiling.python_tracer:PythonTracer",
    "system": "profiling.system_tracer:SystemTracer",
}
_PLUGINS: dict[str, Any] | None = None  # level -> entry point, read at first use, loaded when used


def register(level: str, tracer: Any) -> None:
    """Add a level: `tracer` is a Tracer subclass whose `level` is this name, or its "module:Class"."""
    _TRACERS[level] = tracer


def _plugins() -> dict[str, Any]:
    global _PLUGINS
    if _PLUGINS is None:
        _PLUGINS = {name: ep for name, ep in manifests.entry_points(ENTRY_POINT_GROUP).items() if name not in _TRACERS}
    return _PLUGINS


def levels() -> list[str]:
    """Every level, the built-in ones first, then those of entry points."""
    return list(_TRACERS) + [name for name in _plugins() if name not in _TRACERS]


def tracer_class(level: str) -> type:
    from profiling.tracer import Tracer

    if level not in _TRACERS and level in _plugins():
        ep = _plugins()[level]
        tracer = manifests.load_entry_point(ep)
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
    if items == ["full"] or "full" in items:
        items = known
    unknown = [item for item in items if item not in known]
    if unknown or not items:
        raise UserError(f"--profile: expected a comma list of {', '.join(known)} or 'full', got {text!r}")
    chosen = list(dict.fromkeys(items))
    for level in chosen:
        if level not in _TRACERS:
            tracer_class(level)  # a third-party level loads now: a broken one fails before the run
    return chosen


def __getattr__(name: str) -> Any:
    if name == "LEVELS":  # every level now, the registry's (bench/ and older callers read it)
        return tuple(levels())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_session(levels: list[str], out_dir, scenario: str = "", calibrate: bool = True):  # noqa: ANN001, ANN201
    from profiling.session import ProfileSession

    return ProfileSession(levels, out_dir, scenario, calibrate)


__all__ = ["ENTRY_POINT_GROUP", "levels", "new_session", "parse_levels", "register", "tracer_class"]
