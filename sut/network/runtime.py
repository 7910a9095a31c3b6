"""What a run against a server holds on the LoadGen node: the dataset's raw samples (the QSL loads
them, nothing preprocesses them here: the server does, as MLPerf's network division requires), the
labels, and the connection to the server. It has the shape of mlharness.sut.runtime.Runtime where
the runner reads one; its `backend` is the connection (describe, close)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.manifests import DatasetManifest, ModelManifest
from mlharness.sut.network.connection import EndpointConnection
from mlharness.specs.endpoint import Endpoint
from mlharness.sut.network.oip_client import EndpointError
from mlharness.sut.processing import ProcessingContext, compile_function
from mlharness.sut.runtime import describe_sources, enumerate_samples, resolve_sources
from mlharness.sut.staging import SampleError


class RawSamples:
    """The QSL's samples as the dataset loads them (its `load`, if any), held between LoadQuerySamples
    and UnloadQuerySamples; each becomes the request's one input."""

    def __init__(self, items: Sequence[tuple[Any, Any]], load: Any, ctx: ProcessingContext):
        self._items, self._load, self.ctx = items, load, ctx  # ctx: what the loader is given
        self._loaded: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._items)

    def load_samples(self, indices: Sequence[int]) -> None:
        for index in indices:
            if index in self._loaded:
                continue
            sample = self._items[index][0]
            try:
                raw = self._load(sample, self.ctx) if self._load else sample
            except Exception as exc:  # noqa: BLE001 - the user's load function, named with its sample
                raise SampleError([index], "load", exc) from None
            array = np.asarray(raw)  # a scalar stays 0-d (np.ascontiguousarray makes it [1])
            if array.dtype.kind not in "biuf":
                raise SampleError([index], "load", f"returned {array.dtype} data; a run against a server sends "
                                                   "numeric arrays (booleans, integers, floats)")
            # A batch of one (the protocol's leading dim): the server cuts it off again and preprocesses
            # the sample as the dataset gave it, a scalar as a scalar, as a run in this process would.
            self._loaded[index] = np.ascontiguousarray(array.reshape(1, *array.shape))

    def unload_samples(self, indices: Sequence[int]) -> None:
        for index in indices:
            self._loaded.pop(index, None)

    def get(self, index: int) -> np.ndarray:
        try:
            return self._loaded[index]
        except KeyError:
            raise SampleError([index], "staging", "sample was issued but never loaded by LoadQuerySamples") from None

    def labels(self) -> list[Any]:
        return [label for _, label in self._items]


def open_raw_samples(model: ModelManifest, dataset: DatasetManifest, limit: int = 0) -> tuple[RawSamples, dict[str, Any]]:
    """The dataset's samples as a client sends them (its sources resolved, its pairs enumerated, its
    loader compiled, in the model's context; nothing preprocessed), and the resolved sources."""
    sources = resolve_sources(dataset)
    ctx = ProcessingContext(attributes=dict(model.attributes), sources=dict(sources), model=model, dataset=dataset)
    items = enumerate_samples(dataset, ctx, limit)
    load = compile_function(dataset.load, "load", str(dataset.path)) if dataset.load else None
    return RawSamples(items, load, ctx), sources


@dataclass
class EndpointRuntime:
    model: ModelManifest
    dataset: DatasetManifest
    backend: EndpointConnection  # the runner describes and closes it as it does a backend
    staged: RawSamples
    ctx: ProcessingContext
    input_name: str
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    cold_start: dict[str, float] = field(default_factory=dict)
    postprocess: Any = None  # the server postprocesses
    generative = False
    network = True

    @property
    def labels(self) -> list[Any]:
        return self.staged.labels()


def build_endpoint_runtime(model: ModelManifest, dataset: DatasetManifest, endpoint: Endpoint,
                           options: dict[str, Any]) -> EndpointRuntime:
    """Enumerate the dataset, compile its loader, connect to the server and check that it serves the
    model and takes the sample input it declares; each phase timed into cold_start."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    samples, dataset_sources = open_raw_samples(model, dataset, int(options.get("dataset_limit") or 0))
    seconds["enumerate_seconds"] = time.perf_counter() - started
    started = time.perf_counter()
    connection = EndpointConnection(endpoint, str(options.get("endpoint_model") or model.name),
                                    int(options["endpoint_concurrency"]), float(options["endpoint_timeout"]),
                                    float(options["endpoint_connect_timeout"]), bool(options["endpoint_binary"]))
    try:
        info = connection.check()
        if len(info.inputs) != 1:
            raise UserError(f"--endpoint: {endpoint.url}: model {connection.model_name!r} takes "
                            f"{len(info.inputs)} inputs; a run sends each raw sample as one input")
    except BaseException:
        connection.close()
        raise
    seconds["connect_seconds"] = time.perf_counter() - started
    return EndpointRuntime(model, dataset, connection, samples, samples.ctx, info.inputs[0]["name"],
                           describe_sources(dataset, dataset_sources), seconds)


def warm_up_endpoint(runtime: EndpointRuntime, queries: int, seconds: float) -> dict[str, Any]:
    """One sample through the server (its first inference, timed), then `queries` more (at least
    `seconds`): the server's caches and the connection pool are warm when LoadGen starts."""
    connection = runtime.backend
    indices = list(range(min(max(queries, 1), len(runtime.staged))))
    runtime.staged.load_samples(indices)
    timings: list[float] = []
    try:
        deadline = time.perf_counter() + seconds
        count = 0
        while count <= queries or time.perf_counter() < deadline:
            index = indices[count % len(indices)]
            started = time.perf_counter()
            try:
                connection.run(connection.client.infer(connection.model_name, {runtime.input_name: runtime.staged.get(index)},
                                                       f"warmup-{count}"), connection.timeout_s + 1)
            except EndpointError as exc:
                raise UserError(f"--endpoint: warm-up, sample {index}: {exc}") from None
            timings.append(time.perf_counter() - started)
            count += 1
            if queries == 0 and seconds == 0:
                break
    finally:
        runtime.staged.unload_samples(indices)
    return {"first_inference_seconds": round(timings[0], 6), "warmup_requests": len(timings)}
