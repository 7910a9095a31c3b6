"""Each run's files are its own (runs/<run id>/); the MLPerf-shaped view of <Scenario>/ is rebuilt
from the latest ok performance run and the latest ok accuracy run, with nothing of an older run left."""
from __future__ import annotations

import json
from pathlib import Path

from tests.support import newest_run, run_cli, scenario_root

RUN = ("run", "null", "--scenario", "Offline", "--quick")


def test_the_view_follows_the_chosen_runs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert run_cli(*RUN, "--profile", "harness", "--results-dir", results) == 0
    profiled = newest_run(results, "null", "Offline")
    view = scenario_root(results, "null", "Offline")
    assert (view / "profile" / "summary.json").is_file()

    assert run_cli(*RUN, "--results-dir", results) == 0
    plain = newest_run(results, "null", "Offline")
    # The newer run had no profile: the view drops it; the profiled run keeps its own.
    assert not (view / "profile").exists()
    assert (Path(profiled["results_path"]) / "profile" / "summary.json").is_file()
    assert json.loads((view / "run.json").read_text())["run_id"] == plain["run_id"]

    assert run_cli(*RUN, "--mode", "accuracy", "--results-dir", results) == 0
    accuracy = newest_run(results, "null", "Offline")
    # Performance (and run.json) stay the latest performance run's; accuracy/ is the accuracy run's.
    assert json.loads((view / "run.json").read_text())["run_id"] == plain["run_id"]
    own = Path(accuracy["results_path"]) / "accuracy" / "accuracy.txt"
    assert (view / "accuracy" / "accuracy.txt").read_bytes() == own.read_bytes()
    assert (view / "accuracy" / "accuracy.txt").samefile(own)  # a hard link, not a copy
    assert sorted(p.name for p in (view / "runs").iterdir()) == sorted(
        r["run_id"] for r in (profiled, plain, accuracy))
