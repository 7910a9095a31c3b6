"""User-facing options no other test exercised (issue 38), each checked on what it changes in real
runs: `submission package --model/--scenarios/--run/--results-system/--system-file`, `sweep --db` and
`--quiet`, `results sweeps`, `results export --scenario`. (More options are covered in
tests/test_cli_options_2.py.)

Runs are the null model with --quick; verdicts (VALID/INVALID) do not matter here, so nothing depends
on the machine's speed: packages are made with --allow-invalid and --skip-dataset-size-check."""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from mlharness.submission.rules import BENCHMARKS
from tests.support import copy_specs, null_model_with, run_cli, run_new

MODEL = "null-resnet"  # the null model named with an mlperf_benchmark (support.null_model_with), as in test_cli_submission


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A results tree of two models: null-resnet Offline (performance, then two accuracy runs) and
    SingleStream (performance, accuracy), and plain null Offline (performance, accuracy)."""
    root = tmp_path_factory.mktemp("package-options")
    specs = copy_specs(root / "specs")
    null_model_with(specs / "models", name=MODEL, benchmark="resnet50")
    results = root / "results"
    ids: dict[str, str] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLHARNESS_SPECS", str(specs))
        ids["off_perf"] = run_new(results, MODEL, "--scenario", "Offline", "--quick")
        ids["off_acc1"] = run_new(results, MODEL, "--scenario", "Offline", "--quick", "--mode", "accuracy")
        ids["off_acc2"] = run_new(results, MODEL, "--scenario", "Offline", "--quick", "--mode", "accuracy")
        ids["ss_perf"] = run_new(results, MODEL, "--scenario", "SingleStream", "--quick")
        ids["ss_acc"] = run_new(results, MODEL, "--scenario", "SingleStream", "--quick", "--mode", "accuracy")
        ids["null_perf"] = run_new(results, "null", "--scenario", "Offline", "--quick")
        ids["null_acc"] = run_new(results, "null", "--scenario", "Offline", "--quick", "--mode", "accuracy")
    (system,) = [p.name for p in results.iterdir() if p.is_dir()]
    return {"root": root, "specs": specs, "results": results, "ids": ids, "system": system}


@pytest.fixture
def env(tree: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("MLHARNESS_SPECS", str(tree["specs"]))
    return tree


def package(results: Path, out: Path, *extra: str) -> int:
    return run_cli("submission", "package", "--division", "open", "--submitter", "Acme", "--out", out,
                   "--results-dir", results, "--allow-invalid", "--skip-dataset-size-check", *extra)


def packaged(out: Path) -> dict[tuple[str, str, str], dict]:
    """(system, model folder, scenario) -> the provenance entry of every packaged scenario, checked
    against the folders that are really there."""
    base = out / "open" / "Acme"
    entries = json.loads((base / "src" / "mlharness_runs.json").read_text())["entries"]
    by_folder = {tuple(Path(e["folder"]).parts[1:]): e for e in entries}
    on_disk = {p.relative_to(base / "results").parts for p in (base / "results").glob("*/*/*") if p.is_dir()}
    assert set(by_folder) == on_disk
    return by_folder


def test_model_option_picks_the_models_packaged(env: dict, tmp_path: Path) -> None:
    results, system = env["results"], env["system"]
    # Every model by default (the plain null model names no benchmark: the check that ends packaging
    # finds its folder unknown, exit 1, but the tree is written).
    assert package(results, tmp_path / "all") == 1
    assert sorted(packaged(tmp_path / "all")) == [(system, "null", "Offline"), (system, MODEL, "Offline"),
                                                 (system, MODEL, "SingleStream")]
    # One model: only its folders, and the check passes.
    assert package(results, tmp_path / "one", "--model", MODEL) == 0
    assert sorted(packaged(tmp_path / "one")) == [(system, MODEL, "Offline"), (system, MODEL, "SingleStream")]
    # Repeated and comma-separated forms name the same two.
    assert package(results, tmp_path / "rep", "--model", "null", "--model", MODEL) == 1
    assert package(results, tmp_path / "comma", "--model", f"null,{MODEL}") == 1
    assert sorted(packaged(tmp_path / "rep")) == sorted(packaged(tmp_path / "comma")) == sorted(packaged(tmp_path / "all"))
    # model_mapping.json maps the models that name a benchmark, and is not written when none does.
    assert json.loads((tmp_path / "all" / "open" / "Acme" / "model_mapping.json").read_text()) == {MODEL: "resnet"}
    assert package(results, tmp_path / "plain", "--model", "null") == 1
    assert sorted(packaged(tmp_path / "plain")) == [(system, "null", "Offline")]
    assert not (tmp_path / "plain" / "open" / "Acme" / "model_mapping.json").exists()


def test_closed_division_refuses_a_model_that_names_no_benchmark(env: dict, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    results, system = env["results"], env["system"]
    assert run_cli("submission", "package", "--division", "closed", "--submitter", "Acme", "--out", tmp_path / "out",
                   "--results-dir", results, "--allow-invalid", "--model", "null") == 1
    assert capsys.readouterr().err == (f"mlharness: error: {results / system / 'null' / 'Offline'}: model 'null' names "
                                       f"no known mlperf_benchmark; the closed division needs one of "
                                       f"{', '.join(BENCHMARKS)}\n")
    assert list((tmp_path / "out").iterdir()) == []  # the staging folder removed, nothing written


def test_a_scenario_folder_without_run_records_is_packaged_from_its_logs(env: dict, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Logs copied without their LoadGen run records (no run.json of one, steps file or database): packaged as
    found, with the system description's detected fields undetected and the README saying what is not known; a
    record of another kind found there is left out, saying so."""
    source = env["results"] / env["system"] / "null" / "Offline"
    copy = tmp_path / "results" / "box" / "null" / "Offline"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("run.json", "submission_steps.json"))
    bricks = json.loads((source / "run.json").read_text()) | {"kind": "bricks", "run_id": "b1"}
    (copy / "run.json").write_text(json.dumps(bricks))
    out = tmp_path / "not" / "yet" / "made"  # made with its parents
    capsys.readouterr()
    assert package(tmp_path / "results", out) == 1  # the check after it: null names no benchmark
    left_out = f"{copy}: run b1 left out: a 'bricks' record, not a loadgen test (a submission packages LoadGen runs only)"
    said = capsys.readouterr().out.splitlines()
    assert said[1:3] == ["  marked NOT_FOR_SUBMISSION (1 reason(s), see NOT_FOR_SUBMISSION.txt)", f"  {left_out}"]
    base = out / "open" / "Acme"
    assert json.loads((base / "src" / "mlharness_runs.json").read_text())["skipped"] == [left_out]
    entry = packaged(out)[("box", "null", "Offline")]
    assert (entry["performance"], entry["accuracy"]) == (None, None)
    readme = (base / "results" / "box" / "null" / "Offline" / "README.md").read_text()
    assert readme == "# null  — Offline\n\nMeasured with mlharness on box; backend ?; model manifest sha256 ?.\n"
    system = json.loads((base / "systems" / "box.json").read_text())
    assert system["host_processor_model_name"] == system["host_memory_capacity"] == "undetected"
    assert json.loads((base / "src" / "manifests.json").read_text()) == {}


def test_package_records_each_run_it_packaged_and_why_the_tree_is_not_for_submission(env: dict, tmp_path: Path) -> None:
    """src/mlharness_runs.json (schema 1): the tree's division, submitter and system, each packaged folder with its
    runs, and the problems that make it not for submission, which NOT_FOR_SUBMISSION.txt lists a line each."""
    results, system, ids = env["results"], env["system"], env["ids"]
    assert package(results, tmp_path / "out", "--model", MODEL, "--scenarios", "Offline", "--system", "tiny-box") == 0
    base = tmp_path / "out" / "open" / "Acme"
    provenance = json.loads((base / "src" / "mlharness_runs.json").read_text())
    reasons = provenance.pop("reasons")
    (entry,) = provenance.pop("entries")
    assert provenance == {"schema_version": 1, "tool": "mlharness", "division": "open", "submitter": "Acme",
                          "system": "tiny-box", "not_for_submission": True, "skipped": []}
    source = results / system / MODEL / "Offline"
    overrides = [f"{source}: {mode} run {ids[key]} overrode protected settings min_duration, min_query_count "
                 f"(layers: min_duration<-preset:quick, min_query_count<-preset:quick)"
                 for mode, key in (("performance", "off_perf"), ("accuracy", "off_acc2"))]
    # --quick's runs override durations; whether LoadGen also called the run INVALID is the machine's speed.
    verdict = f"{source / 'performance' / 'run_1' / 'mlperf_log_summary.txt'}: LoadGen result is INVALID, expected VALID"
    assert reasons in (overrides, [verdict] + overrides)
    assert (base / "NOT_FOR_SUBMISSION.txt").read_text() == (
        "NOT FOR SUBMISSION: packaged with --allow-invalid from runs that are not submission-grade:\n"
        + "".join(f"- {reason}\n" for reason in reasons))
    assert {k: entry[k] for k in ("folder", "model", "benchmark", "scenario", "source")} == {
        "folder": f"results/tiny-box/{MODEL}/Offline", "model": MODEL, "benchmark": "resnet", "scenario": "Offline",
        "source": str(source)}
    assert entry["compliance"] == {}
    for kind, key in (("performance", "off_perf"), ("accuracy", "off_acc2")):
        record = json.loads((source / "runs" / ids[key] / "run.json").read_text())
        assert entry[kind] == {"run_id": ids[key], "mode": kind, "status": "ok", "command": record["command"],
                               "result": (record["performance"] or {}).get("result"),
                               "overridden_protected": ["min_duration", "min_query_count"],
                               "settings_origin": record["settings"]["origin"]}
    assert entry["performance"]["result"] in ("VALID", "INVALID") and entry["accuracy"]["result"] is None


def test_model_option_naming_no_recorded_model_is_refused(env: dict, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert package(env["results"], tmp_path / "out", "--model", "resnet50-light") == 1
    assert capsys.readouterr().err.strip() == (f"mlharness: error: {env['results']}: no recorded runs match "
                                               f"(model ['resnet50-light'], scenarios any)")
    assert not (tmp_path / "out" / "open").exists()


def test_scenarios_option_picks_the_scenarios_packaged(env: dict, tmp_path: Path) -> None:
    results, system, ids = env["results"], env["system"], env["ids"]
    assert package(results, tmp_path / "ss", "--model", MODEL, "--scenarios", "SingleStream") == 0
    found = packaged(tmp_path / "ss")
    assert list(found) == [(system, MODEL, "SingleStream")]
    entry = found[(system, MODEL, "SingleStream")]
    assert (entry["performance"]["run_id"], entry["accuracy"]["run_id"]) == (ids["ss_perf"], ids["ss_acc"])
    # Across models: Offline of both, no SingleStream.
    assert package(results, tmp_path / "off", "--scenarios", "Offline") == 1
    assert sorted(packaged(tmp_path / "off")) == [(system, "null", "Offline"), (system, MODEL, "Offline")]


def _accuracy_detail(results: Path, system: str, run_id: str) -> bytes:
    return (results / system / MODEL / "Offline" / "runs" / run_id / "accuracy" / "mlperf_log_detail.txt").read_bytes()


def test_run_option_default_is_the_latest_and_pins_are_checked(env: dict, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    results, system, ids = env["results"], env["system"], env["ids"]
    assert _accuracy_detail(results, system, ids["off_acc1"]) != _accuracy_detail(results, system, ids["off_acc2"])
    # Without --run: the latest accuracy run, its logs and its id.
    assert package(results, tmp_path / "latest", "--model", MODEL, "--scenarios", "Offline") == 0
    entry = packaged(tmp_path / "latest")[(system, MODEL, "Offline")]
    assert (entry["performance"]["run_id"], entry["accuracy"]["run_id"]) == (ids["off_perf"], ids["off_acc2"])
    dest = tmp_path / "latest" / "open" / "Acme" / "results" / system / MODEL / "Offline"
    assert (dest / "accuracy" / "mlperf_log_detail.txt").read_bytes() == _accuracy_detail(results, system, ids["off_acc2"])
    capsys.readouterr()
    # A pin that matches no run of the selected scenario folders is refused, nothing written.
    assert package(results, tmp_path / "bad", "--model", MODEL, "--scenarios", "Offline", "--run", ids["ss_perf"]) == 1
    assert capsys.readouterr().err.strip() == (f"mlharness: error: --run {ids['ss_perf']}: no ok run with that id "
                                               f"among the selected scenario folders")
    assert not (tmp_path / "bad" / "open").exists()
    # A pin by id prefix (the id's date part plus its hash) selects that run.
    prefix = ids["ss_perf"][:-2]
    assert prefix != ids["ss_perf"]
    assert package(results, tmp_path / "pinned", "--model", MODEL, "--run", prefix) == 0
    assert packaged(tmp_path / "pinned")[(system, MODEL, "SingleStream")]["performance"]["run_id"] == ids["ss_perf"]


def test_run_option_pinning_an_older_accuracy_run_packages_its_logs(env: dict, tmp_path: Path) -> None:
    results, system, ids = env["results"], env["system"], env["ids"]
    assert package(results, tmp_path / "old", "--model", MODEL, "--scenarios", "Offline", "--run", ids["off_acc1"]) == 0
    entry = packaged(tmp_path / "old")[(system, MODEL, "Offline")]
    assert entry["accuracy"]["run_id"] == ids["off_acc1"]  # what the package says it holds
    dest = tmp_path / "old" / "open" / "Acme" / "results" / system / MODEL / "Offline"
    assert f"## Accuracy (run {ids['off_acc1']}" in (dest / "README.md").read_text()
    # ... and what it holds: the pinned run's logs, not the latest run's.
    assert (dest / "accuracy" / "mlperf_log_detail.txt").read_bytes() == _accuracy_detail(results, system, ids["off_acc1"])


def test_results_system_option_picks_the_system_folder(env: dict, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A results tree with a second system folder (a copy of the first's null-resnet Offline runs)."""
    system = env["system"]
    results = tmp_path / "results"
    shutil.copytree(env["results"], results)
    other = results / "Other_box_4c"
    shutil.copytree(results / system / MODEL / "Offline", other / MODEL / "Offline")
    capsys.readouterr()
    assert package(results, tmp_path / "none", "--model", MODEL) == 1
    assert capsys.readouterr().err.strip() == (f"mlharness: error: {results}: runs from several systems "
                                               f"({', '.join(sorted([system, 'Other_box_4c']))}); pass --results-system")
    assert package(results, tmp_path / "nosuch", "--model", MODEL, "--results-system", "Nowhere") == 1
    assert capsys.readouterr().err.strip() == (f"mlharness: error: {results / 'Nowhere'}: no such system folder in "
                                               f"the results tree")
    assert package(results, tmp_path / "mine", "--model", MODEL, "--results-system", system) == 0
    found = packaged(tmp_path / "mine")
    assert sorted(found) == [(system, MODEL, "Offline"), (system, MODEL, "SingleStream")]
    assert {Path(e["source"]).parent.parent for e in found.values()} == {results / system}
    assert package(results, tmp_path / "other", "--model", MODEL, "--results-system", "Other_box_4c") == 0
    found = packaged(tmp_path / "other")
    assert list(found) == [("Other_box_4c", MODEL, "Offline")]  # the submission's system is named after the folder
    assert Path(found[("Other_box_4c", MODEL, "Offline")]["source"]) == other / MODEL / "Offline"
    assert [p.name for p in (tmp_path / "other" / "open" / "Acme" / "systems").iterdir()] == ["Other_box_4c.json"]


def test_system_file_option_fills_the_system_description(env: dict, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    results, system = env["results"], env["system"]
    assert package(results, tmp_path / "plain", "--model", MODEL) == 0
    plain_out = capsys.readouterr().out
    plain = json.loads((tmp_path / "plain" / "open" / "Acme" / "systems" / f"{system}.json").read_text())
    assert plain["cooling"] == plain["host_storage_type"] == plain["system_type_detail"] == "undetected"
    # What the first packaged run detected: its memory and the packages it ran with.
    record = json.loads((results / system / MODEL / "Offline" / "runs" / env["ids"]["off_perf"] / "run.json").read_text())
    assert plain["host_memory_capacity"] == f"{record['system']['memory_bytes'] / 2**30:.0f} GB"
    loadgen = record["software"]["versions"]["mlcommons-loadgen"]
    assert f", mlcommons-loadgen {loadgen}" in plain["other_software_stack"]
    assert "system fields not detected (set with --system-field KEY=VALUE): " in plain_out
    fields = tmp_path / "fields.json"
    fields.write_text(json.dumps({"cooling": "air", "host_storage_type": "NVMe SSD", "system_type_detail": "from file"}))
    assert package(results, tmp_path / "filled", "--model", MODEL, "--system-file", fields,
                   "--system-field", "system_type_detail=from flag") == 0
    out = capsys.readouterr().out
    desc = json.loads((tmp_path / "filled" / "open" / "Acme" / "systems" / f"{system}.json").read_text())
    # The file's fields are set; a --system-field flag wins over the file; the rest is as detected.
    assert (desc["cooling"], desc["host_storage_type"], desc["system_type_detail"]) == ("air", "NVMe SSD", "from flag")
    assert {k: v for k, v in desc.items() if k not in ("cooling", "host_storage_type", "system_type_detail")} == \
        {k: v for k, v in plain.items() if k not in ("cooling", "host_storage_type", "system_type_detail")}
    undetected_line = next(line for line in out.splitlines() if "system fields not detected" in line)
    for key in ("cooling", "host_storage_type", "system_type_detail"):
        assert key in plain_out and key not in undetected_line
    # A key that is no system description field, from a file, is refused naming it.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"colour": "blue"}))
    assert package(results, tmp_path / "bad", "--model", MODEL, "--system-file", bad) == 1
    assert capsys.readouterr().err.startswith("mlharness: error: --system-field colour: not a system description field")


# ---- sweep --db / --quiet, results sweeps, results export --scenario ----------------------------

GRID = """\
    name: optsweep
    quick: true
    timeout: 120
    models:
      - name: "null"
        set:
          SingleStream: {target_latency: 0.002}
          Offline: {target_qps: 50000}
    scenarios: [Offline, SingleStream]
    """


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The grid swept twice into a database given with --db, away from the results tree: under its
    own name and as --sweep-id again."""
    root = tmp_path_factory.mktemp("sweep-options")
    grid = root / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID))
    results, db = root / "results", root / "elsewhere" / "sweeps.sqlite"
    db.parent.mkdir()
    assert run_cli("sweep", grid, "--results-dir", results, "--db", db) == 0
    assert run_cli("sweep", grid, "--results-dir", results, "--db", db, "--sweep-id", "again") == 0
    return {"grid": grid, "results": results, "db": db}


def _cells(db: Path, sweep_id: str) -> dict[str, str]:
    """The sweep's cells as stored: scenario -> run id."""
    from mlharness.store.result_store import ResultStore

    with ResultStore(db, create=False) as store:
        rows = store.sweep_cells(sweep_id)
        return {store.get_record(row["run_id"]).scenario: row["run_id"] for row in rows if row["status"] == "ok"}


def test_sweep_db_option_stores_the_sweep_there_not_in_the_results_tree(swept: dict,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    results, db = swept["results"], swept["db"]
    assert not (results / "mlharness.sqlite").exists()
    cells = _cells(db, "optsweep")
    assert sorted(cells) == ["Offline", "SingleStream"]
    # The runs' files are in the results tree all the same.
    for scenario, run_id in cells.items():
        assert list(results.glob(f"*/null/{scenario}/runs/{run_id}/run.json"))
    capsys.readouterr()
    assert run_cli("results", "sweeps", "--results-dir", results) == 1
    assert capsys.readouterr().err.strip() == (f"mlharness: error: {results / 'mlharness.sqlite'}: no results database "
                                               f"here (run something first, or pass --db)")


def test_results_sweeps_lists_each_sweep_with_its_cells(swept: dict, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run_cli("results", "sweeps", "--db", swept["db"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["sweep", "name", "grid", "cells", "run", "ok", "updated"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert sorted(rows) == ["again", "optsweep"]
    for sweep_id, row in rows.items():
        # id, the grid's name, the grid file, cells run, ok
        assert row[1:5] == ["optsweep", str(swept["grid"]), "2", "2"], row
    assert len(lines) == 4  # header, rule, two sweeps


def _export(db: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict]:
    capsys.readouterr()
    assert run_cli("results", "export", "--db", db, "--format", "csv", *extra) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def test_results_export_scenario_option_filters_the_rows(swept: dict, capsys: pytest.CaptureFixture[str]) -> None:
    db = swept["db"]
    every = _export(db, capsys)
    assert sorted(r["scenario"] for r in every) == ["Offline", "Offline", "SingleStream", "SingleStream"]
    for scenario in ("Offline", "SingleStream"):
        rows = _export(db, capsys, "--scenario", scenario)
        expected = {_cells(db, "optsweep")[scenario], _cells(db, "again")[scenario]}
        assert {r["run_id"] for r in rows} == expected and {r["scenario"] for r in rows} == {scenario}
        # With another filter beside it (both apply) and with --summary (one row per scenario).
        assert [r["run_id"] for r in _export(db, capsys, "--scenario", scenario, "--sweep", "again")] == \
            [_cells(db, "again")[scenario]]
        summary = _export(db, capsys, "--summary", "--scenario", scenario)
        assert [r["scenario"] for r in summary] == [scenario]
    assert _export(db, capsys, "--scenario", "Server") == []
    # A scenario that is none (a wrong case, a typo) is refused in one line, not an empty export.
    with pytest.raises(SystemExit) as refused:
        run_cli("results", "export", "--db", db, "--scenario", "offline")
    assert refused.value.code == 2
    assert "argument --scenario: invalid choice: 'offline'" in capsys.readouterr().err


def test_sweep_quiet_option_drops_the_live_progress_not_the_cell_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """Progress on (the suite turns it off) with a line every 20 ms, through a Server cell whose LoadGen
    test lasts at least 1 s (min_duration): the ticker draws however fast the machine."""
    monkeypatch.delenv("MLHARNESS_PROGRESS")
    monkeypatch.setenv("MLHARNESS_PROGRESS_INTERVAL", "0.02")
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID).replace("[Offline, SingleStream]", "[Server]"))
    args = ("sweep", grid, "--results-dir", tmp_path / "results", "--set", "min_duration=1000",
            "--set", "target_qps=2000", "--rerun")

    def cell_lines(err: str) -> list[str]:
        return [line for line in err.splitlines() if line.startswith("[1/1] null/default/Server ")]

    capfd.readouterr()
    assert run_cli(*args) == 0
    err = capfd.readouterr().err
    progress = [line for line in err.splitlines() if line.startswith("[progress] ")]
    assert progress, err
    assert all(re.match(r"\[progress\] [01]/1 cells", line) for line in progress), progress  # no empty label first
    assert len(cell_lines(err)) == 1 and ": ok (" in cell_lines(err)[0]
    assert run_cli(*args, "--quiet") == 0
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if line.startswith("[progress]")], err
    assert len(cell_lines(err)) == 1 and ": ok (" in cell_lines(err)[0]
    assert err.startswith("sweep optsweep: 1 cell run(s), 0 already finished, 1 to run")
