"""Find manifests by name under the specs/ folder (shipped as package data), or take a path as given."""
from __future__ import annotations

import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlharness.errors import UserError
from mlharness.specs.manifests import load_manifest

KIND_FOLDERS = {"model": "models", "dataset": "datasets", "software": "software",
                "hardware": "hardware", "reference": "references"}


SPECS_ENV = "MLHARNESS_SPECS"  # the user's way to run with another specs folder


def shipped_folder(package: str, env: str, read_env: bool = True) -> Path:
    """The folder of a data package shipped with mlharness (`specs`, `scenarios`), found through the
    import system so that a checkout, an editable install and a wheel all work; $env overrides
    (unless `read_env` is False: the caller has read it already)."""
    override = os.environ.get(env) if read_env else None
    if override:
        return Path(override)
    try:
        folder = importlib.resources.files(f"mlharness.{package}")
    except (ModuleNotFoundError, TypeError) as exc:  # TypeError: a module of that name, not a package
        raise UserError(f"the {package} shipped with mlharness cannot be found ({exc}): reinstall mlharness "
                        f"(in a checkout: pip install -e .) or set ${env}") from None
    if not isinstance(folder, Path) or not (folder / "__init__.py").is_file():
        # A namespace package (a stray folder of that name) or a zipped install: not ours, or not a folder.
        raise UserError(f"the {package} shipped with mlharness are not a folder on disk (found {folder}); "
                        f"reinstall mlharness or set ${env}")
    return folder


def specs_root() -> Path:
    """The shipped specs/ package's folder, unless MLHARNESS_SPECS points elsewhere."""
    return shipped_folder("specs", SPECS_ENV)


def specs_from_environment() -> Path | None:
    """$MLHARNESS_SPECS, read where a run is submitted: the run request carries it (specs_root), so a
    run's process, here or on a cluster node, does not read its own environment for it."""
    value = os.environ.get(SPECS_ENV)
    return Path(value) if value else None


def shipped_specs() -> Path:
    """The specs/ shipped with mlharness, whatever $MLHARNESS_SPECS says."""
    return shipped_folder("specs", SPECS_ENV, read_env=False)


def spec_files(root: Path | None = None, kind: str | None = None) -> list[Path]:
    root = root or specs_root()
    folders = [KIND_FOLDERS[kind]] if kind else list(dict.fromkeys(KIND_FOLDERS.values()))
    found: list[Path] = []
    for folder in folders:
        found.extend(sorted((root / folder).glob("*.yaml")))
    return found


@dataclass(frozen=True)
class SpecIndex:
    root: Path

    def all(self, kind: str) -> list[Any]:
        return [load_manifest(p, kind) for p in spec_files(self.root, kind)]

    def named(self, kind: str, name: str) -> list[Any]:
        return [m for m in self.all(kind) if m.name == name]

    def find(self, kind: str, name_or_path: str) -> Any:
        """A manifest by path (anything that exists or ends in .yaml) or by unique name."""
        if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
            path = Path(name_or_path)
            if not path.is_file():
                raise UserError(f"{path}: no such {kind} manifest file")
            return load_manifest(path, kind)
        matches = self.named(kind, name_or_path)
        if not matches:
            known = sorted({m.name for m in self.all(kind)})
            raise UserError(f"no {kind} manifest named {name_or_path!r} under {self.root} (known: {', '.join(known)})")
        if len(matches) > 1:
            versions = ", ".join(f"{m.ref} ({m.path.name})" for m in matches)
            raise UserError(f"{kind} name {name_or_path!r} is ambiguous: {versions}; pass a path")
        return matches[0]


def default_index() -> SpecIndex:
    return SpecIndex(specs_root())
