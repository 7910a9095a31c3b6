"""Bad input a fresh-clone review still found breaking the promise (one line naming the file, field,
flag or endpoint; a non-zero exit; no traceback; nothing written lost): a stdout whose reader has gone,
a damaged results database, run records of the wrong shape, output paths that are folders or files,
out-of-range flags, profile summaries without their sections, duplicate YAML keys, a model manifest's
attributes, and the unknown-setting message. Real files, the real CLI (in process or as a subprocess)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, newest_run, run_cli, run_ids, run_new, sha256, write_manifest

PREFIX = "mlharness: error: "


def one_error(capfd: pytest.CaptureFixture[str]) -> str:
    """The single line on stderr (after the prefix); fails on a traceback or a second line."""
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(PREFIX), err
    return lines[0][len(PREFIX):]


@pytest.fixture(scope="module")
def null_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """One real null Offline --quick run: its results folder, database, run.json and id."""
    results = tmp_path_factory.mktemp("round2") / "results"
    run_id = run_new(results, "null", "--scenario", "Offline", "--quick")
    record = newest_run(results, "null", "Offline")
    assert record["run_id"] == run_id
    (run_json,) = [p for p in results.rglob("run.json") if json.loads(p.read_text())["run_id"] == run_id
                   and "runs" in p.parts]
    return {"results": results, "db": results / "mlharness.sqlite", "run_json": run_json, "run_id": run_id}


# ---- 1. a stdout whose reader has gone -------------------------------------------------------------

def closed_stdout(*args: str | Path) -> tuple[int, str]:
    """Run the command with a stdout pipe whose reader closed it before the command started (as
    `mlharness ... | head -0`): its status and stderr."""
    process = subprocess.Popen([sys.executable, "-m", "mlharness.cli", *map(str, args)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.stdout.close()
    err = process.stderr.read().decode()
    return process.wait(timeout=120), err


@pytest.mark.parametrize("args", [("specs", "list"), ("specs", "validate")])
def test_a_closed_stdout_ends_the_command_quietly(args: tuple[str, ...]) -> None:
    assert closed_stdout(*args) == (141, "")  # 128 + SIGPIPE, as a shell reports a program the signal stopped


def test_a_closed_stdout_after_help_is_quiet() -> None:
    """argparse itself ignores a failed write of --help (status 0); nothing is left for the exit to trip on."""
    status, err = closed_stdout("--help")
    assert (status, err) in ((0, ""), (141, ""))


def test_a_closed_stdout_ends_a_database_query_quietly(null_run: dict) -> None:
    assert closed_stdout("results", "list", "--db", null_run["db"]) == (141, "")
    assert closed_stdout("results", "show", null_run["run_id"], "--json", "--db", null_run["db"]) == (141, "")


# ---- 2. a results database with smashed pages ------------------------------------------------------

@pytest.mark.parametrize("command", [("results", "list"), ("results", "show", "2"), ("results", "export"),
                                     ("results", "sweeps")])
def test_a_database_with_smashed_pages_is_named_in_one_line(null_run: dict, tmp_path: Path, command: tuple[str, ...],
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "smashed.sqlite"
    shutil.copyfile(null_run["db"], db)
    size = db.stat().st_size
    with db.open("r+b") as handle:  # keep the header (it opens), garbage over every page after the first
        handle.seek(4096)
        handle.write(bytes((i * 37 + 11) % 256 for i in range(size - 4096)))
    before = sha256(db)
    assert run_cli(*command, "--db", db) == 1
    assert one_error(capfd) == f"{db}: not a usable results database (database disk image is malformed)"
    assert sha256(db) == before


def test_a_run_beside_a_smashed_database_keeps_its_files_and_says_so(null_run: dict, tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """The tuning lookup before the run reads past the damage (no tuning), the run goes on, and storing its
    record is the one line naming the database."""
    results = tmp_path / "results"
    results.mkdir()
    db = results / "mlharness.sqlite"
    shutil.copyfile(null_run["db"], db)
    with db.open("r+b") as handle:
        handle.seek(4096)
        handle.write(bytes((i * 37 + 11) % 256 for i in range(db.stat().st_size - 4096)))
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", results) == 1
    message = one_error(capfd)
    assert message.endswith(f"but storing its record failed: {db}: not a usable results database "
                            f"(database disk image is malformed)"), message
    assert len(list(results.glob("*/null/Offline/runs/*/run.json"))) == 1


# ---- 3. run records of the wrong shape are refused at import ----------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("performance", "fast", 'performance: expected a mapping (a JSON object), got "fast"'),
    ("performance", [1, 2], "performance: expected a mapping (a JSON object), got [1, 2]"),
    ("settings", "batch 8", 'settings: expected a mapping (a JSON object), got "batch 8"'),
    ("scenario", 5, "scenario: expected a string, got 5"),
    ("settings.harness", [8], "settings.harness: expected a mapping (a JSON object), got [8]"),
])
def test_a_record_of_the_wrong_shape_is_refused_at_import(null_run: dict, tmp_path: Path, field: str, value: object,
                                                          expected: str, capfd: pytest.CaptureFixture[str]) -> None:
    record = json.loads(null_run["run_json"].read_text())
    outer, _, inner = field.partition(".")
    if inner:
        record[outer][inner] = value
    else:
        record[outer] = value
    record["run_id"] = "damaged-record"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    db = tmp_path / "import.sqlite"
    shutil.copyfile(null_run["db"], db)
    before = sha256(db)
    assert run_cli("results", "import", path, "--db", db) == 1
    assert one_error(capfd) == f"{path}: {expected}"
    assert sha256(db) == before
    # A gate that reads the file itself refuses it the same way.
    assert run_cli("gate", "--baseline", path, "--candidate", null_run["run_id"], "--rule",
                   "offline.samples_per_second:-5%", "--db", db) == 1
    assert one_error(capfd) == f"{path}: {expected}"


# ---- 4. output paths: a folder where a file goes, a file where a folder goes ------------------------

def _gate(null_run: dict, *extra: str | Path) -> int:
    return run_cli("gate", "--baseline", null_run["run_id"], "--candidate", null_run["run_id"], "--rule",
                   "offline.samples_per_second:-5%", "--db", null_run["db"], *extra)


@pytest.mark.parametrize("flag", ["--junit", "--markdown"])
def test_a_gate_output_that_is_a_folder_is_named(null_run: dict, tmp_path: Path, flag: str,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    assert _gate(null_run, flag, folder) == 1
    assert one_error(capfd) == f"{flag} {folder}: a folder; name the file to write"
    assert list(folder.iterdir()) == []


def test_a_gate_output_below_a_file_is_named(null_run: dict, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("kept\n")
    assert _gate(null_run, "--junit", blocker / "gate.xml") == 1
    assert one_error(capfd) == f"--junit {blocker / 'gate.xml'}: {blocker} is a file, not a folder"
    assert blocker.read_text() == "kept\n"


def test_a_gate_output_in_a_missing_folder_creates_the_folder(null_run: dict, tmp_path: Path) -> None:
    """The choice: a missing parent folder is created, as `mkdir -p` would."""
    target = tmp_path / "ci" / "reports" / "gate.xml"
    assert _gate(null_run, "--junit", target) == 0
    assert target.read_text().startswith("<?xml")


def test_a_report_out_that_is_a_file_is_named(null_run: dict, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "report.html"
    existing.write_text("kept\n")
    assert run_cli("report", "--run", null_run["run_id"], "--out", existing, "--db", null_run["db"]) == 1
    assert one_error(capfd) == f"--out {existing}: a file; name a folder to write into"
    assert existing.read_text() == "kept\n"


# ---- 5. tune --trial-seconds ----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "0.0001", "1e+300"])
def test_tune_trial_seconds_is_checked_before_any_trial(tmp_path: Path, value: str,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli("tune", "null", "--scenario", "Offline", "--trial-seconds", value, "--results-dir", results) == 1
    assert one_error(capfd) == f"--trial-seconds: expected a number of seconds from 0.001 to 86400, got {value}"
    assert not results.exists()


# ---- 6. a profile summary without its sections ----------------------------------------------------

@pytest.mark.parametrize("summary, field", [
    ({"schema_version": 1}, "window"),
    ({"schema_version": 1, "window": {"seconds": 1.0}, "clock": {"name": "monotonic"}}, "levels"),
    ({"schema_version": 1, "window": {}, "clock": {"name": "monotonic"}, "levels": {}}, "window.seconds"),
    ({"schema_version": 1, "window": {"seconds": 1.0}, "clock": "monotonic", "levels": {}}, "clock"),
    ({"schema_version": 1, "window": {"seconds": 1.0}, "clock": {"name": "monotonic"}, "levels": {"harness": 3}},
     "levels.harness"),
    ({"schema_version": 1, "window": {"seconds": 1.0}, "clock": {"name": "monotonic"}, "levels": {},
      "operators": {"framework": "onnxruntime"}}, "operators"),
])
def test_a_profile_summary_without_its_sections_is_named(tmp_path: Path, summary: object, field: str,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Offline" / "profile" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    assert run_cli("profile", "show", tmp_path / "Offline") == 1
    message = one_error(capfd)
    assert message.startswith(f"{path}: {field}: "), message


def test_a_profile_summary_that_is_not_an_object_is_named(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "summary.json"
    path.write_text("[1, 2]")
    assert run_cli("profile", "show", path) == 1
    assert one_error(capfd) == f"{path}: expected a profile summary (a JSON object), got list"


# ---- 7. flags out of their range ------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (("gate", "--baseline", "a", "--candidate", "b", "--rule", "offline.samples_per_second:-5%", "--alpha", "7"),
     "--alpha: expected a significance level between 0 and 1 (exclusive), got 7.0"),
    (("gate", "--baseline", "a", "--candidate", "b", "--rule", "offline.samples_per_second:-5%", "--alpha", "nan"),
     "--alpha: expected a significance level between 0 and 1 (exclusive), got nan"),
    (("results", "list", "--limit", "-3"), "--limit: expected a number of rows >= 0 (0 = all), got -3"),
    (("sweep", REPO / "scenarios" / "sweep-example.yaml", "--repeat", "-1"),
     "--repeat: expected a number of runs per cell >= 1, got -1"),
    (("sweep", REPO / "scenarios" / "sweep-example.yaml", "--repeat", "0"),
     "--repeat: expected a number of runs per cell >= 1, got 0"),
    (("sweep", REPO / "scenarios" / "sweep-example.yaml", "--timeout", "0"),
     "--timeout: expected a number of seconds > 0, got 0.0"),
    (("sweep", REPO / "scenarios" / "sweep-example.yaml", "--timeout", "inf"),
     "--timeout: expected a number of seconds > 0, got inf"),
])
def test_flags_out_of_range_are_refused(tmp_path: Path, args: tuple, expected: str,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli(*args, "--results-dir", results) == 1
    assert one_error(capfd) == expected
    assert not results.exists()


# ---- 8. duplicate keys in YAML --------------------------------------------------------------------

NULL_MANIFEST = (REPO / "specs" / "models" / "null.yaml").read_text()


def test_a_manifest_with_a_duplicate_key_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    text = NULL_MANIFEST.replace("  max_batch_size: 1024\n", "  max_batch_size: 1024\n  max_batch_size: 1\n")
    path = write_manifest(tmp_path, "null-twice.yaml", text)
    line = text.splitlines().index("  max_batch_size: 1") + 1
    assert run_cli("specs", "validate", path) == 1
    assert capfd.readouterr().err == (f"{path}: line {line}: key 'max_batch_size' given twice (first on line "
                                      f"{line - 1}); YAML would keep only the last\n")
    results = tmp_path / "results"
    assert run_cli("run", path, "--scenario", "Offline", "--quick", "--results-dir", results) == 1
    assert one_error(capfd).startswith(f"{path}: line {line}: key 'max_batch_size' given twice")
    assert run_ids(results) == set()


def test_a_sweep_grid_with_a_duplicate_key_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("schema_version: 1\nname: twice\nmodels: ['null']\nscenarios: [Offline]\n"
                    "scenarios: [Server]\nquick: true\n")
    assert run_cli("sweep", grid, "--dry-run", "--results-dir", tmp_path / "results") == 1
    assert one_error(capfd) == (f"{grid}: line 5: key 'scenarios' given twice (first on line 4); "
                                f"YAML would keep only the last")


def test_a_preset_with_a_duplicate_key_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("settings:\n  Offline:\n    min_duration: 100\n    min_duration: 200\n")
    results = tmp_path / "results"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--preset", preset, "--results-dir", results) == 1
    assert one_error(capfd) == (f"{preset}: line 4: key 'min_duration' given twice (first on line 3); "
                                f"YAML would keep only the last")
    assert run_ids(results) == set()


def test_a_duplicate_key_on_one_line_is_refused() -> None:
    """A flow mapping names both on the same line."""
    from mlharness.specs.validation import ManifestError, load_yaml

    path = Path("flow.yaml")
    path.write_text("settings:\n  Offline: {target_qps: 1, target_qps: 2}\n")
    with pytest.raises(ManifestError) as caught:
        load_yaml(path)
    assert caught.value.problems == [f"{path}: line 2: key 'target_qps' given twice (first on line 2); "
                                     f"YAML would keep only the last"]


def test_yaml_merge_keys_still_override() -> None:
    """`<<: *anchor` then an explicit key is YAML's way to override, not a duplicate."""
    from mlharness.specs.validation import load_yaml

    path = Path("merge.yaml")
    path.write_text("base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  b: 3\n")
    assert load_yaml(path) == {"base": {"a": 1, "b": 2}, "derived": {"a": 1, "b": 3}}


# ---- 9. a model manifest's attributes --------------------------------------------------------------

@pytest.mark.parametrize("old, new, expected", [
    ("  max_batch_size: 1024\n", "  max_batch_size: 0\n",
     "attributes.max_batch_size: expected a batch size >= 1, got 0"),
    ("  max_batch_size: 1024\n", "  max_batch_size: eight\n",
     "attributes.max_batch_size: expected a batch size >= 1, got 'eight'"),
    ("  max_batch_size: 1024\n", "  max_batch_size: true\n",
     "attributes.max_batch_size: expected a batch size >= 1, got True"),
    ("  performance_sample_count: 1024\n", "  performance_sample_count: -5\n",
     "attributes.performance_sample_count: expected a sample count >= 1, got -5"),
    ("    Offline: {target_qps: 1000000}\n", "    Offlne: {target_qps: 1000000}\n",
     "attributes.settings.Offlne: expected '*' or a scenario name (did you mean 'Offline'?), got 'Offlne'"),
    ("    Offline: {target_qps: 1000000}\n", "    Offline: {target_qpps: 1000000}\n",
     "attributes.settings.Offline.target_qpps: expected a setting name (did you mean 'target_qps'?), "
     "got 'target_qpps'"),
    ("    Offline: {target_qps: 1000000}\n", "    Offline: 5\n",
     "attributes.settings.Offline: expected a mapping of settings, got 5"),
    ("  settings:\n", "  settings: 5\n  unused:\n", "attributes.settings: expected a mapping '*'|Scenario -> "
     "{setting: value}, got 5"),
])
def test_model_attributes_are_validated(tmp_path: Path, old: str, new: str, expected: str,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    assert old in NULL_MANIFEST
    path = write_manifest(tmp_path, "null-bad.yaml", NULL_MANIFEST.replace(old, new, 1))
    assert run_cli("specs", "validate", path) == 1
    err = capfd.readouterr().err
    assert err == f"{path}: {expected}\n"
    results = tmp_path / "results"
    assert run_cli("run", path, "--scenario", "Offline", "--quick", "--results-dir", results) == 1
    assert one_error(capfd) == f"{path}: {expected}"
    assert run_ids(results) == set()


def test_model_attributes_stay_open_for_other_keys(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    text = NULL_MANIFEST.replace("  max_batch_size: 1024\n", "  max_batch_size: 1024\n  my_hint: {any: [thing]}\n")
    path = write_manifest(tmp_path, "null-open.yaml", text)
    assert run_cli("specs", "validate", path) == 0


# ---- 10. an unknown setting: the closest match, not every key --------------------------------------

def test_an_unknown_set_key_names_the_closest_match(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "target_qpss=5",
                   "--results-dir", tmp_path / "results") == 1
    assert one_error(capfd) == "--set target_qpss=5: unknown setting 'target_qpss' (did you mean 'target_qps'?)"


def test_an_unknown_key_without_a_close_match_stays_short(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "zzzz=5",
                   "--results-dir", tmp_path / "results") == 1
    message = one_error(capfd)
    assert message.startswith("--set zzzz=5: unknown setting 'zzzz'"), message
    assert len(message) < 200, message


def test_an_unknown_user_conf_key_names_the_closest_match(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.min_durration = 100\n")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--user-conf", conf,
                   "--results-dir", tmp_path / "results") == 1
    assert one_error(capfd) == f"{conf}: line 1: unknown setting 'min_durration' (did you mean 'min_duration'?)"


def test_an_unknown_grid_setting_names_the_closest_match(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("schema_version: 1\nname: typo\nmodels: ['null']\nscenarios: [Offline]\n"
                    "settings:\n  wokers: [1, 2]\n")
    assert run_cli("sweep", grid, "--dry-run", "--results-dir", tmp_path / "results") == 1
    message = one_error(capfd)
    assert message == f"{grid}: settings.wokers: expected a setting name (did you mean 'workers'?), got 'wokers'"


def test_an_unknown_preset_setting_names_the_closest_match(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("settings:\n  Offline:\n    min_quer_count: 100\n")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--preset", preset,
                   "--results-dir", tmp_path / "results") == 1
    message = one_error(capfd)
    assert message == (f"{preset}: settings.Offline.min_quer_count: expected a setting name (did you mean "
                       f"'min_query_count'?), got 'min_quer_count'")
