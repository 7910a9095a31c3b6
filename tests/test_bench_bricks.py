"""bench/bricks.py on the zoo (issue 39 step 5), briefly: a suite of light_squeezenet and the zoo's
squeezenet-1.0, with squeezenet-1.1 held out and estimated from the bricks the suite stored. The
figures are not judged (timings on a shared machine); the JSON's shape is, and the held-out model's
new measurements against what the suite's bricks imply: every brick of it the suite did not measure,
and nothing else (the empty call was stored at the same thread count)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, str(REPO / "bench" / "bricks.py")]


def _brick_keys(results_path: str) -> set[str]:
    return {b["key"] for b in json.loads((Path(results_path) / "bricks.json").read_text())["bricks"]}


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("bench-bricks")
    out = folder / "bricks.json"
    # A model that cannot run sits in the middle: it is reported and the suite goes on around it.
    done = subprocess.run([*BENCH, "--models", "light_squeezenet", "no-such-model", "--zoo", "--family", "squeezenet",
                           "--hold-out", "squeezenet-1.1", "--time-cap", "0.05", "--no-variants", "--measure-ms", "200",
                           "--threads", "1", "--results-dir", str(folder / "results"), "--out", str(out)],
                          cwd=folder, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == "bench/bricks.py: 1 model(s) failed: no-such-model"
    assert "zoo 2/2: squeezenet-1.1 (squeezenet)" in done.stdout  # progress: the held-out is built last
    return json.loads(out.read_text())


def test_a_model_that_fails_is_listed_and_the_rest_of_the_suite_is_written(figures: dict[str, Any]) -> None:
    (failed,) = figures["failed"]
    assert failed["model"] == "no-such-model" and "no-such-model" in failed["error"]
    assert figures["summary"]["failed"] == 1 and len(figures["models"]) == 2 and len(figures["held_out"]) == 1


def test_the_suite_is_the_models_then_the_zoo_family_without_the_held_out(figures: dict[str, Any]) -> None:
    assert [(r["model"], r["family"]) for r in figures["models"]] == [("light-squeezenet", None),
                                                                      ("squeezenet-1.0", "squeezenet")]
    for row in figures["models"]:
        assert row["measured_ms"] > 0 and row["estimate_ms"] > 0 and row["plain_session_ms"] > 0
        assert row["error_pct"] is not None and row["plain_session_error_pct"] is not None
    summary = figures["summary"]
    assert summary["models"] == 2
    for key in ("within_2pct", "within_5pct", "within_10pct", "plain_within_2pct", "plain_within_5pct",
                "plain_within_10pct"):
        assert 0 <= summary[key] <= 1, key
    assert summary["within_2pct"] <= summary["within_5pct"] <= summary["within_10pct"]
    assert summary["speedup"] > 0 and summary["speedup_without_reuse"] > 0
    assert summary["speedup_without_reuse"] <= summary["speedup"]  # reuse only saves time
    gaps = sorted(abs(m["measured_ms"] / m["plain_session_ms"] - 1) * 100 for m in figures["models"])
    assert summary["references_gap_median_pct"] == pytest.approx(sum(gaps) / 2)  # two models: their mean
    assert summary["references_within_5pct"] == sum(g <= 5 for g in gaps) / 2


def test_the_machine_and_the_settings_are_recorded(figures: dict[str, Any]) -> None:
    machine = figures["machine"]
    assert machine["cpu_count"] >= 1 and machine["cpus_available"] >= 1 and machine["threads"] == 1
    assert len(machine["loadavg_start"]) == 3 and len(machine["loadavg_end"]) == 3
    settings = figures["settings"]
    assert (settings["threads"], settings["hold_out"], settings["families"], settings["variants"]) == (
        1, ["squeezenet-1.1"], ["squeezenet"], False)


def test_the_held_out_model_measures_only_the_bricks_the_suite_did_not_store(figures: dict[str, Any]) -> None:
    (held,) = figures["held_out"]
    assert held["model"] == "squeezenet-1.1"
    stored = set().union(*(_brick_keys(r["results_path"]) for r in figures["models"]))
    keys = _brick_keys(held["results_path"])
    assert len(keys) == held["unique_bricks"]
    assert held["missing_bricks"] == len(keys - stored) > 0  # 14 of 28 here, with this onnxruntime
    assert held["reused_bricks"] == len(keys & stored) > 0  # squeezenet-1.0's fire modules
    assert held["empty_call_measured"] is False  # stored by the suite at the same threads
    assert held["new_measurements"] == held["missing_bricks"]
    assert held["estimate_ms"] > 0 and held["measured_ms"] > 0 and held["error_pct"] is not None
    assert held["estimate_seconds"] > 0 and held["run_id"] != held["measured_run"]


@pytest.mark.parametrize(("args", "message"), [
    (["--hold-out", "squeezenet-1.2"], "zoo: no member named 'squeezenet-1.2' (did you mean"),
    (["--family", "lenet"], "--family lenet: not a zoo family"),
    (["--zoo-only", "--member", "googlenet", "--hold-out", "googlenet"], "no model left in the suite"),
])
def test_what_it_cannot_run_is_one_line_before_anything_is_built(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run([*BENCH, *args, "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "b.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "b.json").exists()
