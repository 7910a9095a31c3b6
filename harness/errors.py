"""The one error type for user mistakes (the CLI catches it once and prints its one line), the
failed-run errors built on it, and `require` for optional packages. A leaf: it imports nothing else
of the project, so every layer may use it."""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class UserError(Exception):
    """A problem the user can fix (a bad manifest, flag, file or sample); printed as one line."""


class RunFailed(UserError):
    """The run started but failed; its record (status failed) is attached, and the exit status the
    CLI should use (1, or 128 + the signal that stopped it)."""

    def __init__(self, message: str, record: Any, exit_status: int = 1):
        super().__init__(message)
        self.record = record
        self.exit_status = exit_status


class RunInterrupted(UserError):
    """The run was stopped from outside (a signal or a timeout); `exit_status` is what to exit with."""

    def __init__(self, message: str, exit_status: int = 1):
        super().__init__(message)
        self.exit_status = exit_status


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
