"""`mlharness specs schema`: the JSON Schema files written from the pydantic schemas, checked with
an independent validator (jsonschema, Draft 2020-12), as an editor's YAML language server would use
them: every shipped manifest and grid is valid, and the malformed manifests and grids the rule tests
use are refused."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from support import REPO, run_cli
from test_manifest_rules import BASE, ERRORS, _edit

KIND_FOLDERS = {"model": "models", "dataset": "datasets", "software": "software", "hardware": "hardware",
                "reference": "references"}
# Refused by the loader, not expressible in JSON Schema: a YAML mapping key that is a number (JSON
# keys are strings), and 8.0 where an integer is expected (JSON Schema counts 8.0 as an integer).
LOADER_ONLY = {"sources.graph.convert.example_dims.3", "sample_count: expected a positive integer, got 8.0"}


@pytest.fixture(scope="module")
def validators(tmp_path_factory: pytest.TempPathFactory) -> dict[str, jsonschema.Draft202012Validator]:
    out = tmp_path_factory.mktemp("schemas")
    assert run_cli("specs", "schema", "--out", str(out)) == 0
    found = {}
    for path in sorted(out.iterdir()):
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)  # a well-formed schema of that dialect
        found[path.name.removesuffix(".schema.json")] = jsonschema.Draft202012Validator(schema)
    assert sorted(found) == sorted([*KIND_FOLDERS, "grid", "preset"])
    return found


def _errors(validator: jsonschema.Draft202012Validator, doc: Any) -> list[str]:
    return [error.message for error in validator.iter_errors(doc)]


@pytest.mark.parametrize("kind", sorted(KIND_FOLDERS))
def test_every_shipped_manifest_is_valid_under_its_schema(validators: dict, kind: str) -> None:
    files = sorted((REPO / "specs" / KIND_FOLDERS[kind]).glob("*.yaml"))
    assert files
    assert {f.name: _errors(validators[kind], yaml.safe_load(f.read_text())) for f in files} == \
        {f.name: [] for f in files}


def test_the_malformed_manifests_of_the_rule_tests_are_refused(validators: dict) -> None:
    accepted = []
    for param in ERRORS:
        kind, edits, lines = param.values
        if any(line.startswith(tuple(LOADER_ONLY)) for line in lines):
            continue
        if not _errors(validators[kind], _edit(BASE[kind], edits)):
            accepted.append(lines[0])
    assert accepted == []
    assert len(ERRORS) > 150  # the rule tests' cases, not an empty list


@pytest.mark.parametrize("doc, refused", [
    ({"kind": "model", "name": "m", "version": "1.0.0", "framework": {"name": "onnxruntime"},
      "inputs": [{"name": "x", "element_type": "float32", "shape": [1]}],
      "outputs": [{"name": "y", "element_type": "float32", "shape": [1]}], "sources": {}}, True),  # no graph
    ({"kind": "model", "name": "m", "version": "1.0.0", "framework": {"name": "null"},
      "inputs": [{"name": "x", "element_type": "float32", "shape": ["batch", 2]}],
      "outputs": [{"name": "y", "element_type": "float32", "shape": ["batch"]}]}, False),  # null needs no sources
])
def test_what_a_framework_needs_is_in_the_schema(validators: dict, doc: dict, refused: bool) -> None:
    assert bool(_errors(validators["model"], doc)) is refused


def test_the_example_grid_is_valid_and_bad_grids_are_refused(validators: dict) -> None:
    grid = validators["grid"]
    assert _errors(grid, yaml.safe_load((REPO / "scenarios" / "sweep-example.yaml").read_text())) == []
    assert _errors(grid, {"models": "null", "scenarios": "Offline"}) == []  # one value where a list may be
    assert _errors(grid, {"models": [{"name": "m", "set": {"Offline": {"target_qps": 5}}}], "scenarios": ["Server"],
                          "settings": {"workers": [1, 2]}}) == []
    for bad in ({"models": ["m"], "scenarios": ["Offlin"]}, {"models": ["m"], "scenarios": ["Offline"], "batchsize": [1]},
                {"models": ["m"], "scenarios": ["Offline"], "settings": {"max_batch": [1]}},
                {"models": ["m"], "scenarios": ["Offline"], "repeat": 0}, {"scenarios": ["Offline"]},
                {"models": [{"name": "m", "sets": 1}], "scenarios": ["Offline"]}):
        assert _errors(grid, bad), bad


def test_the_shipped_presets_are_valid_and_bad_presets_are_refused(validators: dict) -> None:
    preset = validators["preset"]
    assert _errors(preset, yaml.safe_load((REPO / "scenarios" / "quick.yaml").read_text())) == []
    for bad in ([1, 2], {"settings": ["min_duration"]}, {"settings": {"Offline": 5}},
                {"settings": {"Offline": {"min_durations": 5}}}, {"settings": {"Offlne": {"min_duration": 5}}},
                {"settings": {"Server": {"min_duration": [5]}}}, {"setting": {}}):
        assert _errors(preset, bad), bad


def test_one_kind_is_written_alone_and_an_unknown_kind_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    assert run_cli("specs", "schema", "hardware", "--out", str(tmp_path / "one")) == 0
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["hardware.schema.json"]
    capfd.readouterr()
    assert run_cli("specs", "schema", "models", "--out", str(tmp_path / "two")) == 1
    err = capfd.readouterr().err.strip()
    assert err == ("mlharness: error: specs schema: KIND: expected one of model, dataset, software, hardware, "
                   "reference, grid, preset, got 'models'")
    assert not (tmp_path / "two").exists()
