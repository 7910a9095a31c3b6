"""RunRecord is the type readers use: its `kind` (schema version 2) and `bricks` (version 3), migrated from older files
and database rows), newer records refused in one line, the typed accessors on real runs, and a
record of another kind stored and listed but left out, with a reason, by the submission packager."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.records import record_metrics
from mlharness.records.run_record import (
    LOADGEN,
    RUN_SCHEMA_VERSION,
    RunRecord,
    read_record_file,
    read_saved_record,
)
from mlharness.store.result_store import ResultStore
from mlharness.submission.runs import collect
from tests.support import newest_run, run_cli, scenario_root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """A real null Offline performance run (max_batch_size 8, target_qps from --set) and a real
    accuracy run, as their run.json dicts."""
    results = tmp_path_factory.mktemp("records")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "max_batch_size=8",
                   "--set", "target_qps=20000", "--results-dir", results) == 0
    perf = newest_run(results, "null", "Offline")
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", results) == 0
    acc = newest_run(results, "null", "Offline")
    return results, perf, acc


def _as_version_1(record: dict) -> dict:
    """The record as mlharness wrote it before `kind` (and `bricks`) existed."""
    old = {k: v for k, v in record.items() if k not in ("kind", "bricks")}
    old["schema_version"] = 1
    return old


def _as_version_2(record: dict) -> dict:
    """The record as mlharness wrote it before `bricks` existed."""
    old = {k: v for k, v in record.items() if k != "bricks"}
    old["schema_version"] = 2
    return old


# ---- migration 1 -> 2 -------------------------------------------------------------------------

def test_a_new_run_is_a_version_3_loadgen_record(runs: tuple[Path, dict, dict]) -> None:
    _, perf, _ = runs
    assert RUN_SCHEMA_VERSION == 3
    assert (perf["schema_version"], perf["kind"], perf["bricks"]) == (3, LOADGEN, None)


def test_a_version_2_run_json_loads_with_no_bricks(runs: tuple[Path, dict, dict], tmp_path: Path) -> None:
    _, perf, _ = runs
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_as_version_2(perf)))
    assert "bricks" not in json.loads(path.read_text())
    record = RunRecord.load(path)
    assert (record.schema_version, record.kind, record.bricks) == (3, LOADGEN, None)
    assert read_record_file(path) == perf


def test_a_version_1_run_json_loads_as_a_loadgen_record(runs: tuple[Path, dict, dict], tmp_path: Path) -> None:
    _, perf, _ = runs
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_as_version_1(perf)))
    record = RunRecord.load(path)
    assert (record.schema_version, record.kind, record.run_id) == (3, LOADGEN, perf["run_id"])
    assert read_record_file(path) == perf  # nothing else changed


def test_a_stored_version_1_row_reads_back_migrated(runs: tuple[Path, dict, dict], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, perf, _ = runs
    db = tmp_path / "db.sqlite"
    with ResultStore(db) as store:
        store.add_run(RunRecord.from_dict(_as_version_1(perf)))  # an old record given to the store is migrated first
        assert store.list_runs()[0]["record_schema_version"] == 3
        # A row an older mlharness wrote: version-1 JSON in record_json.
        store.conn.execute("UPDATE runs SET record_json = ?, record_schema_version = 1 WHERE run_id = ?",
                           (json.dumps(_as_version_1(perf)), perf["run_id"]))
        assert store.get_record(perf["run_id"]).to_dict() == perf
        assert [r.to_dict() for r in store.run_records()] == [perf]
        (record,) = store.run_records()
        assert (record.schema_version, record.kind) == (3, LOADGEN)
        assert store.get_record(perf["run_id"][:-1]).kind == LOADGEN
    capsys.readouterr()
    assert run_cli("results", "show", perf["run_id"], "--json", "--db", db) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == LOADGEN


def test_a_newer_record_is_refused_in_one_line(runs: tuple[Path, dict, dict], tmp_path: Path) -> None:
    _, perf, _ = runs
    path = tmp_path / "run.json"
    path.write_text(json.dumps(perf | {"schema_version": RUN_SCHEMA_VERSION + 1}))
    with pytest.raises(UserError) as caught:
        RunRecord.load(path)
    assert str(caught.value) == (f"{path}: schema_version {RUN_SCHEMA_VERSION + 1} is newer than this mlharness "
                                 f"reads ({RUN_SCHEMA_VERSION}); upgrade mlharness")
    db = tmp_path / "db.sqlite"
    with ResultStore(db) as store:
        store.add_run(RunRecord.from_dict(perf))
        store.conn.execute("UPDATE runs SET record_json = ? WHERE run_id = ?",
                           (path.read_text(), perf["run_id"]))
        with pytest.raises(UserError, match=r"is newer than this mlharness reads") as caught:
            store.get_record(perf["run_id"])
        assert "\n" not in str(caught.value)


def test_a_record_without_a_kind_string_is_refused(runs: tuple[Path, dict, dict]) -> None:
    _, perf, _ = runs
    with pytest.raises(UserError, match=r"^here: kind: expected what the record measured"):
        RunRecord.from_json_dict(perf | {"kind": 3}, "here")


def test_the_store_keeps_fields_this_version_does_not_know(runs: tuple[Path, dict, dict], tmp_path: Path) -> None:
    """A record keeps them in `extra`, and so does the store: a reader that writes the record back loses nothing."""
    _, perf, _ = runs
    with ResultStore(tmp_path / "db.sqlite") as store:
        store.add_run(RunRecord.from_dict(perf | {"added_later": {"kept": True}}))
        record = store.get_record(perf["run_id"])
        assert record.extra == {"added_later": {"kept": True}} and not hasattr(record, "added_later")
        assert record.to_dict() == perf | {"added_later": {"kept": True}}


def test_results_show_json_prints_every_field_known_or_not(runs: tuple[Path, dict, dict], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`results show --json` prints the record's to_dict: the unknown keys it was stored with are there too."""
    _, perf, _ = runs
    db = tmp_path / "db.sqlite"
    with ResultStore(db) as store:
        store.add_run(RunRecord.from_dict(perf | {"added_later": {"kept": True}}))
    capsys.readouterr()
    assert run_cli("results", "show", perf["run_id"], "--json", "--db", db) == 0
    assert json.loads(capsys.readouterr().out) == perf | {"added_later": {"kept": True}}


def test_a_saved_record_is_read_and_other_json_left_alone(runs: tuple[Path, dict, dict], tmp_path: Path) -> None:
    """What a gate's folder REF reads beside run.json: a saved record (checked and migrated), or None for a
    file that is not JSON or holds something else; a saved record of a newer schema is refused, not skipped."""
    _, perf, _ = runs
    files = {"record.json": json.dumps(_as_version_1(perf)), "broken.json": "{", "list.json": "[1]",
             "other.json": json.dumps({"run_id": 3, "scenario": "Offline"}), "newer.json": json.dumps(perf | {"schema_version": 99})}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_saved_record(tmp_path / "record.json") == RunRecord.from_dict(perf)
    assert [read_saved_record(tmp_path / n) for n in ("broken.json", "list.json", "other.json", "gone.json")] == [None] * 4
    with pytest.raises(UserError, match=r"newer.json: schema_version 99 is newer"):
        read_saved_record(tmp_path / "newer.json")


def test_unknown_keys_round_trip_through_extra(runs: tuple[Path, dict, dict], tmp_path: Path) -> None:
    """from_dict puts every key it does not know in `extra` (a key named "extra" too), to_dict puts them back
    after the known fields; a known field wins over an unknown key of its name; shapes are checked only for
    known fields."""
    _, perf, _ = runs
    data = perf | {"added_later": [1, 2], "extra": "a key of that name"}
    record = RunRecord.from_dict(data)
    assert record.extra == {"added_later": [1, 2], "extra": "a key of that name"}
    assert record.to_dict() == data and list(record.to_dict())[-2:] == ["added_later", "extra"]
    assert RunRecord.from_dict(record.to_dict()) == record
    assert RunRecord.from_dict(perf).extra == {} and RunRecord.from_dict(perf).to_dict() == perf
    record.extra["scenario"] = "not this"
    assert record.to_dict()["scenario"] == perf["scenario"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    assert RunRecord.load(path) == RunRecord.from_dict(data)


# ---- accessors ------------------------------------------------------------------------------------

def test_accessors_on_real_records(runs: tuple[Path, dict, dict]) -> None:
    results, perf_dict, acc_dict = runs
    perf = RunRecord.load(Path(perf_dict["results_path"]) / "run.json")
    acc = RunRecord.from_dict(acc_dict)
    assert perf.is_ok and perf.is_loadgen and perf.model_name == "null"
    assert perf.harness_setting("max_batch_size") == 8 and perf.harness_setting("workers", 1) == 1
    assert perf.harness_settings == perf_dict["settings"]["harness"]
    assert perf.loadgen_setting("target_qps") == perf_dict["settings"]["loadgen"]["target_qps"]
    assert perf.loadgen_setting("no_such_key") is None
    assert perf.setting_origin("target_qps") == "cli" and perf.setting_origin("min_duration") == "preset:quick"
    assert perf.setting_origin("no_such_key") is None
    assert perf.batch_size == 8 and acc.batch_size is None
    assert perf.threads == 0  # not set: the null backend's reported intra_op_threads
    assert perf.loadgen_result in ("VALID", "INVALID") and perf.valid is (perf.loadgen_result == "VALID")
    assert acc.valid is None and acc.loadgen_result is None  # an accuracy run has no performance summary
    assert perf.accuracy_values == {} and acc.accuracy_values == {"top1": 0.5, "top5": 1.0}
    assert acc.accuracy_verdict == (acc_dict["accuracy"] or {}).get("verdict")
    assert perf.software_versions["mlcommons-loadgen"] == perf_dict["software"]["versions"]["mlcommons-loadgen"]
    assert perf.system_description == perf_dict["system"] and perf.system_description["logical_cpus"] >= 1
    assert [kind for kind, _ in perf.manifest_refs()] == ["models", "datasets", "hardware", "software"]
    assert perf.figures() == record_metrics.flatten(perf_dict) and perf.figures()["offline.samples_per_second"] > 0
    assert perf.headline() == ("offline.samples_per_second", perf.figures()["offline.samples_per_second"])
    assert acc.figures()["accuracy.top1"] == 0.5 and acc.headline() == ("offline.samples_per_second", None)
    failed = RunRecord.from_dict(perf_dict | {"status": "failed"})
    assert not failed.is_ok


def test_a_real_run_json_reads_through_the_views_and_writes_back_byte_for_byte(runs: tuple[Path, dict, dict],
                                                                              tmp_path: Path) -> None:
    """The typed views (mlharness.records.payloads) are read from the dicts run.json holds and change
    nothing in it: a real run's file, read, read through every view and written back, is the same bytes."""
    from mlharness.atomic_io import write_json

    _, perf_dict, acc_dict = runs
    for data in (perf_dict, acc_dict):
        path = Path(data["results_path"]) / "run.json"
        record = RunRecord.load(path)
        views = (record.perf, record.accuracy_result, record.cold, record.bricks_result, record.loadgen_logs,
                 record.manifest_refs(), record.figures())
        assert write_json(tmp_path / "run.json", record.to_dict()).read_bytes() == path.read_bytes()
        assert views[2] is not None and views[2].load_seconds is not None and views[2].warmup is not None
    perf, acc = RunRecord.from_dict(perf_dict), RunRecord.from_dict(acc_dict)
    assert perf.perf.result == perf_dict["performance"]["result"] and perf.perf.samples_per_second > 0
    assert perf.perf.metric.name == "samples_per_second" and perf.perf.extra == {}  # every key typed or a token's
    assert perf.accuracy_result is None and acc.perf is None
    assert dict(acc.accuracy_result.values) == {"top1": 0.5, "top5": 1.0} and acc.accuracy_result.metric
    assert list(perf.loadgen_logs) == ["performance"] and list(acc.loadgen_logs) == ["accuracy"]


# ---- a record of another kind -----------------------------------------------------------------------

def test_another_kind_is_stored_and_listed_but_left_out_of_a_submission(
        runs: tuple[Path, dict, dict], capsys: pytest.CaptureFixture[str]) -> None:
    results, perf, _ = runs
    brick_id = perf["run_id"][:-6] + "b1c4b1"
    # Newer than every real run, same model, scenario, system and mode: a LoadGen-blind collection
    # would choose it as the scenario's performance run.
    brick = perf | {"run_id": brick_id, "kind": "brick", "started_at": "2999-01-01T00:00:00+00:00",
                    "performance": None, "settings": {}}
    with ResultStore(results / "mlharness.sqlite") as store:
        store.add_run(RunRecord.from_dict(brick))
        assert brick_id in [row["run_id"] for row in store.list_runs()]
        assert store.get_record(brick_id).kind == "brick"
    capsys.readouterr()
    assert run_cli("results", "list", "--results-dir", results) == 0
    assert brick_id in capsys.readouterr().out
    assert run_cli("results", "show", brick_id, "--results-dir", results) == 0
    assert "kind             : brick" in capsys.readouterr().out

    (chosen,) = collect(results)
    assert chosen.path == scenario_root(results, "null", "Offline")
    assert chosen.performance is not None and chosen.performance.kind == LOADGEN
    assert chosen.performance.run_id != brick_id
    (reason,) = chosen.skipped
    assert brick_id in reason and "'brick' record, not a loadgen test" in reason
    with pytest.raises(UserError, match=f"--run {brick_id}: .*run {brick_id} left out: a 'brick' record"):
        collect(results, pinned=[brick_id])


# ---- a record is not changed once made: each step of a run makes the next one ------------------------

class _Guard:
    """What the lifecycle tells the guard (mlharness.running.run_child.RunGuard): here, only the start."""
    aborted = None

    def started(self, record: RunRecord, where: object) -> None:
        self.first = record
        where.stage()

    def finalizing(self) -> bool:
        return True


def test_the_lifecycle_makes_a_new_record_at_each_step_and_leaves_the_old_ones(tmp_path: Path) -> None:
    """run_staged publishes the last record its body made (StagedRun.update); the record it started with,
    the preliminary run.json's, is never changed, nor is any record a step replaced: a reader holding one
    (the guard, a caller) sees it as it was. A failed run's RunFailed carries the failed record."""
    from types import SimpleNamespace

    from mlharness.errors import RunFailed
    from mlharness.records.results import ScenarioDir
    from mlharness.running import lifecycle

    def started(run_id: str) -> RunRecord:
        return RunRecord(run_id=run_id, command="mlharness run null", model={"name": "null"}, dataset={},
                         backend="null", scenario="Offline", mode="performance", cold_start={"load_seconds": 1.0})

    seen: list[RunRecord] = []

    def body(run: lifecycle.StagedRun) -> None:
        seen.append(run.record)
        run.update(performance={"result": "VALID", "valid": True})
        seen.append(run.record)

    cpu = SimpleNamespace(device="cpu")
    first = started("r-ok")
    snapshot = first.to_dict()
    where = ScenarioDir(tmp_path / "sys" / "null" / "Offline", "r-ok")
    published = lifecycle.run_staged(first, where, _Guard(), cpu, body)
    assert first.to_dict() == snapshot and seen[0] is first and seen[0].performance is None
    assert (published.status, published.perf.result, published.results_path) == ("ok", "VALID", str(where.run_dir))
    assert published.cold.load_seconds == 1.0 and published.cold.peak_rss_bytes > 0 and first.cold.peak_rss_bytes is None
    assert RunRecord.load(where.run_dir / "run.json") == published

    def failing(run: lifecycle.StagedRun) -> None:
        run.update(performance={"result": "INVALID"})
        raise RuntimeError("the backend broke")

    first = started("r-failed")
    snapshot = first.to_dict()
    where = ScenarioDir(tmp_path / "sys" / "null" / "Offline", "r-failed")
    with pytest.raises(RunFailed) as caught:
        lifecycle.run_staged(first, where, _Guard(), cpu, failing)
    failed = caught.value.record
    assert first.to_dict() == snapshot
    assert (failed.status, failed.error, failed.perf.result) == ("failed", "RuntimeError: the backend broke", "INVALID")
    assert failed.error_traceback and RunRecord.load(Path(failed.results_path) / "run.json") == failed


def test_a_record_is_frozen_and_a_change_makes_a_new_one(runs: tuple[Path, dict, dict]) -> None:
    """Once made, a record is not changed in place (issue 34): a writer makes a new one with replace."""
    import dataclasses

    record = RunRecord.from_dict(runs[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status = "failed"  # type: ignore[misc]
    changed = dataclasses.replace(record, status="failed")
    assert (record.status, changed.status) == ("ok", "failed")
