"""A small checker for YAML documents: every problem becomes one line naming the file, the
field path and what was expected. Checks collect problems instead of stopping at the first."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from harness.errors import UserError

SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MISSING = object()


class ManifestError(UserError):
    """All problems found in one or more manifests, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass
class Checker:
    """Walks one document; `problems` holds lines of the form `file: field: expected ..., got ...`."""

    source: str
    problems: list[str] = field(default_factory=list)

    def fail(self, path: str, expected: str, got: Any = _MISSING) -> None:
        got_text = "" if got is _MISSING else f", got {_short(got)}"
        self.problems.append(f"{self.source}: {path or '<document>'}: expected {expected}{got_text}")

    def get(self, doc: Any, key: str, path: str, kind: type | tuple[type, ...], expected: str,
            required: bool = True, default: Any = None) -> Any:
        where = f"{path}.{key}" if path else key
        if not isinstance(doc, dict):
            return default
        if key not in doc or doc[key] is None or required and doc[key] == "":
            if required:
                self.fail(where, f"{expected} (required field is missing)")
            return default
        value = doc[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, bool) and kind in (int, float):
            self.fail(where, expected, value)
            return default
        if not isinstance(value, kind):
            self.fail(where, expected, value)
            return default
        return value

    def pattern(self, doc: Any, key: str, path: str, regex: re.Pattern[str], expected: str,
                required: bool = True) -> str | None:
        value = self.get(doc, key, path, str, expected, required)
        if value is not None and not regex.match(value):
            self.fail(f"{path}.{key}" if path else key, expected, value)
            return None
        return value

    def one_of(self, doc: Any, key: str, path: str, choices: Iterable[str], required: bool = True,
               default: str | None = None) -> str | None:
        choices = list(choices)
        value = self.get(doc, key, path, str, f"one of {choices}", required, default)
        if value is not None and value not in choices:
            self.fail(f"{path}.{key}" if path else key, f"one of {choices}", value)
            return default
        return value

    def unknown_keys(self, doc: Any, path: str, allowed: Iterable[str]) -> None:
        if not isinstance(doc, dict):
            return
        allowed = set(allowed)
        for key in doc:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                self.fail(where, f"no such field (allowed: {', '.join(sorted(allowed))})")

    def raise_if_any(self) -> None:
        if self.problems:
            raise ManifestError(self.problems)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_yaml(path: Path) -> Any:
    """Parse one YAML file; a syntax error becomes one line naming the file and the line."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ManifestError([f"{path}: byte {exc.start}: expected UTF-8 text, got {exc.object[exc.start:exc.start + 1]!r}"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError([f"{path}: {where}: expected valid YAML, {problem}"]) from None
