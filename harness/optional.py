"""Optional packages: a feature imports the one it needs through `require`, which says in one line
which mlharness extra (pyproject.toml [project.optional-dependencies]) installs it."""
from __future__ import annotations

import importlib
from types import ModuleType

from harness.errors import UserError


def require(module: str, extra: str | None, purpose: str) -> ModuleType:
    """Import `module` (e.g. "scipy.stats"), or raise a UserError naming the package, what needs it
    and `pip install 'mlharness[EXTRA]'` (no install hint when no extra provides it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.partition(".")[0]
        missing = (exc.name or package).partition(".")[0]
        install = f"; pip install 'mlharness[{extra}]'" if extra else ""
        if missing == package:
            raise UserError(f"{package} is not installed (needed for {purpose}){install}") from None
        # The package is there but something it imports is not: a broken or partial install.
        raise UserError(f"{package} cannot be imported (needed for {purpose}): {exc}{install}") from None
