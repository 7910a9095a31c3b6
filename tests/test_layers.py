"""Layers point one way: specs (manifests, validation, the index, artifacts) < sut and profiling (the
runtime) < harness (orchestration, CLI). Read from the source, every import counted, lazy ones too."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO

# Each folder's place in the one namespace (pyproject.toml's package-dir).
PACKAGES = {"specs": "mlharness.specs", "harness": "mlharness", "sut": "mlharness.sut",
            "profiling": "mlharness.profiling"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, dotted in PACKAGES.items():
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO / package).with_suffix("").parts
            name = ".".join((dotted, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            found[name] = path
    return found


def layer(module: str) -> str:
    """The layer of a module of the namespace: specs, sut, profiling or harness (the rest of mlharness)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("specs", "sut", "profiling") else "harness"


def test_the_namespace_is_mapped_as_the_build_says() -> None:
    """pyproject.toml's package-dir is the table above (the layer checks read the folders by it)."""
    import tomllib

    mapped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert {folder: dotted for dotted, folder in mapped.items() if folder in PACKAGES} == PACKAGES


def test_no_module_imports_the_old_top_level_names() -> None:
    """Everything imports as mlharness: `import harness` or `from sut ...` would only work from a checkout."""
    old = {"harness", "sut", "specs", "profiling", "scenarios"}
    found = []
    for folder in (*PACKAGES, "tests", "bench", "tools"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in old]
    assert found == []


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an import names (`from a.b import c` may name module a.b.c or a.b)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            deps |= {found for target in targets if (found := _resolve(target, modules))}
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_runtime_uses_only_the_spec_layer_and_leaf_modules_of_harness() -> None:
    graph = import_graph()
    leaves = {m for m, deps in graph.items() if layer(m) == "harness" and m != "mlharness" and not deps}
    assert {"mlharness.errors", "mlharness.atomic_io"} <= leaves
    wrong = {m: sorted(d for d in deps if layer(d) == "harness" and d not in leaves)
             for m, deps in graph.items() if layer(m) in ("sut", "profiling", "specs")}
    assert {m: d for m, d in wrong.items() if d} == {}


def test_the_spec_layer_does_not_import_the_runtime() -> None:
    graph = import_graph()
    wrong = {m: sorted(d for d in deps if layer(d) in ("sut", "profiling"))
             for m, deps in graph.items() if layer(m) == "specs"}
    assert {m: d for m, d in wrong.items() if d} == {}


def test_the_checker_sees_a_cycle() -> None:
    """The cycle finder itself: a two-module loop and a self-contained chain."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_each_layer_imports_first_in_a_fresh_interpreter() -> None:
    """A plugin or script may import the spec layer or the runtime before `harness`: no import order
    may meet a half-initialised module."""
    import subprocess
    import sys

    first = ["mlharness.specs.manifests", "mlharness.specs.index", "mlharness.specs.artifacts", "mlharness.sut.backends",
             "mlharness.sut.runtime", "mlharness.profiling", "mlharness.errors", "mlharness"]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    for module in first:
        done = subprocess.run([sys.executable, "-c", code, module, "mlharness.cli"], cwd=REPO, capture_output=True,
                              text=True)
        assert done.returncode == 0, f"import {module} first: {done.stderr.strip().splitlines()[-1:]}"
