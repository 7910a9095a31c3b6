"""Across-stack profiling of a LoadGen test: one tracer per level (harness, model, framework,
python, system), merged into one Chrome-trace timeline with a summary. Importing this package
loads no deep-learning framework; a level imports what it needs when it starts."""
from __future__ import annotations

from harness.errors import UserError

LEVELS = ("harness", "model", "framework", "python", "system")


def parse_levels(text: str) -> list[str]:
    """`--profile` value: a comma list of levels, or `full` for all of them."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if items == ["full"] or "full" in items:
        return list(LEVELS)
    unknown = [item for item in items if item not in LEVELS]
    if unknown or not items:
        raise UserError(f"--profile: expected a comma list of {', '.join(LEVELS)} or 'full', got {text!r}")
    return list(dict.fromkeys(items))


def new_session(levels: list[str], out_dir, scenario: str = "", calibrate: bool = True):  # noqa: ANN001, ANN201
    from profiling.session import ProfileSession

    return ProfileSession(levels, out_dir, scenario, calibrate)


__all__ = ["LEVELS", "new_session", "parse_levels"]
