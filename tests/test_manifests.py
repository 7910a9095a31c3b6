"""Manifest loading and each validation error: one line naming the file, the field and what was expected."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.specs.index import spec_files
from mlharness.specs.manifests import load_manifest
from mlharness.specs.validation import ManifestError
from tests.support import REPO, run_cli, write_manifest

GOOD_MODEL = """\
kind: model
name: tiny
version: 1.2.3
framework: {name: onnxruntime, version: ">=1.0"}
inputs:
  - {name: x, type: tensor, element_type: float32, shape: [batch, 4]}
outputs:
  - {name: y, type: tensor, element_type: float32, shape: [batch, 2]}
sources:
  graph: {uri: model.onnx, sha256: "%s"}
""" % ("a" * 64)


def test_every_shipped_spec_loads_and_validates() -> None:
    files = spec_files(REPO / "specs")
    assert len(files) >= 9
    for path in files:
        manifest = load_manifest(path)
        assert manifest.name and manifest.version and len(manifest.sha256) == 64


def test_good_model_fields(tmp_path: Path) -> None:
    model = load_manifest(write_manifest(tmp_path, "m.yaml", GOOD_MODEL))
    assert model.ref == "tiny@1.2.3"
    assert model.inputs[0].shape == ("batch", 4)
    assert model.inputs[0].sample_shape() == (4,)
    assert model.sources["graph"].uri == "model.onnx"


@pytest.mark.parametrize("old, new, field, expected", [
    ("name: tiny", "name: 'bad name!'", "name", "a name of letters"),
    ("version: 1.2.3", "version: one", "version", "a semantic version"),
    ("element_type: float32, shape: [batch, 4]", "element_type: float128, shape: [batch, 4]",
     "inputs[0].element_type", "one of"),
    ("shape: [batch, 4]", "shape: [batch, -4]", "inputs[0].shape[1]", "a positive size"),
    ('sha256: "' + "a" * 64, 'sha256: "' + "z" * 64, "sources.graph.sha256", "64 lowercase hex"),
    ("kind: model", "kind: modle", "kind", "'model'"),
    ("framework: {name: onnxruntime", "framework: {name: tensorflow", "framework.name", "one of"),
    ("outputs:", "output_tensors:", "output_tensors", "no such field"),
])
def test_each_validation_error_is_one_line_with_file_and_field(tmp_path: Path, old: str, new: str, field: str,
                                                              expected: str) -> None:
    assert old in GOOD_MODEL
    path = write_manifest(tmp_path, "m.yaml", GOOD_MODEL.replace(old, new, 1))
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    lines = [p for p in info.value.problems if f": {field}: " in p]
    assert lines, info.value.problems
    assert all("\n" not in line and line.startswith(str(path)) for line in info.value.problems)
    assert expected in lines[0]


def test_missing_required_field_named(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, "m.yaml", GOOD_MODEL.replace("version: 1.2.3\n", ""))
    with pytest.raises(ManifestError, match=r"m\.yaml: version: expected a semantic version .*required"):
        load_manifest(path)


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, "m.yaml", "kind: model\nname: [unclosed\n")
    with pytest.raises(ManifestError, match=r"m\.yaml: line \d+: expected valid YAML"):
        load_manifest(path)


def test_code_reference_must_be_source_or_module_function(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, "m.yaml", GOOD_MODEL + "preprocess: not a reference\n")
    with pytest.raises(ManifestError, match="preprocess: expected inline Python source"):
        load_manifest(path)


@pytest.mark.parametrize("kind, text, field", [
    ("dataset", "kind: dataset\nname: d\nversion: 1.0.0\nsample_count: 0\nsamples: m:f\n", "sample_count"),
    ("software", "kind: software\nname: s\nversion: 1.0.0\npackages: {numpy: '=>1'}\n", "packages.numpy"),
    ("hardware", "kind: hardware\nname: h\nversion: 1.0.0\ndevice: gpu\n", "device"),
    ("hardware", "kind: hardware\nname: h\nversion: 1.0.0\nintra_op_threads: -1\n", "intra_op_threads"),
    ("reference", "kind: reference\nname: r\nversion: 1.0.0\nbackend: null\nmodel: {name: m, version: x}\n"
                  "dataset: {name: d, version: 1.0.0}\n", "model.version"),
])
def test_other_kinds_validate(tmp_path: Path, kind: str, text: str, field: str) -> None:
    path = write_manifest(tmp_path, f"{kind}.yaml", text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert any(f"{path}: {field}: expected" in p for p in info.value.problems), info.value.problems


def test_specs_validate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_manifest(tmp_path, "good.yaml", GOOD_MODEL)
    bad = write_manifest(tmp_path, "bad.yaml", GOOD_MODEL.replace("version: 1.2.3", "version: 1.2"))
    assert run_cli("specs", "validate", good) == 0
    assert run_cli("specs", "validate", good, bad) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{bad}: version: expected a semantic version such as 1.0.0, got 1.2"]


def test_specs_list_names_every_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("specs", "list") == 0
    out = capsys.readouterr().out
    assert "resnet50-light@1.0.0" in out and "null@1.0.0" in out


def test_unknown_spec_name_lists_known(specs_copy: Path) -> None:
    from mlharness.specs.index import default_index

    with pytest.raises(UserError, match="no model manifest named 'nope'.*resnet50-light"):
        default_index().find("model", "nope")
