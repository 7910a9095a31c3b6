"""Plugins found through entry points (third-party backends, metrics, tracers, in the manner of
pyperf's hooks): each registry keeps one PluginEntryPoints for its group; nothing is imported until
a plugin is used, and one that cannot load is a one-line error naming it."""
from __future__ import annotations

import importlib.metadata
from typing import Any, Mapping

from mlharness.errors import UserError


def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The installed distributions' entry points of `group` by name; nothing is imported."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


class PluginEntryPoints:
    """A registry's entry points: read at first call (nothing imported), without the names the
    registry has built in; each registry (backends, metrics, tracers) keeps one."""

    def __init__(self, group: str, builtin: Mapping[str, Any]):
        self.group = group
        self._builtin = builtin
        self._found: dict[str, importlib.metadata.EntryPoint] | None = None

    def __call__(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._found is None:
            self._found = {name: ep for name, ep in entry_points(self.group).items() if name not in self._builtin}
        return self._found


def load_entry_point(ep: importlib.metadata.EntryPoint) -> Any:
    """The object an entry point names; a plugin that cannot load is a one-line UserError naming it."""
    dist = getattr(ep, "dist", None)
    owner = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    try:
        return ep.load()
    except Exception as exc:  # an import error or any error raised while importing the plugin
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(f"entry point {ep.group}:{ep.name} = {ep.value} (from {owner}) cannot be loaded: "
                        f"{type(exc).__name__}: {detail}") from None
