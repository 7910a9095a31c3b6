"""A model as `mlharness serve` runs it: the backend loaded, the manifest's preprocess and postprocess
compiled, and one call that takes raw samples (as a client sends them) through preprocess, one
batched predict and the postprocess to result rows checked against the manifest. The server side
of MLPerf's network division: the processing happens here, not on the LoadGen node."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from mlharness.specs.manifests import HardwareManifest, ModelManifest, TensorSpec
from mlharness.sut import backends
from mlharness.sut.processing import ProcessingContext, batch_result_function, compile_function
from mlharness.sut.runtime import resolve_sources
from mlharness.sut.staging import SampleError
from mlharness.sut.system_under_test import ResultContract


@dataclass
class BatchAnswer:
    rows: np.ndarray  # one result row per sample
    preprocess_us: float
    infer_us: float
    postprocess_us: float


@dataclass
class ServedModel:
    model: ModelManifest
    backend: Any
    preprocess: Any
    result_of: Any
    ctx: ProcessingContext
    contract: ResultContract
    max_batch_size: int
    backend_name: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def result_spec(self) -> TensorSpec:
        return self.model.result or self.model.outputs[0]

    def infer(self, samples: Sequence[np.ndarray]) -> BatchAnswer:
        """Each raw sample (a leading batch dim of 1 dropped) preprocessed, one predict over all of them,
        the postprocess, the result checked; a SampleError names the position in the batch."""
        started = time.perf_counter()
        feeds: list[dict[str, np.ndarray]] = []
        for position, sample in enumerate(samples):
            try:
                prepared = self.preprocess(sample[0], self.ctx) if self.preprocess else sample[0]
            except Exception as exc:  # noqa: BLE001 - the user's preprocess on a client's sample
                raise SampleError([position], "preprocess", exc) from None
            if not isinstance(prepared, dict):
                prepared = {self.model.inputs[0].name: prepared}
            feeds.append(prepared)
        batch = {spec.name: np.stack([np.asarray(feed[spec.name], dtype=spec.element_type) for feed in feeds])
                 for spec in self.model.inputs}
        preprocessed = time.perf_counter()
        outputs = self.backend.predict(batch)
        inferred = time.perf_counter()
        result = self.result_of(outputs, self.ctx, batch)
        self.contract.check(result, list(range(len(samples))))
        # A copy: the rows are sent after the next batch has run, and a backend may reuse its output buffers
        # (the null backend does), which would change a sent answer under the client's feet.
        rows = np.array(result, order="C", copy=True)
        done = time.perf_counter()
        return BatchAnswer(rows, (preprocessed - started) * 1e6, (inferred - preprocessed) * 1e6, (done - inferred) * 1e6)


def load_served_model(model: ModelManifest, hardware: HardwareManifest, backend_name: str,
                      options: dict[str, Any]) -> ServedModel:
    """Resolve the model's sources, compile its processing and load the backend (no dataset needed)."""
    sources = resolve_sources(model) if backend_name != "null" else {}
    ctx = ProcessingContext(attributes=dict(model.attributes), sources=dict(sources), model=model, dataset=None)
    preprocess = compile_function(model.preprocess, "preprocess", str(model.path)) if model.preprocess else None
    postprocess = compile_function(model.postprocess, "postprocess", str(model.path)) if model.postprocess else None
    backend = backends.create(backend_name, model=model, sources=sources, hardware=hardware, options=options)
    backend.load()
    max_batch = int(options.get("max_batch_size") or model.attributes.get("max_batch_size", 1))
    if not getattr(backend, "supports_batching", True):
        max_batch = 1
    spec = model.result or model.outputs[0]
    return ServedModel(model, backend, preprocess, batch_result_function(postprocess), ctx, ResultContract(spec),
                       max_batch, backend_name, backend.describe())
