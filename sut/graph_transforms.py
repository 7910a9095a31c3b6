"""Named, recorded rewrites of ONNX graphs, applied when a backend loads a model. The rewritten
graph is cached by the source's sha256 and the transform names, and its own sha256 is recorded."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

from mlharness.atomic_io import write_bytes
from mlharness.errors import UserError, require

Transform = Callable[[Any], None]
_TRANSFORMS: dict[str, Transform] = {}


def transform(name: str) -> Callable[[Transform], Transform]:
    def register(func: Transform) -> Transform:
        _TRANSFORMS[name] = func
        return func
    return register


@transform("symbolic_batch")
def symbolic_batch(model: Any) -> None:
    """Make dim 0 of the graph's inputs and outputs symbolic (`batch`) and let Reshape nodes that
    hard-code a batch of 1 infer it (-1), so a graph exported at batch 1 runs at any batch size."""
    import numpy as np
    from onnx import numpy_helper

    initializer_names = {init.name for init in model.graph.initializer}
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name in initializer_names:
            continue
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "batch"
    shapes = {node.input[1] for node in model.graph.node if node.op_type == "Reshape" and len(node.input) > 1}
    for init in model.graph.initializer:
        if init.name in shapes:
            target = numpy_helper.to_array(init)
            if target.ndim == 1 and target.size and target[0] == 1:
                target = target.copy()
                target[0] = -1
                init.CopyFrom(numpy_helper.from_array(target.astype(np.int64), init.name))


def apply_transforms(graph_path: Path, source_sha: str, names: tuple[str, ...], cache: Path,
                     where: str = "sources.graph") -> tuple[Path, str]:
    """The path and sha256 of the graph after `names` are applied (the input when there are none).
    `where` (the manifest and its field) starts the one-line error for a graph that will not read."""
    if not names:
        return graph_path, source_sha
    unknown = [n for n in names if n not in _TRANSFORMS]
    if unknown:
        raise UserError(f"sources.graph.transforms: unknown {unknown} (known: {sorted(_TRANSFORMS)})")
    key = hashlib.sha256(f"{source_sha}:{','.join(names)}".encode()).hexdigest()[:20]
    out = cache / "graphs" / f"{graph_path.stem}.{key}.onnx"
    if not out.is_file():
        onnx = require("onnx", "onnxruntime", f"the graph transforms {', '.join(names)}")
        try:
            model = onnx.load(str(graph_path))
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, onnx's own errors: a file that is no graph
            raise UserError(f"{where}: {graph_path} is not an ONNX model ({_first_line(exc)})") from None
        for name in names:
            try:
                _TRANSFORMS[name](model)
            except Exception as exc:  # noqa: BLE001 - a graph of a shape the transform does not know
                raise UserError(f"{where}: transform {name} cannot rewrite {graph_path}: {_first_line(exc)}") from None
        write_bytes(out, model.SerializeToString())
    return out, hashlib.sha256(out.read_bytes()).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
