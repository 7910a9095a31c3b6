"""ONNX Runtime's check of a manifest's declared input element_type against the graph's own input type,
before any sample is run: a float64 or an int16 graph input declared float32 is one UserError naming the
manifest's field and both types. Real ONNX graphs (a Cast to float, then the head), the real backend."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.specs.manifests import load_manifest
from mlharness.sut import backends
from tests.support import REPO, sha256, write_manifest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def cast_graph(path: Path, input_type: int) -> Path:
    """x [batch, 1] of `input_type`, cast to float and tiled to y [batch, 10]."""
    repeats = helper.make_tensor("repeats", TensorProto.INT64, [2], [1, 10])
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Tile", ["xf", "repeats"], ["y"])]
    graph = helper.make_graph(nodes, "cast", [helper.make_tensor_value_info("x", input_type, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
                              initializer=[repeats])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def load_backend(folder: Path, graph: Path, element_type: str):
    from mlharness.sut.runtime import resolve_sources

    manifest = write_manifest(folder, "cast.yaml", f"""\
        kind: model
        name: cast
        version: 1.0.0
        framework: {{name: onnxruntime, version: ">=1.17"}}
        dataset: null-samples
        inputs: [{{name: x, type: tensor, element_type: {element_type}, shape: [batch, 1]}}]
        outputs: [{{name: y, type: scores, element_type: float32, shape: [batch, 10]}}]
        sources:
          graph: {{uri: "{graph}", sha256: {sha256(graph)}}}
        """)
    model = load_manifest(manifest)
    hardware = load_manifest(REPO / "specs" / "hardware" / "cpu.yaml")
    backend = backends.create("onnxruntime", model=model, sources=resolve_sources(model), hardware=hardware, options={})
    backend.load()
    return manifest, backend


@pytest.mark.parametrize("graph_type, graph_name", [(TensorProto.DOUBLE, "float64"), (TensorProto.INT16, "int16")])
def test_a_graph_input_of_another_type_than_declared_is_one_line_naming_the_field(tmp_path: Path, graph_type: int,
                                                                                  graph_name: str) -> None:
    graph = cast_graph(tmp_path / "cast.onnx", graph_type)
    with pytest.raises(UserError) as caught:
        load_backend(tmp_path / "m", graph, "float32")
    assert str(caught.value) == (f"{tmp_path / 'm' / 'cast.yaml'}: inputs[0].element_type: the graph expects "
                                 f"{graph_name}, got float32")


def test_a_graph_input_of_the_declared_type_loads_and_runs(tmp_path: Path) -> None:
    _, backend = load_backend(tmp_path / "m", cast_graph(tmp_path / "cast.onnx", TensorProto.DOUBLE), "float64")
    out = backend.predict({"x": np.array([[2.0], [3.0]])})["y"]
    np.testing.assert_array_equal(out, np.repeat(np.array([[2.0], [3.0]], np.float32), 10, axis=1))
