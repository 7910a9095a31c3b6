"""The code a `module:function` model factory runs: its module's file and, followed through their
imports, the modules of its own top-level package it imports (a helper shared by several factories,
such as mlharness.sut.architectures.init_weights, lives in another file than the factory). The
conversion cache keys an exported graph by their digests, so that editing any of them converts again.

Imports are read from the source (ast), not run: finding a module imports only its parent packages.
Modules of other top-level packages (torch, numpy) are versioned packages, not the user's code, and
are left out."""
from __future__ import annotations

import ast
import hashlib
import importlib.util
from pathlib import Path

from mlharness.specs import artifacts


def factory_code_files(module: str) -> dict[str, Path]:
    """Each module the factory module `module` reaches within its top-level package, by name, with its
    source file (the factory module first); empty when `module` has no source file."""
    top = module.partition(".")[0]
    found: dict[str, Path] = {}
    waiting = [module]
    while waiting:
        name = waiting.pop(0)
        if name in found:
            continue
        path = _source_file(name)
        if path is None:
            continue
        found[name] = path
        waiting += [m for m in _imported(path, name, _is_package(path)) if m.partition(".")[0] == top]
    return found


def factory_code_sha256(module: str) -> str | None:
    """One digest of the files factory_code_files finds (their module names and contents); None when
    the factory module has no source file."""
    files = factory_code_files(module)
    if not files:
        return None
    listing = "".join(f"{name} {artifacts.sha256_file(path)}\n" for name, path in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def _source_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent that is not a package, or one that fails to import
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py") or not Path(spec.origin).is_file():
        return None
    return Path(spec.origin)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imported(path: Path, name: str, is_package: bool) -> list[str]:
    """The module names `path`'s import statements name, anywhere in it (also inside functions):
    `import a.b`, `from a import b` (a, and a.b in case b is a module), relative ones resolved."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # the factory's import reports it when the graph is exported
    package = name if is_package else name.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            if base is None:
                continue
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    return [n for n in names if n]


def _resolve(module: str, level: int, package: str) -> str | None:
    """`from ..x import y`'s module name, seen from `package`; None when it climbs above the top."""
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 >= len(parts):
        return None
    base = parts[:len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None
