"""A sweep grid and the cluster's placement data, each function alone, as mutation testing of the sweeps
module needs them: the grid's schema (one value or a list, a model's name alone, the JSON Schema an editor
reads), its expansion into cells (the order of the axes, the settings' layers, the manifest axes, `exclude`,
the one-line refusals naming the file and the field), a cell's params, key and label, the Ray resources a
node advertises and a cell needs (mlharness.cluster.resources), and the --cluster address's form
(mlharness.cluster.address.parse_cluster_address; `probe` only where it needs no Ray: a local address, a
port where nothing listens). In process, with real grid files, the shipped specs and real RunRequests."""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import http.server
import json
import os
import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest
from pydantic import TypeAdapter, ValidationError

from mlharness.cluster.address import ClusterAddress, parse_cluster_address, probe
from mlharness.cluster.resources import (LABEL_AMOUNT, SLOT, _safe, cell_needs, describe_needs, node_name,
                                         node_resources, satisfies)
from mlharness.errors import UserError
from mlharness.running.request import RunRequest
from mlharness.specs.index import shipped_specs
from mlharness.sweeps import sweep_grid
from mlharness.sweeps.grid_schema import GridDoc, one_or_many
from mlharness.sweeps.sweep_grid import Cell, Grid, load_grid
from tests.support import unanswered_port, write_manifest

NULL_HINT = " (quote \"null\": YAML reads a bare null as nothing)"
FORMS = "--cluster: expected ray, ray://HOST:PORT or HOST:PORT; "


def grid_file(folder: Path, text: str, name: str = "grid.yaml") -> Path:
    return write_manifest(folder, name, text)


def labels(path: Path) -> list[str]:
    return [cell.label() for cell in load_grid(path).cells]


def refusal(path: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_grid(path)
    return str(caught.value)


def hardware_manifest(folder: Path, name: str, lines: str) -> Path:
    return write_manifest(folder / "hardware", f"{name}.yaml",
                          f"kind: hardware\nname: {name}\nversion: 1.0.0\n{lines}")


# ---- grid_schema: one value or a list, a model's name alone, the JSON Schema ------------------------------

def test_one_value_where_a_list_is_expected_is_a_list_of_one(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: m\nbackends: onnxruntime\nscenarios: Server\nbatch_sizes: 4\n"
                               "hardware: cpu\n")
    assert labels(path) == ["m/onnxruntime/Server max_batch_size=4"]
    doc = GridDoc.model_validate({"models": "m", "scenarios": "Offline", "threads": 2})
    assert (doc.scenarios, doc.threads, doc.backends) == (["Offline"], [2], ["default"])
    assert [entry.name for entry in doc.models] == ["m"]


def test_a_list_stays_the_list_it_is(tmp_path: Path) -> None:
    doc = GridDoc.model_validate({"models": ["a", {"name": "b", "backends": "x"}], "scenarios": ["Offline", "Server"],
                                  "batch_sizes": [1]})
    assert [(e.name, e.backends) for e in doc.models] == [("a", None), ("b", ["x"])]
    assert (doc.scenarios, doc.batch_sizes) == (["Offline", "Server"], [1])


@pytest.mark.parametrize("field, expected", [
    ("models", "model names or {name, backends, datasets, set, endpoint}"),
    ("scenarios", "scenarios: SingleStream, MultiStream, Server, Offline"),
    ("backends", "backend names, or 'default'"),
    ("batch_sizes", "batch sizes to sweep"),
    ("hardware", "hardware manifest names or paths, or 'default'"),
])
def test_an_empty_list_is_refused_naming_the_field_and_what_it_holds(tmp_path: Path, field: str,
                                                                     expected: str) -> None:
    doc = {"models": ["m"], "scenarios": ["Offline"], field: []}
    path = grid_file(tmp_path, json.dumps(doc))
    assert refusal(path) == f"{path}: {field}: expected {expected}, got []"


def test_a_backend_that_is_not_a_name_is_refused_with_the_null_hint(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline]\nbackends: [default, 3, null]\n")
    assert refusal(path).splitlines() == [
        f"{path}: backends[1]: expected a backend name or 'default'{NULL_HINT}, got 3",
        f"{path}: backends[2]: expected a backend name or 'default'{NULL_HINT}, got None"]
    path = grid_file(tmp_path, "models: [{name: m, backends: [true]}]\nscenarios: [Offline]\n")
    assert refusal(path) == f"{path}: models[0].backends[0]: expected a backend name or 'default'{NULL_HINT}, got True"


def test_a_model_entry_is_a_name_alone_or_a_mapping_never_nothing(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [m, {name: n, backends: [b]}]\nscenarios: [Offline]\n")
    assert labels(path) == ["m/default/Offline", "n/b/Offline"]
    path = grid_file(tmp_path, "models: [m, null]\nscenarios: [Offline]\n")
    assert refusal(path) == (f"{path}: models[1]: expected a model name or {{name, backends, datasets, set, endpoint}}"
                             f"{NULL_HINT}, got None")
    path = grid_file(tmp_path, "models: [{backends: [b]}]\nscenarios: [Offline]\n")
    assert refusal(path) == f"{path}: models[0].name: expected a model manifest name or path (required field is missing)"


def test_one_or_many_takes_one_value_or_a_non_empty_list_and_its_schema_says_which() -> None:
    ints = TypeAdapter(one_or_many(int, {"type": "integer"}, "some integers"))
    assert (ints.validate_python(3), ints.validate_python([5]), ints.validate_python([1, 2])) == ([3], [5], [1, 2])
    with pytest.raises(ValidationError) as caught:
        ints.validate_python([])
    assert [e["type"] for e in caught.value.errors()] == ["too_short"]
    assert ints.json_schema() == {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"},
                                                                  "minItems": 1}], "description": "some integers"}
    listed = TypeAdapter(one_or_many(int, None, "integers"))
    assert listed.validate_python(4) == [4]
    assert listed.json_schema() == {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                                    "description": "integers"}


def test_the_json_schema_says_a_model_entry_may_be_its_name_alone() -> None:
    schema = GridDoc.model_json_schema(by_alias=True)
    entry = schema["$defs"]["ModelEntry"]
    assert list(entry) == ["anyOf"]
    name_alone, mapping = entry["anyOf"]
    assert name_alone == {"type": "string"}
    assert (mapping["type"], mapping["title"], mapping["required"], mapping["additionalProperties"]) == (
        "object", "ModelEntry", ["name"], False)
    assert list(mapping["properties"]) == ["name", "backends", "datasets", "set", "endpoint"]


def test_the_json_schema_says_models_may_be_one_name() -> None:
    models = GridDoc.model_json_schema(by_alias=True)["properties"]["models"]
    described = "model names or {name, backends, datasets, set, endpoint}"
    assert models == {"anyOf": [{"type": "string"}, {
        "description": described, "items": {"$ref": "#/$defs/ModelEntry"}, "minItems": 1, "title": "Models",
        "type": "array"}], "description": described}


def test_the_json_schema_says_one_value_or_a_non_empty_list() -> None:
    properties = GridDoc.model_json_schema(by_alias=True)["properties"]
    names = ["SingleStream", "MultiStream", "Server", "Offline"]
    assert properties["scenarios"] == {
        "anyOf": [{"enum": names}, {"items": {"enum": names}, "minItems": 1, "type": "array"}],
        "description": "scenarios: SingleStream, MultiStream, Server, Offline", "title": "Scenarios"}
    assert properties["backends"] == {
        "anyOf": [{"type": "string"}, {"items": {"type": "string"}, "minItems": 1, "type": "array"}],
        "default": ["default"], "description": "backend names, or 'default'", "title": "Backends"}
    assert properties["software"]["anyOf"][0] == {
        "anyOf": [{"type": "string"}, {"items": {"type": "string"}, "minItems": 1, "type": "array"}],
        "description": "software manifest names or paths, or 'default'"}


# ---- load_grid: the file, its defaults, the order of its cells --------------------------------------------

def test_a_grid_file_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    assert refusal(tmp_path / "gone.yaml") == f"{tmp_path / 'gone.yaml'}: no such sweep grid file"
    assert refusal(tmp_path) == f"{tmp_path}: no such sweep grid file"  # a folder is not a grid file


def test_a_grid_that_is_not_a_mapping_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "[1, 2]\n")
    assert refusal(path) == f"{path}: <document>: expected a mapping with models, scenarios, ..., got [1, 2]"


def test_every_problem_of_a_grid_is_one_line_in_the_files_order(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "timeout: -1\nscenarios: [Offlin]\nrepeat: 0\nmodels: [m]\n")
    assert refusal(path).splitlines() == [
        f"{path}: timeout: expected a number of seconds > 0, got -1",
        f"{path}: scenarios[0]: expected one of SingleStream, MultiStream, Server, Offline, got 'Offlin'",
        f"{path}: repeat: expected an integer >= 1, got 0"]


def test_a_grid_with_only_models_and_scenarios_takes_every_default(tmp_path: Path) -> None:
    text = "models: m\nscenarios: Offline\n"
    path = grid_file(tmp_path, text, "plain-grid.yaml")
    grid = load_grid(str(path))  # a path given as text
    assert grid == Grid(path=path, name="plain-grid", cells=[Cell.of(model="m", scenario="Offline")], repeat=1,
                        timeout_s=900.0, document={"models": "m", "scenarios": "Offline"}, cells_per_node=1)
    (cell,) = grid.cells
    assert (cell.backend, cell.dataset, cell.hardware, cell.software, cell.mode, cell.quick, cell.presets,
            cell.profile, cell.overrides, cell.request.user_conf, cell.request.endpoint) == (
        None, None, "cpu", None, "performance", False, (), (), (), None, None)


def test_a_grid_sets_its_name_repeat_timeout_mode_presets_profile_and_cells_per_node(tmp_path: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Offline.target_qps = 5\n")
    path = grid_file(tmp_path, f"name: nightly\nrepeat: 3\ntimeout: 5.5\nmode: accuracy\nquick: true\n"
                               f"presets: [fast, slow]\nprofile: [harness]\nuser_conf: {conf}\n"
                               f"cluster: {{cells_per_node: 4}}\nmodels: [m]\nscenarios: [Server]\n")
    grid = load_grid(path)
    assert (grid.name, grid.repeat, grid.timeout_s, grid.cells_per_node) == ("nightly", 3, 5.5, 4)
    assert grid.document["cluster"] == {"cells_per_node": 4} and grid.document["presets"] == ["fast", "slow"]
    assert grid.cells == [Cell.of(model="m", scenario="Server", mode="accuracy", quick=True, presets=("fast", "slow"),
                                  profile=("harness",), user_conf=conf)]
    assert grid.cells[0].label() == f"m/default/Server user_conf={conf}"


def test_cells_cross_models_backends_scenarios_and_the_swept_settings_in_order(tmp_path: Path) -> None:
    path = grid_file(tmp_path, """\
        models:
          - alpha
          - {name: beta, backends: ["null"]}
        backends: [default, onnxruntime]
        scenarios: [Offline, Server]
        batch_sizes: [1, 8]
        threads: [2]
        settings: {workers: [1, 3]}
        """)
    expected = []
    for model, backends in (("alpha", ("default", "onnxruntime")), ("beta", ("null",))):
        for backend in backends:
            for scenario in ("Offline", "Server"):
                for batch in (1, 8):
                    for workers in (1, 3):
                        expected.append(f"{model}/{backend}/{scenario} intra_op_threads=2 max_batch_size={batch} "
                                        f"workers={workers}")
    assert labels(path) == expected
    cells = load_grid(path).cells
    assert [c.backend for c in cells[:8]] == [None] * 8  # `default`: the model manifest's own framework


def test_the_manifest_axes_cross_outside_the_scenarios(tmp_path: Path) -> None:
    path = grid_file(tmp_path, """\
        models: [m]
        datasets: [default, synthetic-images]
        hardware: [default, cuda0]
        software: [default, onnxruntime]
        scenarios: [Offline, Server]
        """)
    expected = []
    for dataset in ("", " dataset=synthetic-images"):
        for hardware in ("", " hardware=cuda0"):
            for software in ("", " software=onnxruntime"):
                for scenario in ("Offline", "Server"):
                    expected.append(f"m/default/{scenario}{dataset}{hardware}{software}")
    assert labels(path) == expected
    first, last = load_grid(path).cells[0], load_grid(path).cells[-1]
    assert (first.dataset, first.hardware, first.software) == (None, "cpu", None)
    assert (last.dataset, last.hardware, last.software) == ("synthetic-images", "cuda0", "onnxruntime")


def test_a_model_entrys_own_datasets_replace_the_grids(tmp_path: Path) -> None:
    path = grid_file(tmp_path, """\
        models: [a, {name: b, datasets: [synthetic-images, default]}]
        datasets: [imagenet-samples]
        scenarios: [Offline]
        """)
    assert labels(path) == ["a/default/Offline dataset=imagenet-samples", "b/default/Offline dataset=synthetic-images",
                            "b/default/Offline"]


def test_settings_layer_the_grids_set_then_the_models_then_the_swept_values(tmp_path: Path) -> None:
    path = grid_file(tmp_path, """\
        models:
          - {name: m, set: {Server: {min_duration: 200}, "*": {target_latency: 0.5}}}
          - {name: n, set: {workers: 9}}
        set: {"*": {min_duration: 100, workers: 1, max_batch_size: 2}, Server: {workers: 2}}
        scenarios: [Offline, Server]
        batch_sizes: [4]
        settings: {target_qps: [7]}
        """)
    assert labels(path) == [
        "m/default/Offline max_batch_size=4 min_duration=100 target_latency=0.5 target_qps=7 workers=1",
        "m/default/Server max_batch_size=4 min_duration=200 target_latency=0.5 target_qps=7 workers=2",
        "n/default/Offline max_batch_size=4 min_duration=100 target_qps=7 workers=9",
        "n/default/Server max_batch_size=4 min_duration=100 target_qps=7 workers=9"]


def test_a_flat_set_applies_to_every_scenario_and_true_is_written_true(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline, Server]\n"
                               "set: {use_token_latencies: true, coalesce_queries: false, target_latency: 0.002}\n")
    assert labels(path) == [
        "m/default/Offline coalesce_queries=false target_latency=0.002 use_token_latencies=true",
        "m/default/Server coalesce_queries=false target_latency=0.002 use_token_latencies=true"]
    empty = grid_file(tmp_path, "models: [{name: m, set: {}}]\nscenarios: [Offline]\nset: {}\n", "empty.yaml")
    assert labels(empty) == ["m/default/Offline"]


def test_a_model_entrys_endpoint_is_parsed_and_a_bad_one_names_the_entry(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [a, {name: b, endpoint: 'grpc://127.0.0.1:8001'}]\nscenarios: [Offline]\n")
    a, b = load_grid(path).cells
    assert (a.request.endpoint, b.request.endpoint) == (None, "grpc://127.0.0.1:8001")
    assert b.label() == "b/default/Offline endpoint=grpc://127.0.0.1:8001"
    path = grid_file(tmp_path, "models: [a, {name: b, endpoint: 'grpc:/x'}]\nscenarios: [Offline]\n")
    assert refusal(path).startswith(f"{path}: models[1]: endpoint: expected grpc://HOST:PORT, ")


def test_a_manifest_axis_that_names_no_manifest_is_refused_naming_its_place(tmp_path: Path) -> None:
    root = shipped_specs()
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline]\nhardware: [cpu, default, gpu9]\n")
    assert refusal(path) == f"{path}: hardware[2]: no hardware manifest named 'gpu9' under {root} (known: cpu, cuda0)"
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline]\nsoftware: [nope]\n")
    assert refusal(path).startswith(f"{path}: software[0]: no software manifest named 'nope' under {root} (known: ")
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline]\ndatasets: [default, nope]\n")
    assert refusal(path).startswith(f"{path}: datasets[1]: no dataset manifest named 'nope' under {root} (known: ")
    path = grid_file(tmp_path, "models: [a, {name: m, datasets: [nope]}]\nscenarios: [Offline]\n")
    assert refusal(path).startswith(f"{path}: models[1]: datasets[0]: no dataset manifest named 'nope' under {root}")


def test_a_manifest_axis_keeps_only_the_first_line_of_a_broken_manifests_error(tmp_path: Path) -> None:
    broken = write_manifest(tmp_path, "broken.yaml", "kind: hardware\nname: b\nversion: x\ndevice: tpu\n")
    path = grid_file(tmp_path, f"models: [m]\nscenarios: [Offline]\nhardware: [{broken}]\n")
    message = refusal(path)
    assert "\n" not in message and message.startswith(f"{path}: hardware[0]: {broken}: ")


def test_the_manifest_axis_checks_each_entry_and_gives_the_default_for_default() -> None:
    axis = sweep_grid._manifest_axis
    assert axis(None, "G: hardware", "hardware", "cpu") == ["cpu"]
    assert axis(None, "G: datasets", "dataset", None) == [None]
    assert axis(["default", "cuda0", "cpu", "default"], "G: hardware", "hardware", "cpu") == ["cpu", "cuda0", "cpu",
                                                                                                "cpu"]
    assert axis(["default"], "G: software", "software", None) == [None]
    with pytest.raises(UserError) as caught:
        axis(["cuda0", "default", "tpu"], "G: hardware", "hardware", "cpu")
    assert str(caught.value) == f"G: hardware[2]: no hardware manifest named 'tpu' under {shipped_specs()} (known: cpu, cuda0)"


def test_a_user_conf_that_is_not_a_file_is_one_line(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline]\nuser_conf: no.conf\n")
    assert refusal(path) == f"{path}: user_conf: expected a user.conf file, got 'no.conf'"
    path = grid_file(tmp_path, f"models: [m]\nscenarios: [Offline]\nuser_conf: {tmp_path}\n")
    assert refusal(path) == f"{path}: user_conf: expected a user.conf file, got {str(tmp_path)!r}"


def test_exclude_drops_the_combinations_every_key_of_a_rule_matches(tmp_path: Path) -> None:
    path = grid_file(tmp_path, """\
        models: [a, b]
        scenarios: [Offline, Server]
        batch_sizes: [1, 8]
        threads: [2, 4]
        exclude:
          - {model: a, scenario: Server}
          - {batch_size: 8, threads: 4}
          - {model: b, threads: 2, batch_size: 1}
        """)
    assert labels(path) == [
        "a/default/Offline intra_op_threads=2 max_batch_size=1", "a/default/Offline intra_op_threads=4 max_batch_size=1",
        "a/default/Offline intra_op_threads=2 max_batch_size=8",
        "b/default/Offline intra_op_threads=4 max_batch_size=1", "b/default/Offline intra_op_threads=2 max_batch_size=8",
        "b/default/Server intra_op_threads=4 max_batch_size=1", "b/default/Server intra_op_threads=2 max_batch_size=8"]


def test_exclude_reads_a_batch_size_or_thread_count_fixed_by_set(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [a, {name: b, set: {max_batch_size: 8, intra_op_threads: 3}}]\n"
                               "scenarios: [Offline]\nexclude: [{batch_size: 8}, {threads: 3}]\n")
    assert labels(path) == ["a/default/Offline"]
    path = grid_file(tmp_path, "models: [a, {name: b, set: {intra_op_threads: 3}}]\n"
                               "scenarios: [Offline]\nexclude: [{threads: 3}]\n")
    assert labels(path) == ["a/default/Offline"]


def test_a_grid_whose_every_cell_is_excluded_is_one_line(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [m]\nscenarios: [Offline]\nexclude: [{model: m}]\n")
    assert refusal(path) == f"{path}: the grid has no cells (every combination is excluded)"


def test_a_cell_the_grid_names_twice_runs_once(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "models: [m, n, m]\nbackends: [default, x, default]\nscenarios: [Offline]\n")
    assert labels(path) == ["m/default/Offline", "m/x/Offline", "n/default/Offline", "n/x/Offline"]


# ---- the pieces of the expansion ---------------------------------------------------------------------------

def test_text_writes_true_and_false_as_yaml_and_everything_else_as_str() -> None:
    assert [sweep_grid._text(v) for v in (True, False, 0, 1, 2.5, "x", None)] == [
        "true", "false", "0", "1", "2.5", "x", "None"]


def test_scoped_takes_a_flat_or_scoped_mapping_as_scoped() -> None:
    assert sweep_grid._scoped(None) == {"scoped": {}}
    assert sweep_grid._scoped({}) == {"scoped": {}}
    assert sweep_grid._scoped({"workers": 2}) == {"scoped": {"*": {"workers": 2}}}
    assert sweep_grid._scoped({"*": {"workers": 2}}) == {"scoped": {"*": {"workers": 2}}}
    scoped = {"*": {"workers": 2}, "Server": {"workers": 3}, "Offline": {"target_qps": 1}}
    assert sweep_grid._scoped(scoped) == {"scoped": scoped}


def test_scoped_for_merges_every_scenario_then_the_scenarios_own_as_text() -> None:
    settings = {"scoped": {"*": {"workers": 1, "quick_thing": True}, "Offline": {"workers": 2.5, "b": "x"}}}
    assert sweep_grid._scoped_for(settings, "Offline") == {"workers": "2.5", "quick_thing": "true", "b": "x"}
    assert sweep_grid._scoped_for(settings, "Server") == {"workers": "1", "quick_thing": "true"}
    assert sweep_grid._scoped_for({"scoped": {"Server": {"a": False}}}, "Server") == {"a": "false"}
    assert sweep_grid._scoped_for({"scoped": {"*": None, "Server": None}}, "Server") == {}
    assert sweep_grid._scoped_for({"scoped": None}, "Server") == {}
    assert sweep_grid._scoped_for({}, "Server") == {}


def test_axes_are_batch_sizes_then_threads_then_each_setting_in_the_files_order() -> None:
    doc = GridDoc.model_validate({"models": "m", "scenarios": "Offline", "settings": {"workers": [1], "min_duration": 5},
                                  "threads": [0, 2], "batch_sizes": 8})
    assert sweep_grid._axes(doc) == [("max_batch_size", [8]), ("intra_op_threads", [0, 2]), ("workers", [1]),
                                     ("min_duration", [5])]
    assert sweep_grid._axes(GridDoc.model_validate({"models": "m", "scenarios": "Offline"})) == []
    assert sweep_grid._axes(GridDoc.model_validate({"models": "m", "scenarios": "Offline", "threads": 1})) == [
        ("intra_op_threads", [1])]


def test_backend_default_is_the_model_manifests_own() -> None:
    assert (sweep_grid._backend("default"), sweep_grid._backend("onnxruntime")) == (None, "onnxruntime")


def test_excluded_matches_a_rule_whose_every_key_matches_the_cell() -> None:
    cell = Cell.of(model="m", scenario="Offline", overrides=("workers=2", "target_latency=0.5"))
    excluded = sweep_grid._excluded
    for rule in ({"model": "m"}, {"scenario": "Offline"}, {"backend": "default"}, {"dataset": "default"},
                 {"hardware": "cpu"}, {"software": "default"}, {"endpoint": "none"}, {"workers": 2},
                 {"target_latency": 0.5}, {"model": "m", "scenario": "Offline", "workers": "2"}):
        assert excluded(cell, None, None, [rule]), rule
    for rule in ({"model": "n"}, {"model": "m", "scenario": "Server"}, {"workers": 3}, {"batch_size": 8},
                 {"threads": 2}, {"backend": None}, {"target_latency": "0.50"}):
        assert not excluded(cell, None, None, [rule]), rule
    assert not excluded(cell, None, None, [])
    assert excluded(cell, None, None, [{"model": "n"}, {"scenario": "Offline"}])
    assert excluded(cell, 8, 2, [{"batch_size": 8, "threads": "2"}])
    assert excluded(cell, "8", None, [{"batch_size": 8}]) and not excluded(cell, "8", None, [{"threads": 8}])
    assert excluded(cell, None, 4, [{"threads": 4}]) and not excluded(cell, None, 4, [{"batch_size": 4}])
    assert excluded(cell, True, False, [{"batch_size": "true", "threads": False}])


def test_excluded_reads_a_setting_whose_value_holds_an_equals_sign_whole() -> None:
    cell = Cell.of(model="m", scenario="Offline", overrides=("endpoint_model=org/m=q4",))
    assert sweep_grid._excluded(cell, None, None, [{"endpoint_model": "org/m=q4"}])
    assert not sweep_grid._excluded(cell, None, None, [{"endpoint_model": "org/m"}])


def test_excluded_reads_the_cells_manifests_and_endpoint() -> None:
    cell = Cell.of(model="m", scenario="Server", backend="onnxruntime", dataset="ds", hardware="cuda0", software="sw",
                   endpoint="grpc://127.0.0.1:8001")
    for key, value in (("backend", "onnxruntime"), ("dataset", "ds"), ("hardware", "cuda0"), ("software", "sw"),
                       ("endpoint", "grpc://127.0.0.1:8001")):
        assert sweep_grid._excluded(cell, None, None, [{key: value}]), key
        assert not sweep_grid._excluded(cell, None, None, [{key: "default"}]), key


# ---- a cell: its params, key, label, setting and request ----------------------------------------------------

def test_a_cell_at_the_defaults_stores_only_the_fields_every_cell_always_had() -> None:
    cell = Cell.of(model="m", scenario="Offline")
    params = {"model": "m", "scenario": "Offline", "mode": "performance", "backend": None, "quick": False,
              "presets": [], "overrides": [], "profile": []}
    assert cell.params() == params
    assert cell.key == hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    assert len(cell.key) == 16


def test_a_cell_stores_the_fields_not_at_their_default_as_json_holds_them() -> None:
    cell = Cell.of(model="m", scenario="Server", backend="b", dataset="d", hardware="cuda0", software="s",
                   user_conf=Path("/c/user.conf"), use_tuned=False, compliance=("TEST01",), presets=("fast",),
                   overrides=("workers=2",))
    assert cell.params() == {"model": "m", "scenario": "Server", "mode": "performance", "backend": "b",
                             "dataset": "d", "hardware": "cuda0", "software": "s", "quick": False,
                             "presets": ["fast"], "user_conf": "/c/user.conf", "overrides": ["workers=2"],
                             "use_tuned": False, "profile": [], "compliance": ["TEST01"]}
    assert Cell.from_params(json.loads(json.dumps(cell.params()))) == cell


def test_stored_makes_tuples_lists_and_paths_text() -> None:
    assert [sweep_grid._stored(v) for v in (("a", "b"), Path("/x/y"), "s", 3, None, ["l"])] == [
        ["a", "b"], "/x/y", "s", 3, None, ["l"]]


def test_from_params_reads_only_the_fields_a_cell_stores() -> None:
    cell = Cell.from_params({"model": "m", "scenario": "Offline", "results_dir": "/elsewhere", "timeout": 5,
                             "hardware": "cuda0"})
    assert cell == Cell.of(model="m", scenario="Offline", hardware="cuda0")


def test_a_cells_label_is_model_backend_scenario_then_its_manifests_then_its_settings() -> None:
    assert Cell.of(model="m", scenario="Offline").label() == "m/default/Offline"
    cell = Cell.of(model="m", scenario="Server", backend="onnxruntime", dataset="d", hardware="cuda0", software="s",
                   user_conf="/c/u.conf", endpoint="grpc://h:1", overrides=("a=1", "b=x"))
    assert cell.label() == ("m/onnxruntime/Server dataset=d hardware=cuda0 software=s user_conf=/c/u.conf "
                            "endpoint=grpc://h:1 a=1 b=x")
    assert cell.manifests() == {"dataset": "d", "hardware": "cuda0", "software": "s", "user_conf": "/c/u.conf",
                                "endpoint": "grpc://h:1"}
    assert Cell.of(model="m", scenario="Offline", hardware="cpu", mode="accuracy").manifests() == {}


def test_a_cells_setting_is_the_value_of_its_first_override_of_that_key() -> None:
    cell = Cell.of(model="m", scenario="Offline", overrides=("max_batch_size_x=1", "max_batch_size=8", "expr=a=b"))
    assert (cell.setting("max_batch_size"), cell.setting("expr"), cell.setting("workers"), cell.setting("max")) == (
        "8", "a=b", None, None)


def test_a_cells_request_for_a_run_adds_the_sweeps_results_dir_and_timeout(tmp_path: Path) -> None:
    cell = Cell.of(model="m", scenario="Offline", hardware="cuda0", overrides=("workers=2",))
    request = cell.request_for(tmp_path / "r", 60.0)
    assert request == RunRequest(model="m", scenario="Offline", hardware="cuda0", overrides=("workers=2",),
                                 results_dir=tmp_path / "r", timeout=60.0)
    assert cell.request.results_dir == Path("results")  # the cell itself is unchanged


def test_a_cells_fields_are_its_requests() -> None:
    cell = Cell.of(model="m", scenario="Server", backend="b", dataset="d", hardware="h", software="s", mode="accuracy",
                   quick=True, presets=["p"], overrides=["a=1"], profile=["harness"])
    assert (cell.model, cell.backend, cell.dataset, cell.hardware, cell.software, cell.scenario, cell.mode, cell.quick,
            cell.presets, cell.overrides, cell.profile) == (
        "m", "b", "d", "h", "s", "Server", "accuracy", True, ("p",), ("a=1",), ("harness",))


# ---- mlharness.cluster.resources ----------------------------------------------------------------------------

SYSTEM = {"cpu_model": "Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz", "logical_cpus": 16,
          "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "Tesla T4"]}


def test_safe_keeps_letters_digits_dot_dash_underscore_and_is_never_empty() -> None:
    assert [_safe(t) for t in ("bench-01.lab_a", "my host!", "a//  b", "__x__", " -y- ", "", "!!!", "é",
                                "Xeon_X")] == [
        "bench-01.lab_a", "my_host", "a_b", "x", "-y-", "unknown", "unknown", "unknown", "Xeon_X"]


def test_a_node_advertises_its_slot_name_system_per_device_gpus_and_aliases() -> None:
    found = node_resources(SYSTEM, "bench 01", (" epyc-box ", "lab"))
    assert found == {
        "mlharness_slot": 1.0, "mlharness_node:bench_01": 1.0,
        "mlharness_system:Intel_Xeon_Platinum_8370C_16c": 1.0,
        "mlharness_system:Intel_Xeon_Platinum_8370C_16c_cuda0": 1.0,
        "mlharness_system:Intel_Xeon_Platinum_8370C_16c_cuda1": 1.0,
        "mlharness_system:Intel_Xeon_Platinum_8370C_16c_cuda2": 1.0,
        "mlharness_gpu:NVIDIA_H100_80GB_HBM3": 2.0, "mlharness_gpu:Tesla_T4": 1.0,
        "mlharness_system:epyc-box": 1.0, "mlharness_system:lab": 1.0}


def test_a_node_without_gpus_advertises_its_slot_name_and_system() -> None:
    system = {"cpu_model": "AMD EPYC 7763 64-Core Processor", "logical_cpus": 128}
    expected = {"mlharness_slot": 1.0, "mlharness_node:n1": 1.0,
                "mlharness_system:AMD_EPYC_7763_64_Core_Processor_128c": 1.0}
    assert node_resources(system, "n1") == expected
    assert node_resources({**system, "gpus": None}, "n1") == expected
    assert node_resources({**system, "gpus": []}, "n1", ()) == expected


def test_an_empty_system_alias_is_refused() -> None:
    with pytest.raises(UserError) as caught:
        node_resources(SYSTEM, "n1", ("ok", "  "))
    assert str(caught.value) == "--system: expected a system name, got an empty one"


def test_a_nodes_name_is_read_back_from_its_resources() -> None:
    assert node_name({"mlharness_node:zeta": 1.0, "mlharness_node:alpha": 1.0, "mlharness_slot": 1.0}, "fb") == "alpha"
    assert node_name({"mlharness_slot": 1.0, "x_mlharness_node:a": 1.0}, "10.0.0.2") == "10.0.0.2"
    assert node_name(node_resources(SYSTEM, "bench 01"), "fb") == "bench_01"


def test_a_cell_needs_its_slot_fraction_and_the_gpus_of_its_device() -> None:
    assert cell_needs(RunRequest(model="m", scenario="Offline")) == {SLOT: 1.0}
    assert cell_needs(RunRequest(model="m", scenario="Offline"), 3) == {SLOT: 0.3333}
    assert cell_needs(RunRequest(model="m", scenario="Offline", hardware="cuda0"), 2) == {SLOT: 0.5, "GPU": 1.0}


def test_a_cell_whose_hardware_names_no_manifest_is_refused_naming_the_specs_searched() -> None:
    with pytest.raises(UserError) as caught:
        cell_needs(RunRequest(model="m", scenario="Offline", hardware="tpu9"))
    assert str(caught.value) == f"no hardware manifest named 'tpu9' under {shipped_specs()} (known: cpu, cuda0)"


def test_a_cell_needs_the_system_its_hardware_manifest_names(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    hardware_manifest(specs, "epyc", "device: cuda:2\nsystem: ' AMD_EPYC_128c '\n")
    hardware_manifest(specs, "plain", "device: cpu\n")
    request = RunRequest(model="m", scenario="Offline", hardware="epyc", specs_root=specs)
    assert cell_needs(request, 4) == {SLOT: 0.25, "GPU": 3.0, "mlharness_system:AMD_EPYC_128c": LABEL_AMOUNT}
    assert cell_needs(RunRequest(model="m", scenario="Offline", hardware="plain", specs_root=specs)) == {SLOT: 1.0}


@pytest.mark.parametrize("value, shown", [("''", "''"), ("'   '", "'   '"), ("5", "5"), ("{cpu: x}", "{'cpu': 'x'}")])
def test_a_hardware_system_that_is_not_a_name_is_refused_naming_the_manifest(tmp_path: Path, value: str,
                                                                           shown: str) -> None:
    path = hardware_manifest(tmp_path, "odd", f"device: cpu\nsystem: {value}\n")
    with pytest.raises(UserError) as caught:
        cell_needs(RunRequest(model="m", scenario="Offline", hardware=str(path)))
    assert str(caught.value) == (f"{path}: system: expected a system name (as `mlharness node --dry-run` lists "
                                 f"them), got {shown}")


def test_a_node_satisfies_needs_it_has_every_one_of_to_a_millionth() -> None:
    node = {SLOT: 1.0, "GPU": 2.0, "mlharness_system:x": 1.0}
    assert satisfies(node, {SLOT: 1.0, "GPU": 2.0, "mlharness_system:x": LABEL_AMOUNT})
    assert satisfies(node, {SLOT: 0.3333 * 3}) and satisfies(node, {"GPU": 2.0000009})
    assert not satisfies(node, {"GPU": 2.00001}) and not satisfies(node, {SLOT: 1.0, "GPU": 3.0})
    assert not satisfies(node, {"mlharness_system:y": LABEL_AMOUNT})
    assert satisfies(node, {}) and satisfies({}, {"anything": 0.0})
    assert satisfies({}, {"anything": 1e-6}) and not satisfies({}, {"anything": 2e-6})  # the tolerance, no more


def test_needs_are_described_without_the_slot_and_labels_without_their_amount() -> None:
    needs = {SLOT: 0.5, "mlharness_system:x": LABEL_AMOUNT, "GPU": 2.0, "zeta": 0.25}
    assert describe_needs(needs) == "GPU=2, mlharness_system:x, zeta=0.25"
    assert describe_needs({SLOT: 1.0}) == "an mlharness node"
    assert describe_needs({}) == "an mlharness node"


# ---- mlharness.cluster.address -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, host, port", [
    ("ray://head:10001", "head", 10001), ("10.0.0.1:6379", "10.0.0.1", 6379), ("[::1]:6379", "::1", 6379),
    ("h:1", "h", 1), ("h:65535", "h", 65535), ("ray:6379", "ray", 6379), ("h:06379", "h", 6379),
    ("ray://[fe80::1]:10001", "fe80::1", 10001), ("a.b-c_d:2", "a.b-c_d", 2), ("XEON-Box:3", "XEON-Box", 3),
])
def test_a_cluster_address_names_its_host_and_port(text: str, host: str, port: int) -> None:
    address = parse_cluster_address(f" {text}\n")
    assert address == ClusterAddress(text, host, port) and not address.local


def test_ray_alone_is_the_local_cluster() -> None:
    assert parse_cluster_address("ray") == ClusterAddress("ray", None, None)
    assert parse_cluster_address("  ray ").local and parse_cluster_address("ray").text == "ray"


@pytest.mark.parametrize("text, problem", [
    ("", "got nothing"), ("   ", "got nothing"),
    ("ray://", "'ray://' names no host"), ("ray://head", "'ray://head' names no port"),
    ("head", "'head' names no port"), ("Ray", "'Ray' names no port"), (":6379", "':6379' names no host"),
    ("ray://:1", "'ray://:1' names no host"), ("[]:1", "'[]:1' names no host"),
    ("head:", "'head:': the port must be a number from 1 to 65535, got ''"),
    ("head:0", "'head:0': the port must be a number from 1 to 65535, got '0'"),
    ("head:65536", "'head:65536': the port must be a number from 1 to 65535, got '65536'"),
    ("head:-1", "'head:-1': the port must be a number from 1 to 65535, got '-1'"),
    ("head:port", "'head:port': the port must be a number from 1 to 65535, got 'port'"),
    ("a/b:1", "'a/b:1': 'a/b' is not a host name or address"),
    ("a b:1", "'a b:1': 'a b' is not a host name or address"),
    ("u@h:1", "'u@h:1': 'u@h' is not a host name or address"),
    ("h?:1", "'h?:1': 'h?' is not a host name or address"),
    ("h#:1", "'h#:1': 'h#' is not a host name or address"),
    ("http://h:1", "'http://h:1': 'http://h' is not a host name or address"),
    ("[::1]", "'[::1]' names no port"), ("ray://[::1]", "'ray://[::1]' names no port"),
    ("[::1:6379", "'[::1:6379': '[::1' is not a host name or address"),
    ("h]:1", "'h]:1': 'h]' is not a host name or address"),
    ("[h]x:1", "'[h]x:1': '[h]x' is not a host name or address"),
])
def test_a_cluster_address_of_the_wrong_form_is_one_line_naming_the_flag(text: str, problem: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_cluster_address(text)
    assert str(caught.value) == FORMS + problem


def test_the_flag_named_is_the_one_given() -> None:
    with pytest.raises(UserError) as caught:
        parse_cluster_address("head", flag="--address")
    assert str(caught.value) == "--address: expected ray, ray://HOST:PORT or HOST:PORT; 'head' names no port"


def test_probing_the_local_cluster_connects_nowhere_and_a_closed_port_is_one_line() -> None:
    assert probe(ClusterAddress("ray"), 0.5) is None
    with socket.socket() as closed:  # a port just free: nothing listens there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(UserError) as caught:
        probe(parse_cluster_address(f"127.0.0.1:{port}"), 5.0)
    assert str(caught.value) == (f"--cluster 127.0.0.1:{port}: cannot connect to 127.0.0.1 port {port}: Connection "
                                 f"refused; is the Ray head started there (mlharness node --head)?")


def test_probing_a_port_that_takes_no_connection_waits_the_timeout_and_says_no_answer() -> None:
    """A port that never answers the connection (a firewall that drops): the probe ends at its own timeout, not
    after TCP's retries (about two minutes)."""
    with unanswered_port() as port, pytest.raises(UserError) as caught:
        probe(parse_cluster_address(f"127.0.0.1:{port}"), 0.5)
    assert str(caught.value) == (f"--cluster 127.0.0.1:{port}: no answer from 127.0.0.1 port {port} within 0.5 s "
                                 f"(--connect-timeout); is the Ray head started there (mlharness node --head) and "
                                 f"the port open?")


def test_probing_a_port_that_accepts_and_never_answers_says_so_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that takes the connection and sends nothing: gRPC's call ends at the probe's timeout. The
    probe quiets gRPC's own logging of the failed call unless the user set it."""
    monkeypatch.setenv("GRPC_VERBOSITY", "unset by the test")
    monkeypatch.delenv("GRPC_VERBOSITY")  # restored as it was after the test
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with pytest.raises(UserError) as caught:
            probe(parse_cluster_address(f"127.0.0.1:{port}"), 0.5, "--address")
    assert str(caught.value) == (f"--address 127.0.0.1:{port}: 127.0.0.1 port {port} accepts connections but sent no "
                                 f"gRPC answer within 0.5 s (--connect-timeout); is it the Ray head's port "
                                 f"(mlharness node --head)?")
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"


@contextlib.contextmanager
def grpc_server_of_nothing(host: str) -> Iterator[int]:
    """A real gRPC server on loopback that serves no service (another program's gRPC port): its port."""
    import grpc

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


@pytest.fixture
def not_ray_grpc() -> Iterator[int]:
    with grpc_server_of_nothing("127.0.0.1") as port:
        yield port


@pytest.mark.parametrize("scheme, service", [("", "Ray's GCS"), ("ray://", "the Ray Client server")])
def test_probing_a_port_that_serves_other_grpc_asks_rays_own_service(not_ray_grpc: int, scheme: str,
                                                                     service: str) -> None:
    address = parse_cluster_address(f"{scheme}127.0.0.1:{not_ray_grpc}")
    with pytest.raises(UserError) as caught:
        probe(address, 5.0, "--address")
    assert str(caught.value) == (f"--address {address.text}: 127.0.0.1 port {not_ray_grpc} answers gRPC but is not "
                                 f"{service}; is it the Ray head's port (mlharness node --head)?")


def test_probing_an_ipv6_address_asks_its_grpc_server_in_brackets() -> None:
    try:
        with socket.socket(socket.AF_INET6) as check:
            check.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    with grpc_server_of_nothing("[::1]") as port:
        with pytest.raises(UserError) as caught:
            probe(parse_cluster_address(f"[::1]:{port}"), 5.0)
    assert str(caught.value) == (f"--cluster [::1]:{port}: ::1 port {port} answers gRPC but is not Ray's GCS; "
                                 f"is it the Ray head's port (mlharness node --head)?")


def test_probing_a_port_that_speaks_http_says_it_does_not_speak_grpc() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown waits one poll
    port = server.server_address[1]
    try:
        with pytest.raises(UserError) as caught:
            probe(parse_cluster_address(f"127.0.0.1:{port}"), 5.0)
    finally:
        server.shutdown()
        server.server_close()
    assert str(caught.value) == (f"--cluster 127.0.0.1:{port}: 127.0.0.1 port {port} accepts connections but does not "
                                 f"speak gRPC, as Ray's GCS does; is it the Ray head's port (mlharness node --head)?")
