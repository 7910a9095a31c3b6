"""The DLSpec runtime: from manifests to a loaded backend, staged samples and compiled processing."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from mlharness.errors import UserError
from mlharness.specs import artifacts
from mlharness.specs.manifests import DatasetManifest, HardwareManifest, ModelManifest
from mlharness.sut import backends, conversion  # noqa: F401 - conversion registers the converter
from mlharness.sut.backends.base import Backend
from mlharness.sut.device_staging import staged_samples
from mlharness.sut.processing import ProcessingContext, compile_function
from mlharness.sut.staging import StagedSamples


@dataclass
class Runtime:
    model: ModelManifest
    dataset: DatasetManifest
    backend: Backend
    staged: StagedSamples
    postprocess: Callable[..., Any] | None
    ctx: ProcessingContext
    sources: dict[str, Path] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)  # describe_sources, for the record
    # Seconds each cold-start phase took (resolve, enumerate, compile, load), for the record.
    cold_start: dict[str, float] = field(default_factory=dict)

    @property
    def labels(self) -> list[Any]:
        return self.staged.labels()


def resolve_sources(manifest: Any) -> dict[str, Path]:
    """Every source of a manifest as a verified local file (converted ones made by mlharness.sut.conversion)."""
    return artifacts.resolve_all(manifest)


def describe_sources(manifest: Any, paths: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """What the run record says of each resolved source: its file and sha256 (the manifest's pin, or
    for a converted file the sha256 its conversion recorded, with the provenance file beside it)."""
    described = {}
    for role, path in paths.items():
        artifact = manifest.sources.get(role)
        entry: dict[str, Any] = {"path": str(path), "sha256": getattr(artifact, "sha256", None)}
        if artifact is not None and artifact.convert is not None:
            provenance_path = path.with_name(path.name + ".provenance.json")
            provenance = json.loads(provenance_path.read_text())
            entry.update(sha256=provenance["artifact"]["sha256"], converted=True, provenance=str(provenance_path),
                         check=provenance.get("exporter", {}).get("check"))
        else:
            entry["uri"] = getattr(artifact, "uri", None)
        described[f"{manifest.kind}.{role}"] = entry
    return described


def enumerate_samples(dataset: DatasetManifest, ctx: ProcessingContext, limit: int = 0) -> list[tuple[Any, Any]]:
    """The dataset's (sample, label) pairs, the first `limit` of them (0: all). A limit past the declared
    count is refused before any is read: a run over fewer samples than asked must not pass for one."""
    if limit > dataset.sample_count:
        raise UserError(f"dataset_limit {limit}: {dataset.path} has {dataset.sample_count} samples; expected a "
                        f"limit from 1 to {dataset.sample_count}, or none for the whole dataset")
    samples = compile_function(dataset.samples, "samples", str(dataset.path))
    try:
        items = list(samples(ctx))
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{dataset.path}: samples: raised {type(exc).__name__}: {exc}") from None
    for i, item in enumerate(items[:1]):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise UserError(f"{dataset.path}: samples: item {i}: expected a (sample, label) pair, got {type(item).__name__}")
    if len(items) != dataset.sample_count:
        raise UserError(f"{dataset.path}: sample_count: expected {dataset.sample_count} samples as declared, "
                        f"the samples function gave {len(items)}")
    return items[:limit] if limit else items


@contextmanager
def _timed(seconds: dict[str, float], key: str) -> Iterator[None]:
    """Record the block's wall time (perf_counter) as seconds[key]."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[key] = time.perf_counter() - started


def build_runtime(model: ModelManifest, dataset: DatasetManifest, hardware: HardwareManifest, backend_name: str,
                  options: dict[str, Any]) -> Runtime:
    """Resolve and verify every source, compile the user code, enumerate the dataset, load the backend;
    each phase is timed into Runtime.cold_start (resolving includes any download or conversion)."""
    seconds: dict[str, float] = {}
    with _timed(seconds, "resolve_seconds"):
        model_sources = resolve_sources(model) if backend_name != "null" else {}
        dataset_sources = resolve_sources(dataset)
    ctx = ProcessingContext(attributes=dict(model.attributes), sources={**dataset_sources, **model_sources},
                            model=model, dataset=dataset)
    with _timed(seconds, "enumerate_seconds"):
        items = enumerate_samples(dataset, ctx, int(options.get("dataset_limit") or 0))
    with _timed(seconds, "compile_seconds"):
        load = compile_function(dataset.load, "load", str(dataset.path)) if dataset.load else None
        preprocess = compile_function(model.preprocess, "preprocess", str(model.path)) if model.preprocess else None
        postprocess = compile_function(model.postprocess, "postprocess", str(model.path)) if model.postprocess else None
    with _timed(seconds, "load_seconds"):
        backend = backends.create(backend_name, model=model, sources=model_sources, hardware=hardware, options=options)
        backend.load()
    # On a GPU the backend keeps the staged samples on its device (mlharness.sut.device_staging).
    staged = staged_samples(backend, items, model.inputs, preprocess, load, ctx)
    described = {**describe_sources(dataset, dataset_sources), **describe_sources(model, model_sources)}
    return Runtime(model, dataset, backend, staged, postprocess, ctx, {**dataset_sources, **model_sources}, described,
                   cold_start=seconds)
