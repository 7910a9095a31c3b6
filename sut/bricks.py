"""Bricks (DLBricks, Benanza): a model decomposed into the kernels ONNX Runtime actually executes.

The graph is optimized by ONNX Runtime at the session's level (so a brick is a fused kernel such as
Conv+BatchNorm+Relu, or a layout-transformed NCHWc Conv, not a source node), then run once with every
intermediate tensor exposed to learn each node's concrete input shapes and values. Each node becomes
a runnable single-node model: its weights are its own initializers, its inputs the tensors it saw
in the model (deterministic: the model was fed the dataset's first samples). Nodes that are the same
kernel on the same shapes share one brick key (op type, domain, attributes, input and weight shapes
and dtypes; never weight values), so a brick is benchmarked once within a model and across models.

How a brick is timed: mlharness.sut.brick_timing."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from mlharness.errors import UserError

# Levels by name, as ONNX Runtime's GraphOptimizationLevel enum and run.json say them.
OPT_LEVELS = ("disable_all", "enable_basic", "enable_extended", "enable_all")
# The level a brick runs at as executed: the node is already what the model's optimizer made of it.
AS_EXECUTED = "disable_all"
_SUBGRAPH_ATTRIBUTE_TYPES = (5, 10)  # AttributeProto.GRAPH, GRAPHS: control flow (If, Loop, Scan)


def ort_level(name: str) -> Any:
    import onnxruntime as ort

    return getattr(ort.GraphOptimizationLevel, f"ORT_{name.upper()}")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]
    weight: bool = False  # an initializer of the model (its values are not part of the key)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "weight": self.weight}


@dataclass
class Brick:
    """One unique kernel-on-shapes of a model: its key, what it is, and how to run it."""
    key: str
    op_type: str
    domain: str
    attributes: dict[str, Any]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    nodes: list[str] = field(default_factory=list)  # the model's node names that are this brick
    model_bytes: bytes = b""  # the single-node model (the first node's weights)
    feed: dict[str, np.ndarray] = field(default_factory=dict)  # its non-weight inputs, as seen in the model

    @property
    def multiplicity(self) -> int:
        return len(self.nodes)

    @property
    def label(self) -> str:
        """Short text for tables: op and the first input's shape."""
        first = next((t for t in self.inputs if not t.weight), self.inputs[0] if self.inputs else None)
        shape = "x".join(str(d) for d in first.shape) if first is not None else "-"
        op = self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain.rsplit('.', 1)[-1]}.{self.op_type}"
        return f"{op} {shape}"

    def describe(self) -> dict[str, Any]:
        return {"key": self.key, "op_type": self.op_type, "domain": self.domain, "label": self.label,
                "attributes": self.attributes, "inputs": [t.describe() for t in self.inputs],
                "outputs": [t.describe() for t in self.outputs], "multiplicity": self.multiplicity,
                "nodes": list(self.nodes)}


@dataclass
class Decomposition:
    """A model's executed graph as bricks, in execution order of their first node."""
    bricks: list[Brick]
    node_count: int
    optimization_level: str
    intermediates: dict[str, np.ndarray] = field(default_factory=dict)  # every tensor of the capture run
    # Every node in execution order: (node name, brick key, its input names, its output names), so the
    # model can be run again brick by brick (tests/test_bricks.py does, and compares every tensor).
    nodes: list[tuple[str, str, list[str], list[str]]] = field(default_factory=list)

    @property
    def by_key(self) -> dict[str, Brick]:
        return {brick.key: brick for brick in self.bricks}


# -- decomposition ------------------------------------------------------------------------------------

def optimized_graph(graph_path: Path, session_options: Any, providers: Sequence[str], out_path: Path) -> Any:
    """ONNX Runtime's optimized graph of `graph_path` at the options' level, as an onnx ModelProto
    (graph inputs no node reads, left by constant folding, are dropped)."""
    import onnx
    import onnxruntime as ort

    session_options.optimized_model_filepath = str(out_path)
    ort.InferenceSession(str(graph_path), session_options, providers=list(providers))
    model = onnx.load(str(out_path))
    used = {name for node in model.graph.node for name in node.input}
    kept = [value for value in model.graph.input if value.name in used]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model


def _attribute_value(attribute: Any) -> Any:
    """An attribute as canonical JSON-able data; a tensor attribute by its dtype and shape only."""
    from onnx import helper, numpy_helper

    if attribute.type == 4:  # TENSOR: a weight inside the node
        array = numpy_helper.to_array(attribute.t)
        return {"tensor": {"dtype": str(array.dtype), "shape": list(array.shape)}}
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


def brick_key(op_type: str, domain: str, attributes: dict[str, Any], inputs: Iterable[TensorInfo]) -> str:
    """The canonical key: op type and domain, attributes, each input's role, dtype and shape (not names,
    not weight values)."""
    canonical = {"op": op_type, "domain": domain or "", "attributes": attributes,
                 "inputs": [[t.weight, t.dtype, list(t.shape)] for t in inputs]}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _refuse_control_flow(model: Any, where: str) -> None:
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type in _SUBGRAPH_ATTRIBUTE_TYPES:
                raise UserError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): control flow "
                                f"(subgraph attribute {attribute.name!r}) cannot be a brick; bricks are single "
                                f"kernels on fixed shapes")


def capture(model: Any, feeds: Sequence[dict[str, np.ndarray]], session_options: Any,
            providers: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Every tensor of a run of `model` (a ModelProto) on each of `feeds`: the graph's inputs,
    initializers' consumers' inputs and every node output, by name. One session serves every run: for a
    model of large weights (vgg-16's 528 MiB) the copy, serialization and session set-up are most of
    decomposing it, and were paid again for the second samples."""
    import onnx
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    names = [name for node in model.graph.node for name in node.output if name]
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in names)
    session_options.graph_optimization_level = ort_level(AS_EXECUTED)
    session = ort.InferenceSession(exposed.SerializeToString(), session_options, providers=list(providers))
    wanted = {i.name for i in session.get_inputs()}
    captured = []
    for feed in feeds:
        values = dict(zip(names, session.run(names, {k: v for k, v in feed.items() if k in wanted})))
        values.update(feed)
        captured.append(values)
    return captured


def decompose(model: Any, feeds: dict[str, np.ndarray], check_feeds: dict[str, np.ndarray] | None,
              session_options: Callable[[], Any], providers: Sequence[str], level: str, where: str) -> Decomposition:
    """The bricks of an optimized `model` (optimized_graph). `feeds` fix every shape; `check_feeds`
    (other samples at the same shapes) find nodes whose output shape depends on the data, which cannot
    be bricks. A refusal is one line naming the node."""
    _refuse_control_flow(model, where)
    values, *checked = capture(model, [feeds] + ([check_feeds] if check_feeds is not None else []),
                               session_options(), providers)
    if checked:
        _refuse_data_dependent_shapes(model, values, checked[0], where)
    initializers = {init.name: init for init in model.graph.initializer}
    bricks: dict[str, Brick] = {}
    order: list[tuple[str, str, list[str], list[str]]] = []
    for position, node in enumerate(model.graph.node):
        node_name = node.name or f"{node.op_type}_{position}"
        infos, outputs = _node_tensors(node, node_name, initializers, values, where)
        attributes = {a.name: _attribute_value(a) for a in sorted(node.attribute, key=lambda a: a.name)}
        key = brick_key(node.op_type, node.domain, attributes, infos)
        order.append((node_name, key, [name for name in node.input if name], [name for name in node.output if name]))
        if key in bricks:
            bricks[key].nodes.append(node_name)
            continue
        bricks[key] = Brick(key=key, op_type=node.op_type, domain=node.domain, attributes=attributes, inputs=infos,
                            outputs=outputs, nodes=[node_name],
                            model_bytes=_single_node_model(model, node, key, infos, outputs, initializers),
                            feed={t.name: values[t.name] for t in infos if not t.weight})
    return Decomposition(list(bricks.values()), len(model.graph.node), level, values, order)


def _refuse_data_dependent_shapes(model: Any, values: dict[str, np.ndarray], other: dict[str, np.ndarray],
                                  where: str) -> None:
    """A node whose output shape differs between two batches of the same shape cannot be a brick."""
    for node in model.graph.node:
        for name in node.output:
            if name and name in values and name in other and values[name].shape != other[name].shape:
                raise UserError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}): output {name!r} "
                                f"has shape {values[name].shape} for one batch and {other[name].shape} for another; "
                                f"a brick needs shapes that do not depend on the data")


def _node_tensors(node: Any, node_name: str, initializers: dict[str, Any], values: dict[str, np.ndarray],
                  where: str) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """(inputs, outputs) of one node with their dtypes and shapes: a weight's from its initializer,
    any other tensor's from the capture run."""
    from onnx import helper

    infos = []
    for name in node.input:
        if not name:
            continue
        if name in initializers:
            init = initializers[name]
            dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
            infos.append(TensorInfo(name, np.dtype(dtype).name, tuple(int(d) for d in init.dims), weight=True))
        elif name in values:
            array = values[name]
            infos.append(TensorInfo(name, array.dtype.name, tuple(array.shape)))
        else:
            raise UserError(f"{where}: node {node_name!r} ({node.op_type}): input {name!r} has no known shape "
                            f"(it is neither a graph input, a weight nor another node's output)")
    outputs = []
    for name in node.output:
        if not name:
            continue
        if name not in values:
            raise UserError(f"{where}: node {node_name!r} ({node.op_type}): output {name!r} has no known shape")
        outputs.append(TensorInfo(name, values[name].dtype.name, tuple(values[name].shape)))
    return infos, outputs


def _single_node_model(model: Any, node: Any, key: str, infos: list[TensorInfo], outputs: list[TensorInfo],
                       initializers: dict[str, Any]) -> bytes:
    """The node alone as a model: its non-weight inputs the graph's inputs, its weights its own initializers."""
    from onnx import helper

    def value_info(t: TensorInfo) -> Any:
        return helper.make_tensor_value_info(t.name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), t.shape)

    graph = helper.make_graph([node], f"brick_{key}", [value_info(t) for t in infos if not t.weight],
                              [value_info(t) for t in outputs],
                              initializer=[initializers[t.name] for t in infos if t.weight])
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version).SerializeToString()


# -- weights ------------------------------------------------------------------------------------

def tensor_bytes(info: TensorInfo) -> int:
    return int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize


def weight_bytes(brick: Brick) -> int:
    return sum(tensor_bytes(t) for t in brick.inputs if t.weight)


def model_weight_bytes(decomposition: Decomposition) -> int:
    """Every node's weights, each node counted (a brick's multiplicity)."""
    return sum(weight_bytes(b) * b.multiplicity for b in decomposition.bricks)
