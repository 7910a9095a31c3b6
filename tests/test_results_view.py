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


def test_the_view_never_chooses_a_run_whose_record_is_damaged_or_newer(tmp_path: Path) -> None:
    """A run.json the record reader refuses (a newer schema, a field of the wrong type) is never
    published, even when it is the newest: the view stays on the last run that reads."""
    from mlharness.records.results import rebuild_view

    results = tmp_path / "results"
    assert run_cli(*RUN, "--results-dir", results) == 0
    good = newest_run(results, "null", "Offline")
    view = scenario_root(results, "null", "Offline")
    for name, change in (("newer", {"schema_version": 99}), ("wrong-type", {"settings": "fast"})):
        later = dict(good, run_id=f"99991231T000000000000Z-{name}", started_at="9999-12-31T00:00:00+00:00", **change)
        (view / "runs" / later["run_id"]).mkdir()
        (view / "runs" / later["run_id"] / "run.json").write_text(json.dumps(later))
    rebuild_view(view)
    assert json.loads((view / "run.json").read_text())["run_id"] == good["run_id"]
    assert json.loads((view / "view.json").read_text())["run_id"] == good["run_id"]
