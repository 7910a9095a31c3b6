"""Sweeps: every cell in its own worker process, failures recorded and passed over, timeouts,
resume, and the best-configuration table. Real runs of the null model keep this short."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from mlharness.errors import UserError
from mlharness.records.loadgen_logs import parse_summary
from mlharness.store.result_store import ResultStore
from mlharness.sweeps.grid_schema import SETTING_KEYS
from mlharness.sweeps.sweep_grid import Cell, load_grid
from tests.support import REPO, failing_null_model, run_cli, write_manifest





def write_grid(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


GRID = """\
    name: t
    quick: true
    timeout: 120
    models:
      - name: "null"
        set: {Offline: {target_qps: 20000}}
      - no-such-model
      - flaky
    scenarios: [Offline]
    batch_sizes: %s
    """


def cells_by_model(store: ResultStore, sweep_id: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for row in store.sweep_cells(sweep_id):
        found.setdefault(json.loads(row["params_json"])["model"], []).append(row)
    return found


def test_failing_cells_are_recorded_and_the_sweep_resumes(tmp_path: Path, specs_copy: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "flaky.yaml", failing_null_model(postprocess_calls=0))
    grid = write_grid(tmp_path / "grid.yaml", GRID % "[8]")
    results = tmp_path / "results"
    assert run_cli("sweep", grid, "--results-dir", results) == 0  # failures are data, not an exit code
    captured = capsys.readouterr()
    assert "3/3" in captured.err and "ETA" in captured.err
    best = [line.split() for line in captured.out.splitlines() if line.startswith("Offline")]
    assert [row[:4] for row in best] == [["Offline", "null", "null", "8"]]  # the best table: only null ran
    with ResultStore(results / "mlharness.sqlite") as store:
        cells = cells_by_model(store, "t")
        assert [c["status"] for c in cells["null"]] == ["ok"]
        # no manifest: the worker failed before a run existed; the cell keeps the error and stderr
        (missing,) = cells["no-such-model"]
        assert missing["status"] == "failed" and missing["run_id"] is None
        assert "no-such-model" in missing["error"] and "no-such-model" in missing["stderr"]
        # the run started and failed: its run record is in the database, tagged with the sweep
        (flaky,) = cells["flaky"]
        assert flaky["status"] == "failed" and "postprocess blew up" in flaky["error"]
        run = store.list_runs()
        assert {r["run_id"]: (r["status"], r["sweep_id"]) for r in run} == {
            cells["null"][0]["run_id"]: ("ok", "t"), flaky["run_id"]: ("failed", "t")}

    # Resume: finished cells (ok or failed) are skipped.
    assert run_cli("sweep", grid, "--results-dir", results) == 0
    assert "0 ran now, 3 skipped" in capsys.readouterr().out
    # Failed cells only; then a grid grown by a batch size runs only the new cell.
    assert run_cli("sweep", grid, "--results-dir", results, "--retry-failed") == 0
    assert "2 ran now, 1 skipped" in capsys.readouterr().out
    write_grid(grid, GRID % "[8, 16]")
    assert run_cli("sweep", grid, "--results-dir", results, "--strict") == 1  # --strict: failures exit 1
    out = capsys.readouterr().out
    assert "3 ran now, 3 skipped" in out  # the three bs=16 cells are new
    with ResultStore(results / "mlharness.sqlite") as store:
        cells = cells_by_model(store, "t")
        assert sorted(json.loads(c["params_json"])["overrides"][0] for c in cells["null"]) == [
            "max_batch_size=16", "max_batch_size=8"]
    assert run_cli("results", "sweep", "t", "--results-dir", results) == 0
    out = capsys.readouterr().out
    assert "best configuration per scenario and model" in out and "no-such-model" in out


def test_a_cell_that_overruns_is_stopped_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_grid(tmp_path / "slow.yaml", """\
        name: slow
        quick: true
        timeout: 3
        models: ["null"]
        scenarios: [SingleStream]
        set: {target_latency: 0.01, min_duration: 60000}
        """)
    assert run_cli("sweep", grid, "--results-dir", tmp_path / "r") == 0
    assert "timed out after 3 s" in capsys.readouterr().err
    with ResultStore(tmp_path / "r" / "mlharness.sqlite") as store:
        (cell,) = store.sweep_cells("slow")
        assert cell["status"] == "failed" and "timed out after 3 s" in cell["error"] and cell["seconds"] < 30
        # The stopped run keeps its logs as a failed run, recorded in the sweep's database.
        (run,) = store.list_runs()
        assert run["run_id"] == cell["run_id"] and run["status"] == "failed" and "failed-" in run["results_path"]


def test_repeat_runs_each_cell_n_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_grid(tmp_path / "rep.yaml", """\
        models: ["null"]
        scenarios: [Offline]
        set: {target_qps: 20000}
        """)
    assert run_cli("sweep", grid, "--results-dir", tmp_path / "r", "--quick", "--repeat", "2",
                   "--sweep-id", "twice") == 0
    out = capsys.readouterr().out
    assert "median" in out and "  2\n" in out + "\n"  # the best row reports 2 runs
    with ResultStore(tmp_path / "r" / "mlharness.sqlite") as store:
        assert [c["repeat_index"] for c in store.sweep_cells("twice")] == [0, 1]


def test_example_grid_expands_to_its_eight_cells() -> None:
    grid = load_grid(REPO / "scenarios" / "sweep-example.yaml")
    assert len(grid.cells) == 8 and grid.name == "sweep-example"
    assert {(c.model, c.scenario, c.setting("max_batch_size")) for c in grid.cells} == {
        (m, s, b) for m in ("resnet50-light", "null") for s in ("Offline", "SingleStream") for b in ("1", "8")}
    assert all(c.quick for c in grid.cells)


@pytest.mark.parametrize("text, message", [
    ("models: [m]\nscenarios: [Offline]\nbatchsize: [1]\n", "batchsize: expected no such field (allowed: backends, batch_sizes, cluster,"),
    ("models: [null]\nscenarios: [Offline]\n", "models[0]: expected a model name or {name, backends, datasets, set, endpoint} (quote \"null\""),
    ("models: [m]\nscenarios: [Offlin]\n", "scenarios[0]: expected one of SingleStream, MultiStream, Server, Offline, got 'Offlin'"),
    ("models: [m]\nscenarios: [Offline]\nsettings: {max_batch: [1]}\n", "settings.max_batch: expected a setting name (did you mean 'max_batch_size'?), got 'max_batch'"),
    ("models: [m]\nscenarios: [Offline]\nrepeat: 0\n", "repeat: expected an integer >= 1, got 0"),
    ("models: [m]\nscenarios: [Offline]\nexclude: [{model: m}]\n", "no cells"),
    ("models: [m]\nscenarios: [Offline]\nhardware: [cpu, gpu9]\n", "hardware[1]: no hardware manifest named 'gpu9'"),
    ("models: [m]\nscenarios: [Offline]\ndatasets: [nope]\n", "datasets[0]: no dataset manifest named 'nope'"),
    ("models: [m]\nscenarios: [Offline]\nsoftware: [default, 3]\n", "software[1]: expected a manifest name or path, or 'default', got 3"),
    ("models: [{name: m, datasets: [nope]}]\nscenarios: [Offline]\n", "models[0]: datasets[0]: no dataset"),
    ("models: [m]\nscenarios: [Offline]\nuser_conf: no.conf\n", "user_conf: expected a user.conf file"),
    ("models: [{name: m, endpoint: 'openai+htp://h:1'}]\nscenarios: [Offline]\n",
     "models[0]: endpoint: unknown scheme 'openai+htp'"),
])
def test_bad_grids_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        load_grid(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_every_problem_of_a_grid_is_named_at_once_in_the_files_order(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models: [m, {name: n, sets: 1}]\nscenarios: Offline\ntimeout: -1\nset: {Server: {qps: 1}}\n"
                    "mode: fast\n")
    with pytest.raises(UserError) as caught:
        load_grid(path)
    assert str(caught.value).splitlines() == [
        f"{path}: models[1].sets: expected no such field (allowed: backends, datasets, endpoint, name, set)",
        f"{path}: timeout: expected a number of seconds > 0, got -1",
        f"{path}: set.Server.qps: expected a setting name (not a LoadGen user.conf key or a harness key; README "
        f"lists them), got 'qps'",
        f"{path}: mode: expected one of performance, accuracy, submission, find-peak, got 'fast'",
    ]


def test_grid_axes_and_exclude(tmp_path: Path) -> None:
    path = write_grid(tmp_path / "g.yaml", """\
        models:
          - resnet50-light
          - {name: "null", backends: ["null"], set: {SingleStream: {target_latency: 0.01}}}
        backends: [default, "null"]
        scenarios: [Offline, SingleStream]
        threads: [1, 2]
        settings: {workers: [1, 2]}
        exclude: [{model: resnet50-light, backend: "null", threads: 2}]
        """)
    cells = load_grid(path).cells
    # resnet50-light: 2 backends x 2 scenarios x 2 threads x 2 workers, minus 4 excluded; null: 1 x 2 x 2 x 2
    assert len(cells) == 16 - 4 + 8
    ss = [c for c in cells if c.model == "null" and c.scenario == "SingleStream"]
    assert all(c.setting("target_latency") == "0.01" for c in ss)
    assert all(c.setting("target_latency") is None for c in cells if c.scenario == "Offline")
    assert len({c.key for c in cells}) == len(cells)


def test_a_model_entry_runs_against_its_endpoint_and_keeps_the_other_cells_keys(tmp_path: Path) -> None:
    """`endpoint` on a model entry: its cells' requests go to that server (recorded in the cell's params);
    the cells of an entry without one keep the key they had before the field existed."""
    path = write_grid(tmp_path / "grid.yaml", "models:\n  - 'null'\n  - {name: smollm2-135m, endpoint: "
                                              "'openai+http://127.0.0.1:8080'}\nquick: true\nscenarios: [Offline]\n")
    served, here = sorted(load_grid(path).cells, key=lambda cell: cell.model == "null")
    assert served.request.endpoint == "openai+http://127.0.0.1:8080/v1"
    assert served.params()["endpoint"] == "openai+http://127.0.0.1:8080/v1"
    assert here.request.endpoint is None and "endpoint" not in here.params()
    assert here.key == Cell.of(model="null", backend=None, scenario="Offline", mode="performance", quick=True,
                               presets=(), overrides=(), profile=()).key


def test_legacy_cells_keep_their_keys(tmp_path: Path) -> None:
    """Cells that use none of the manifest axes hash as before they existed, so resumed sweeps match
    (the example grid as it was shipped then: the null model's SingleStream latency was 0.01 ms)."""
    then = (REPO / "scenarios" / "sweep-example.yaml").read_text().replace("target_latency: 0.002", "target_latency: 0.01")
    (tmp_path / "sweep-example.yaml").write_text(then)
    grid = load_grid(tmp_path / "sweep-example.yaml")
    keys = {c.label(): c.key for c in grid.cells}
    assert keys["resnet50-light/default/Offline max_batch_size=1"] == "fc51d80f4566aff4"
    assert keys["null/default/SingleStream max_batch_size=8 target_latency=0.01"] == "acf4acbec6da9bad"
    for cell in grid.cells:
        assert set(cell.params()) == {"model", "backend", "scenario", "mode", "quick", "presets", "overrides",
                                      "profile"}
        assert Cell.from_params(json.loads(json.dumps(cell.params()))) == cell


def test_manifest_axes_cross_with_the_others_and_can_be_excluded(tmp_path: Path) -> None:
    path = write_grid(tmp_path / "g.yaml", """\
        models:
          - resnet50-light
          - {name: mobilenet-v2, datasets: [default, synthetic-images]}
        backends: [default, "null"]
        hardware: [cpu, cuda0]
        software: [default]
        scenarios: [Offline]
        exclude: [{backend: "null", hardware: cuda0}, {dataset: synthetic-images, hardware: cuda0}]
        """)
    cells = load_grid(path).cells
    # resnet50-light: 2 backends x 2 hardware - 1; mobilenet-v2: 2 backends x 2 datasets x 2 hardware - 3
    assert len(cells) == 3 + 5 and len({c.key for c in cells}) == len(cells)
    assert {c.label() for c in cells if c.hardware == "cuda0"} == {
        "resnet50-light/default/Offline hardware=cuda0", "mobilenet-v2/default/Offline hardware=cuda0"}
    (cell,) = [c for c in cells if c.dataset and c.backend is None]
    assert cell.params()["dataset"] == "synthetic-images" and "hardware" not in cell.params()
    request = cell.request_for(tmp_path / "r", 60.0)
    assert (request.model, request.dataset, request.hardware, request.results_dir, request.timeout) == (
        "mobilenet-v2", "synthetic-images", "cpu", tmp_path / "r", 60.0)


def null_part_of_example_grid(tmp_path: Path) -> Path:
    """scenarios/sweep-example.yaml as shipped, less resnet50-light (its cells take a minute on 2 cores)."""
    doc = yaml.safe_load((REPO / "scenarios" / "sweep-example.yaml").read_text())
    doc["models"] = [m for m in doc["models"] if isinstance(m, dict) and m["name"] == "null"]
    path = tmp_path / "example-null.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_cell_leaves_its_own_folder_with_its_own_logs(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli("sweep", null_part_of_example_grid(tmp_path), "--results-dir", results, "--quick") == 0
    capsys.readouterr()
    with ResultStore(results / "mlharness.sqlite") as store:
        cells = store.sweep_cells("sweep-example")
        assert len(cells) == 4 and all(c["status"] == "ok" for c in cells)
        paths = set()
        for row in cells:
            cell = Cell.from_params(json.loads(row["params_json"]))
            (db_row,) = [r for r in store.list_runs() if r["run_id"] == row["run_id"]]
            record = store.get_record(row["run_id"]).to_dict()
            folder = Path(db_row["results_path"])
            paths.add(folder)
            # <Scenario>/runs/<run id>/, holding that run's record and LoadGen logs
            assert (folder.parent.name, folder.name, folder.parent.parent.name) == ("runs", row["run_id"],
                                                                                    cell.scenario)
            assert json.loads((folder / "run.json").read_text())["run_id"] == row["run_id"]
            summary = parse_summary(folder / "performance" / "run_1" / "mlperf_log_summary.txt")
            performance = {k: v for k, v in record["performance"].items() if k != "wall_seconds"}
            assert summary == performance and summary["scenario"] == cell.scenario
            assert str(record["settings"]["harness"]["max_batch_size"]) == cell.setting("max_batch_size")
        assert len(paths) == 4


HARDWARE_1T = """\
    kind: hardware
    name: cpu-1t
    version: 1.0.0
    description: The host CPU, one thread per operator.
    device: cpu
    intra_op_threads: 1
    inter_op_threads: 1
    """


def test_a_grid_varies_hardware_manifests(tmp_path: Path, specs_copy: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "hardware", "cpu-1t.yaml", HARDWARE_1T)
    grid = write_grid(tmp_path / "hw.yaml", """\
        name: hw
        quick: true
        models: ["null"]
        hardware: [cpu, cpu-1t]
        scenarios: [Offline]
        set: {target_qps: 20000}
        """)
    cells = load_grid(grid).cells
    assert [c.hardware for c in cells] == ["cpu", "cpu-1t"]
    # The cpu cell is the cell of the same grid without the axis: a resumed sweep still finds it.
    plain = load_grid(write_grid(tmp_path / "plain.yaml", "models: ['null']\nquick: true\nscenarios: [Offline]\n"
                                                          "set: {target_qps: 20000}\n")).cells
    assert cells[0].key == plain[0].key and cells[1].key != plain[0].key
    results = tmp_path / "results"
    assert run_cli("sweep", grid, "--results-dir", results) == 0
    assert "hardware=cpu-1t" in capsys.readouterr().err
    with ResultStore(results / "mlharness.sqlite") as store:
        rows = store.sweep_cells("hw")
        assert [r["status"] for r in rows] == ["ok", "ok"]
        by_hardware = {json.loads(r["params_json"]).get("hardware", "cpu"): store.get_record(r["run_id"]).to_dict() for r in rows}
    assert {name: record["hardware"]["name"] for name, record in by_hardware.items()} == {
        "cpu": "cpu", "cpu-1t": "cpu-1t"}
    assert Path(by_hardware["cpu-1t"]["hardware"]["path"]) == specs_copy / "hardware" / "cpu-1t.yaml"


def test_a_missing_hardware_manifest_stops_the_sweep_before_it_runs(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_grid(tmp_path / "hw.yaml", """\
        quick: true
        models: ["null"]
        hardware: [cpu, no-such-hardware]
        scenarios: [Offline]
        set: {target_qps: 20000}
        """)
    results = tmp_path / "results"
    assert run_cli("sweep", grid, "--results-dir", results) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlharness: error: ") and "\n" not in err
    assert f"{grid}: hardware[1]: no hardware manifest named 'no-such-hardware'" in err
    assert not results.exists()  # nothing ran, nothing was recorded


def test_a_grids_cluster_section_gives_its_cells_per_node_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("models: [\"null\"]\nscenarios: [Offline]\n")
    assert load_grid(path).cells_per_node == 1  # a benchmark never shares its host unless the grid says so
    path.write_text("models: [\"null\"]\nscenarios: [Offline]\ncluster: {cells_per_node: 3}\n")
    assert load_grid(path).cells_per_node == 3
    path.write_text("models: [\"null\"]\nscenarios: [Offline]\ncluster: {cells_per_node: 0, nodes: 2}\n")
    with pytest.raises(UserError) as caught:
        load_grid(path)
    assert str(caught.value).splitlines() == [
        f"{path}: cluster.cells_per_node: expected an integer from 1 to 1000, got 0",
        f"{path}: cluster.nodes: expected no such field (allowed: cells_per_node)"]
