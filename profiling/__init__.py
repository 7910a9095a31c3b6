"""Across-stack profiling of a LoadGen test: one tracer per level (harness, model, framework,
python, system, and any a third-party package registers through the `mlharness.tracers` entry
point group), merged into one Chrome-trace timeline with a summary. Importing this package loads
no deep-learning framework; a level imports what it needs when it starts."""
from __future__ import annotations

from typing import Any

from mlharness.profiling.registry import (
    ENTRY_POINT_GROUP,
    levels,
    parse_levels,
    register,
    tracer_class,
)


def __getattr__(name: str) -> Any:
    if name == "LEVELS":  # every level now, the registry's (bench/ and older callers read it)
        return tuple(levels())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_session(levels: list[str], out_dir, scenario: str = "", calibrate: bool = True):  # noqa: ANN001, ANN201
    from mlharness.profiling.session import ProfileSession

    return ProfileSession(levels, out_dir, scenario, calibrate)


__all__ = ["ENTRY_POINT_GROUP", "levels", "new_session", "parse_levels", "register", "tracer_class"]
