"""`mlharness sweep` options on real short sweeps of the null model: --set reaches every cell's
LoadGen test, --dry-run lists the cells and runs nothing, --rerun runs finished cells again,
--timeout (the command's) stops an overrunning cell."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from mlharness.sweeps.sweep_grid import load_grid
from tests.support import run_cli

GRID = """\
    name: opts
    quick: true
    timeout: 120
    models: ["null"]
    scenarios: [Offline]
    batch_sizes: [8, 16]
    set: {target_qps: 20}
    """
SET = ("--set", "min_query_count=77", "--set", "target_qps=30")


def write_grid(path: Path, text: str = GRID) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def loadgen_values(detail_log: Path) -> dict:
    values = {}
    for line in detail_log.read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[len(":::MLLOG "):])
            values[entry["key"]] = entry["value"]
    return values


def table(store: ResultStore, sweep_id: str) -> dict[str, dict]:
    """The sweep's cells by batch size: status, run id and stored parameters."""
    found = {}
    for row in store.sweep_cells(sweep_id):
        params = json.loads(row["params_json"])
        batch = next(o.partition("=")[2] for o in params["overrides"] if o.startswith("max_batch_size="))
        found[batch] = {"status": row["status"], "run_id": row["run_id"], "overrides": params["overrides"],
                        "key": row["cell_key"]}
    return found


def dry_run_lines(err: str) -> list[list[str]]:
    """`KEY  repeat N  LABEL  [STATE]` lines of a dry run, split on their double spaces."""
    return [line.split("  ") for line in err.splitlines() if "  repeat " in line]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One sweep of two Offline cells with --set: min_query_count (not in the grid) and target_qps
    (over the grid's own `set`)."""
    root = tmp_path_factory.mktemp("sweep-options")
    grid = write_grid(root / "grid.yaml")
    results = root / "results"
    assert run_cli("sweep", grid, "--results-dir", results, *SET) == 0
    with ResultStore(results / "mlharness.sqlite") as store:
        cells = table(store, "opts")
    return {"grid": grid, "results": results, "cells": cells}


def test_set_reaches_every_cell(swept: dict) -> None:
    cells = swept["cells"]
    assert sorted(cells) == ["16", "8"] and all(c["status"] == "ok" for c in cells.values())
    with ResultStore(swept["results"] / "mlharness.sqlite") as store:
        for batch, cell in cells.items():
            assert cell["overrides"] == [f"max_batch_size={batch}", "min_query_count=77", "target_qps=30"]
            record = store.get_record(cell["run_id"]).to_dict()
            assert record["settings"]["loadgen"] == {"min_duration": "250", "min_query_count": "77",
                                                     "target_qps": "30"}
            assert record["settings"]["origin"]["min_query_count"] == "cli"
            assert record["settings"]["harness"]["max_batch_size"] == int(batch)
            # What LoadGen ran: 77 samples in Offline's one query (max(min_query_count, qps x 1 s)).
            logged = loadgen_values(Path(record["results_path"]) / "performance" / "run_1" / "mlperf_log_detail.txt")
            assert logged["requested_min_query_count"] == 77 and logged["requested_offline_expected_qps"] == 30
            assert logged["generated_samples_per_query"] == 77
            assert record["performance"]["samples_per_query"] == 77


def test_set_is_part_of_the_cell(swept: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The same grid without --set is other cells: nothing of the sweep counts as finished for it."""
    assert run_cli("sweep", swept["grid"], "--results-dir", swept["results"], "--dry-run") == 0
    lines = dry_run_lines(capsys.readouterr().err)
    assert [line[-1] for line in lines] == ["[to run]", "[to run]"]
    assert {line[0] for line in lines}.isdisjoint(c["key"] for c in swept["cells"].values())


def test_dry_run_lists_finished_and_new_cells_and_runs_nothing(swept: dict, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    shutil.copytree(swept["results"], results)
    grid = write_grid(tmp_path / "grid.yaml", GRID.replace("[8, 16]", "[8, 16, 32]"))
    db = results / "mlharness.sqlite"
    before = db.read_bytes()
    assert run_cli("sweep", grid, "--results-dir", results, "--dry-run", *SET) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # no summary, no best table: nothing ran
    lines = dry_run_lines(captured.err)
    assert [(line[1], line[2], line[3]) for line in lines] == [
        ("repeat 0", "null/default/Offline max_batch_size=8 min_query_count=77 target_qps=30", "[ok]"),
        ("repeat 0", "null/default/Offline max_batch_size=16 min_query_count=77 target_qps=30", "[ok]"),
        ("repeat 0", "null/default/Offline max_batch_size=32 min_query_count=77 target_qps=30", "[to run]")]
    assert [line[0] for line in lines[:2]] == [swept["cells"]["8"]["key"], swept["cells"]["16"]["key"]]
    assert db.read_bytes() == before  # not one row written
    assert len(list(results.glob("*/null/Offline/runs/*"))) == 2  # the two copied runs, no third
    with ResultStore(db) as store:
        assert len(store.sweep_cells("opts")) == 2 and len(store.list_runs()) == 2


def test_dry_run_of_a_new_sweep_prints_every_cell_and_repeat(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_grid(tmp_path / "grid.yaml")
    results = tmp_path / "results"
    assert run_cli("sweep", grid, "--results-dir", results, "--dry-run", "--repeat", "2") == 0
    lines = dry_run_lines(capsys.readouterr().err)
    keys = [cell.key for cell in load_grid(grid).cells]
    assert [(line[0], line[1], line[-1]) for line in lines] == [
        (keys[0], "repeat 0", "[to run]"), (keys[0], "repeat 1", "[to run]"),
        (keys[1], "repeat 0", "[to run]"), (keys[1], "repeat 1", "[to run]")]
    assert not list(results.rglob("run.json"))  # nothing ran


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    grid = write_grid(tmp_path / "grid.yaml")
    results = tmp_path / "results"
    assert run_cli("sweep", grid, "--results-dir", results, "--dry-run") == 0
    assert not results.exists()


def test_rerun_runs_finished_cells_again(swept: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    shutil.copytree(swept["results"], results)
    # Without --rerun the finished cells are skipped...
    assert run_cli("sweep", swept["grid"], "--results-dir", results, *SET) == 0
    assert "sweep opts: 0 ran now, 2 skipped as finished" in capsys.readouterr().out
    with ResultStore(results / "mlharness.sqlite") as store:
        assert len(store.list_runs()) == 2
    # ...with it, both run again: new runs, and each cell now points at its new run.
    assert run_cli("sweep", swept["grid"], "--results-dir", results, "--rerun", *SET) == 0
    assert "sweep opts: 2 ran now, 0 skipped as finished, 0 failed" in capsys.readouterr().out
    with ResultStore(results / "mlharness.sqlite") as store:
        cells = table(store, "opts")
        runs = {r["run_id"]: r for r in store.list_runs()}
    old = {swept["cells"][b]["run_id"] for b in ("8", "16")}
    new = {cells[b]["run_id"] for b in ("8", "16")}
    assert len(runs) == 4 and set(runs) == old | new and not old & new
    assert all(cells[b]["status"] == "ok" and cells[b]["key"] == swept["cells"][b]["key"] for b in ("8", "16"))
    assert all(runs[run_id]["sweep_id"] == "opts" for run_id in runs)


def test_the_command_timeout_overrides_the_grid_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_grid(tmp_path / "slow.yaml", """\
        name: slow
        quick: true
        timeout: 600
        models: ["null"]
        scenarios: [SingleStream]
        set: {target_latency: 0.01, min_duration: 60000}
        """)
    results = tmp_path / "results"
    assert run_cli("sweep", grid, "--results-dir", results, "--timeout", "3") == 0
    captured = capsys.readouterr()
    assert "(timeout 3 s each)" in captured.err and "timed out after 3 s" in captured.err
    with ResultStore(results / "mlharness.sqlite") as store:
        (cell,) = store.sweep_cells("slow")
        (run,) = store.list_runs()
    assert cell["status"] == "failed" and "timed out after 3 s" in cell["error"]
    assert 3 <= cell["seconds"] < 30  # stopped at 3 s, not at the grid's 600 or the run's 60
    assert run["run_id"] == cell["run_id"] and run["status"] == "failed"
    assert "sweep slow: 1 ran now, 0 skipped as finished, 1 failed cell run(s) in total" in captured.out
