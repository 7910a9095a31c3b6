"""The small Python API (`from mlharness import ...`): the README's example runs as written, and
importing the package stays light."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

API = ("run", "RunRequest", "RunRecord", "ResultStore", "load_manifest", "UserError")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c CODE` from `cwd` with this checkout importable, and the shipped specs, presets and
    the results database under the run's --results-dir (none of the developer's overrides)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLHARNESS_SPECS", "MLHARNESS_SCENARIOS", "MLHARNESS_DB")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["MLHARNESS_CACHE"] = str(cwd / "cache")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def readme_example() -> str:
    """The one ```python block of the README's "Python API" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert len(blocks) == 1, blocks
    return blocks[0]


def test_readme_example_runs(tmp_path: Path) -> None:
    result = _python(readme_example(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    status, valid, figure, unit = lines[0].split()
    assert (status, valid in ("VALID", "INVALID"), unit) == ("ok", True, "samples/s") and float(figure) > 0
    record = json.loads(next((tmp_path / "results").glob("*/null/Offline/run.json")).read_text())
    assert lines[1] == f"results in {record['results_path']}"
    # The run's row in the database, its headline figure the one printed from the record.
    run_id, model, scenario, metric, value = lines[2].split()
    assert (run_id, model, scenario, metric) == (record["run_id"], "null", "Offline", "offline.samples_per_second")
    assert float(value) == float(figure) == record["performance"]["samples_per_second"]
    assert len(lines) == 3


def test_public_names_import_without_a_framework(tmp_path: Path) -> None:
    code = ("import json, sys\nfrom mlharness import " + ", ".join(API) + "\nimport mlharness\n"
            "print(json.dumps(mlharness.__all__))\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'onnxruntime', 'onnx', 'transformers', 'numpy', 'mlperf_loadgen') "
            "or m.startswith('mlharness.sut'))))")
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    exported, heavy = (json.loads(line) for line in result.stdout.splitlines())
    assert set(API) <= set(exported)
    assert heavy == []


def test_import_harness_alone_defers_the_request_and_store_modules(tmp_path: Path) -> None:
    code = ("import sys, mlharness\nprint(sorted(m for m in sys.modules if m in "
            "('mlharness.running.request', 'mlharness.store.result_store', 'mlharness.running.runner', 'sqlite3')))\n"
            "print(mlharness.RunRequest.__module__, mlharness.ResultStore.__module__)")
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "mlharness.running.request mlharness.store.result_store"]


def test_the_recorded_command_is_the_one_given_to_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`main(argv)` called in-process (by a notebook, pytest, mutmut) records argv, not the host
    program's sys.argv, as the run's command and in its README's "Reproduce with"."""
    from tests.support import newest_run, run_cli, scenario_root

    monkeypatch.setattr(sys, "argv", ["mutmut", "run", "--max-children", "2"])
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", tmp_path) == 0
    command = newest_run(tmp_path, "null", "Offline")["command"]
    assert command == f"mlharness run null --scenario Offline --quick --results-dir {tmp_path}"
    assert command in (scenario_root(tmp_path, "null", "Offline") / "README.md").read_text()


def test_the_run_process_imports_the_callers_harness(tmp_path: Path) -> None:
    """A run's own process imports the harness the caller imported (a copy of the tree here, as
    a mutation run or a second checkout would be), not whatever an installed copy points to."""
    import shutil

    copy = tmp_path / "copy"
    # The namespace as plain folders: harness/ is mlharness/, sut/ is mlharness/sut/, ...
    shutil.copytree(REPO / "harness", copy / "mlharness", ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("sut", "specs", "profiling", "scenarios"):
        shutil.copytree(REPO / package, copy / "mlharness" / package, ignore=shutil.ignore_patterns("__pycache__"))
    runner = copy / "mlharness" / "running" / "runner.py"
    marker = tmp_path / "imported-from.txt"
    runner.write_text(runner.read_text() + f"\nimport pathlib\npathlib.Path({str(marker)!r}).write_text(__file__)\n")
    # Imported from the copy (the working directory), then run from elsewhere, as pytest's tests
    # run in their own tmp_path.
    code = (f"import os\nfrom mlharness.cli import main\nos.chdir({str(tmp_path)!r})\n"
            f"raise SystemExit(main(['run', 'null', '--scenario', 'Offline', '--quick', '--results-dir', {str(tmp_path / 'r')!r}]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert marker.read_text() == str(runner)
