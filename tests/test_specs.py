"""Every shipped spec, beyond loading (tests/test_manifests.py): its files resolve and match their
sha256, its datasets enumerate the declared sample count, its references and conversions point at
manifests that exist. Plus the one-line errors of the conversion and `files` fields."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.specs.index import SpecIndex
from mlharness.specs.manifests import load_manifest
from mlharness.specs.validation import ManifestError
from tests.support import REPO, sha256, write_manifest

INDEX = SpecIndex(REPO / "specs")


def _ids(kind: str) -> list:
    return [pytest.param(m, id=m.path.name) for m in INDEX.all(kind)]


def _fetched_sources() -> list:
    """One case per fetched source (a file, not a conversion) of every shipped model and dataset;
    manifests without one (null, null-samples, synthetic-images, converted models) have no case."""
    cases = []
    for manifest in [*INDEX.all("model"), *INDEX.all("dataset")]:
        for key, artifact in manifest.sources.items():
            if artifact.convert is None:
                marks = [pytest.mark.skip(reason=f"{artifact.uri}: downloads are not made in the test run")] \
                    if artifact.uri.startswith("https://") else []
                cases.append(pytest.param(manifest, key, id=f"{manifest.path.name}:{key}", marks=marks))
    return cases


def test_the_shipped_specs_have_fetched_sources_to_check() -> None:
    assert len(_fetched_sources()) >= 20  # the image samples alone are 20


@pytest.mark.parametrize("manifest, key", _fetched_sources())
def test_every_fetched_source_resolves_and_matches_its_sha256(manifest, key: str) -> None:  # noqa: ANN001
    from mlharness.specs import artifacts

    artifact = manifest.sources[key]
    path = artifacts.resolve(artifact, f"{manifest.path}: sources.{key}", manifest.path.parent)
    assert path.is_file() and sha256(path) == artifact.sha256  # hashed here, not by the code under test


@pytest.mark.parametrize("dataset", _ids("dataset"))
def test_every_dataset_enumerates_its_declared_samples(dataset) -> None:  # noqa: ANN001
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    ctx = ProcessingContext(sources=resolve_sources(dataset), dataset=dataset)
    items = enumerate_samples(dataset, ctx)  # raises unless there are exactly sample_count items
    assert len(items) == dataset.sample_count


@pytest.mark.parametrize("model", _ids("model"))
def test_every_model_names_an_existing_dataset_and_conversion_source(model) -> None:  # noqa: ANN001
    from mlharness.sut.conversion import _EXPORTERS, source_manifest

    assert model.default_dataset, f"{model.path}: names no dataset"
    assert INDEX.find("dataset", model.default_dataset).name == model.default_dataset
    for key, artifact in model.sources.items():
        if artifact.convert is not None:
            source = source_manifest(artifact.convert, model.path.parent, f"{model.path}: sources.{key}")
            assert (source.framework, artifact.convert.to) in _EXPORTERS
            assert source.name == model.name  # a conversion serves the same model on another backend
            assert [s.name for s in source.inputs] == [s.name for s in model.inputs]


@pytest.mark.parametrize("reference", _ids("reference"))
def test_every_reference_names_a_model_for_its_backend_and_a_dataset(reference) -> None:  # noqa: ANN001
    models = [m for m in INDEX.named("model", reference.model["name"]) if m.framework == reference.backend]
    assert models, f"{reference.path}: no {reference.model['name']} manifest for backend {reference.backend}"
    assert models[0].version == reference.model["version"]
    dataset = INDEX.find("dataset", reference.dataset["name"])
    assert dataset.version == reference.dataset["version"]
    assert reference.accuracy and all(spec.get("tolerance", 0) >= 0 and 0 < spec.get("min_fraction", 1) <= 1
                                      and len(spec) == 2 for spec in reference.accuracy.values())


CONVERTED = """\
kind: model
name: tiny
version: 1.0.0
framework: {name: onnxruntime}
inputs: [{name: x, element_type: float32, shape: [batch, 4]}]
outputs: [{name: y, element_type: float32, shape: [batch, 2]}]
sources:
  graph:
    convert: {from: tiny-torch.yaml, to: onnx, opset: 17, example_dims: {batch: 2}}
"""


def test_a_conversion_needs_no_uri_nor_sha256(tmp_path: Path) -> None:
    graph = load_manifest(write_manifest(tmp_path, "m.yaml", CONVERTED)).sources["graph"]
    assert graph.uri == "" and graph.sha256 is None
    assert graph.convert.describe() == {"from": "tiny-torch.yaml", "to": "onnx", "opset": 17, "example_dims": {"batch": 2}}


@pytest.mark.parametrize("old, new, field, expected", [
    ("    convert:", "    uri: a.onnx\n    convert:", "sources.graph.uri", "either uri or convert"),
    ("to: onnx", "to: tflite", "sources.graph.convert.to", "one of ['onnx']"),
    ("opset: 17", "opset: 3", "sources.graph.convert.opset", "between 7 and 30"),
    ("{batch: 2}", "{batch: 0}", "sources.graph.convert.example_dims.batch", "a positive size"),
    ("from: tiny-torch.yaml, ", "", "sources.graph.convert.from", "required field is missing"),
    ("to: onnx,", "to: onnx, exporter: x,", "sources.graph.convert.exporter", "no such field"),
    ("    convert: {from: tiny-torch.yaml, to: onnx, opset: 17, example_dims: {batch: 2}}",
     "    uri: a.onnx", "sources.graph.sha256", "required field is missing"),
    ("sources:\n", "sources:\n  files: {weights: {uri: w.bin, sha256: '%s'}}\n" % ("a" * 64),
     "sources.files.weights", "not one of"),
])
def test_conversion_and_files_errors_are_one_line(tmp_path: Path, old: str, new: str, field: str, expected: str) -> None:
    assert old in CONVERTED
    path = write_manifest(tmp_path, "m.yaml", CONVERTED.replace(old, new, 1))
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    lines = [p for p in info.value.problems if f": {field}: " in p]
    assert lines and expected in lines[0], info.value.problems
    assert all("\n" not in line and line.startswith(str(path)) for line in info.value.problems)


def test_missing_conversion_source_is_named(tmp_path: Path) -> None:
    from mlharness.errors import UserError
    from mlharness.sut.conversion import convert

    path = write_manifest(tmp_path, "m.yaml", CONVERTED)
    graph = load_manifest(path).sources["graph"]
    with pytest.raises(UserError, match=r"m\.yaml: sources\.graph: convert\.from: no model manifest at .*tiny-torch\.yaml"):
        convert(graph, f"{path}: sources.graph", tmp_path)
