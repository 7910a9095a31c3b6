"""The null backend: outputs of the declared size, zero-filled, without computing anything.
It measures the harness itself (staging, batching, handoff, LoadGen).

Routing mode (the model attribute `route_from_input: INPUT`): each sample's output rows are a
function of that sample's own input, so a response sent back for the wrong sample, dropped or
duplicated changes the accuracy. The input's first value per sample is read as an integer k (the
preprocessed sample index in the null-routed model) and every output row is one-hot at k modulo the
row's size (flattened). Only the routed model pays for it: without the attribute, predict is the
plain zero-filled one."""
from __future__ import annotations

import threading

import numpy as np

from mlharness.errors import UserError
from mlharness.sut.backends.base import Backend


class NullBackend(Backend):
    name = "null"

    def load(self) -> None:
        self._local = threading.local()
        dims = self.model.attributes.get("dims", {})
        self._sample_shapes = {spec.name: tuple(int(dims.get(d, 1)) if isinstance(d, str) else d
                                                for d in spec.sample_shape())
                               for spec in self.model.outputs}
        self._dtypes = {spec.name: np.dtype(spec.element_type) for spec in self.model.outputs}
        route = self.model.attributes.get("route_from_input")
        if route is not None:
            declared = [spec.name for spec in self.model.inputs]
            if route not in declared:
                raise UserError(f"{self.model.path}: attributes.route_from_input: expected one of the declared "
                                f"inputs {declared}, got {route!r}")
            self._route = route
            self._row_sizes = {name: int(np.prod(shape, dtype=np.int64)) for name, shape in self._sample_shapes.items()}
            self.predict = self._predict_routed  # type: ignore[method-assign]  # the plain path stays untouched

    def _buffers(self, batch: int) -> dict[str, np.ndarray]:
        # One zeroed buffer per thread, grown on demand: workers never share outputs.
        buffers = getattr(self._local, "buffers", None)
        if buffers is None or next(iter(buffers.values())).shape[0] < batch:
            buffers = {name: np.zeros((batch, *shape), self._dtypes[name]) for name, shape in self._sample_shapes.items()}
            self._local.buffers = buffers
            self._local.views = {}  # views of the old buffers are stale
        return buffers

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = len(next(iter(inputs.values()))) if inputs else 1
        # The views of each batch size, made once per thread: the null model should cost nothing.
        views = getattr(self._local, "views", None)
        if views is None:
            views = self._local.views = {}
        found = views.get(batch)
        if found is None:
            found = views[batch] = {name: buffer[:batch] for name, buffer in self._buffers(batch).items()}
        return dict(found)  # the caller may change its dict (a postprocess), never the cached one

    def _predict_routed(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        source = np.asarray(inputs[self._route])
        batch = len(source)
        keys = np.rint(source.reshape(batch, -1)[:, 0]).astype(np.int64)
        rows = np.arange(batch)
        outputs = {}
        for name, buffer in self._buffers(batch).items():
            flat = buffer[:batch].reshape(batch, -1)
            flat[...] = 0
            flat[rows, keys % self._row_sizes[name]] = 1
            outputs[name] = buffer[:batch]
        return outputs
