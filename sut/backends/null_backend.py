"""The null backend: outputs of the declared size, zero-filled, without computing anything.
It measures the harness itself (staging, batching, handoff, LoadGen)."""
from __future__ import annotations

import threading

import numpy as np

from sut.backends.base import Backend


class NullBackend(Backend):
    name = "null"

    def load(self) -> None:
        self._local = threading.local()
        dims = self.model.attributes.get("dims", {})
        self._sample_shapes = {spec.name: tuple(int(dims.get(d, 1)) if isinstance(d, str) else d
                                                for d in spec.sample_shape())
                               for spec in self.model.outputs}
        self._dtypes = {spec.name: np.dtype(spec.element_type) for spec in self.model.outputs}

    def _buffers(self, batch: int) -> dict[str, np.ndarray]:
        # One zeroed buffer per thread, grown on demand: workers never share outputs.
        buffers = getattr(self._local, "buffers", None)
        if buffers is None or next(iter(buffers.values())).shape[0] < batch:
            buffers = {name: np.zeros((batch, *shape), self._dtypes[name]) for name, shape in self._sample_shapes.items()}
            self._local.buffers = buffers
        return buffers

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = len(next(iter(inputs.values()))) if inputs else 1
        return {name: buffer[:batch] for name, buffer in self._buffers(batch).items()}
