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


def test_a_ready_line_written_together_with_another_is_seen_at_once() -> None:
    """The helper that waits for a server's "ready" line: a line that arrives in the same write as the one
    before it is in the pipe's buffer, not the pipe; a select() on the pipe would wait out its bound."""
    import re
    import subprocess
    import sys

    from tests.network_support import read_until

    code = "import sys, time; sys.stderr.write('starting\\nready at 127.0.0.1:1\\n'); sys.stderr.flush(); time.sleep(600)"
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    try:
        match = read_until(process, log, re.compile(r"ready at (\S+)"), 300)
        assert match is not None and match[1] == "127.0.0.1:1" and log == ["starting\n", "ready at 127.0.0.1:1\n"]
        assert process.poll() is None  # found while the process still runs: not at its end
    finally:
        process.kill()
        process.wait()
