"""Rules of the suite itself: a test's skip or xfail never depends on the product's source (a guard
that reads the code it guards switches itself off when the regression it names happens)."""
from __future__ import annotations

import ast

from tests.support import REPO


def test_no_test_reads_the_products_source() -> None:
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name == "test_suite_rules.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("getsource", "getsourcelines"):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
