"""How the bench/ scripts measure: each measurement runs in a fresh Python process (the script itself
with `--child SPEC`), which prints its figures as one marked JSON line; the parent reads that line.
A fresh process per measurement keeps one configuration's threads, arenas and caches out of the next."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULT_MARK = "BENCH-RESULT "
ROOT = Path(__file__).resolve().parent.parent


def report(result: dict[str, Any]) -> None:
    """In the child: hand the measurement to the parent (the last marked line is the result)."""
    print(RESULT_MARK + json.dumps(result), flush=True)


def without_db() -> dict[str, str]:
    """The environment less $MLHARNESS_DB: the children's runs stay in their temporary results folders."""
    return {key: value for key, value in os.environ.items() if key != "MLHARNESS_DB"}


def hermetic() -> dict[str, str]:
    """The environment less every MLHARNESS_* variable, with the progress display off."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLHARNESS_")}
    env["MLHARNESS_PROGRESS"] = "off"
    return env


def run_child(script: str | Path, spec: dict[str, Any], timeout: float,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any] | None, subprocess.CompletedProcess]:
    """Run `script --child SPEC` from the repository root; (its result, or None when it failed or
    reported nothing; the finished process, for its exit status and stderr)."""
    process = subprocess.run([sys.executable, str(script), "--child", json.dumps(spec)], capture_output=True,
                             text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
    lines = [line for line in process.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if process.returncode != 0 or not lines:
        return None, process
    return json.loads(lines[-1][len(RESULT_MARK):]), process


def measured(script: str | Path, spec: dict[str, Any], env: dict[str, str] | None, timeout: float = 1800) -> dict[str, Any]:
    """The child's result; a failed measurement raises RuntimeError with the end of its stderr."""
    result, process = run_child(script, spec, timeout, env)
    if result is None:
        raise RuntimeError(f"{spec}: measurement failed (exit {process.returncode}): {process.stderr[-3000:]}")
    return result
