"""DLSpec manifests: model, dataset, software, hardware, and reference logs. Each is frozen,
validated on load, and carries the sha256 of its file so that every result names what ran."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from mlharness.specs import model_schema, schema, schema_parts

# Re-exported: other modules (and tests) read these here: the schemas' constants, the plugin entry
# points every registry keeps (mlharness.specs.plugins), the names the runtime's registries register.
from mlharness.specs.plugins import PluginEntryPoints, entry_points, load_entry_point  # noqa: F401
from mlharness.specs.schema import (  # noqa: F401
    CODE_REF,
    DECODINGS,
    DEVICE,
    DIM_NAME,
    ELEMENT_TYPES,
    GENERATIVE_FRAMEWORKS,
    SOURCE_ROLES,
)
from mlharness.specs.validation import (  # noqa: F401  (runtime registries register their names here)
    _NAME_SOURCES,
    NAME_OWNERS,
    ManifestError,
    _short,
    known_names,
    load_yaml,
    problems_from,
    register_names,
)


@dataclass(frozen=True)
class Conversion:
    """An artifact made from another model manifest by a recorded export step (mlharness.sut.conversion)."""

    source: str  # the source model manifest's path, relative to the manifest declaring the conversion
    to: str
    opset: int | None = None
    example_dims: tuple[tuple[str, int], ...] = ()  # sizes for symbolic dims in the example inputs

    def describe(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.to, "opset": self.opset, "example_dims": dict(self.example_dims)}


@dataclass(frozen=True)
class Artifact:
    uri: str
    sha256: str | None
    convert: Conversion | None = None  # set when the file is produced by a conversion instead of fetched


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type: str
    element_type: str
    shape: tuple[int | str, ...]
    layout: str | None = None

    def sample_shape(self) -> tuple[int | str, ...]:
        """The shape of one sample: the declared shape without its leading batch dimension."""
        return self.shape[1:] if self.shape and self.shape[0] == "batch" else self.shape


@dataclass(frozen=True)
class Manifest:
    kind: str
    name: str
    version: str
    path: Path
    sha256: str
    doc: dict[str, Any] = field(repr=False, compare=False)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def identity(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "path": str(self.path)}


@dataclass(frozen=True)
class GenerationSpec:
    """How a generative model (a causal LM) answers a prompt: `generation:` of a model manifest."""

    max_new_tokens: int
    decoding: str = "greedy"  # the only decoding built so far; seeded sampling is not
    chat_template: bool = True  # wrap each prompt in the tokenizer's chat template as one user turn
    system_prompt: str | None = None  # the system turn; None: the template's own default
    stop: tuple[str, ...] = ()  # stop strings besides the tokenizer's end-of-sequence token
    context_window: int | None = None  # tokens; None: the model's own (max_position_embeddings)

    def describe(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "decoding": self.decoding, "chat_template": self.chat_template,
                "system_prompt": self.system_prompt, "stop": list(self.stop), "context_window": self.context_window}


@dataclass(frozen=True)
class ModelManifest(Manifest):
    description: str = ""
    framework: str = ""
    framework_version: str = ""
    mlperf_benchmark: str | None = None
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    result: TensorSpec | None = None
    sources: dict[str, Artifact] = field(default_factory=dict)
    factory: str | None = None
    graph_transforms: tuple[str, ...] = ()
    preprocess: str | None = None
    postprocess: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    default_dataset: str | None = None
    generation: GenerationSpec | None = None  # set for a generative model (a causal LM, mlharness.sut.llm)


@dataclass(frozen=True)
class DatasetManifest(Manifest):
    description: str = ""
    sources: dict[str, Artifact] = field(default_factory=dict)
    samples: str = ""
    load: str | None = None
    sample_count: int = 0
    evaluation: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)  # hints for user code, e.g. max_tokens
    max_new_tokens: int | None = None  # generation.max_new_tokens: replaces a generative model's own


@dataclass(frozen=True)
class SoftwareManifest(Manifest):
    packages: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorRTOptions:
    """ONNX Runtime's TensorRT execution provider, as a hardware manifest's `tensorrt:` asks for it."""

    enabled: bool = True
    fp16: bool = False
    engine_cache: str | None = None  # folder for built engines (resolved); None: build them every load

    def describe(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "fp16": self.fp16, "engine_cache": self.engine_cache}


@dataclass(frozen=True)
class HardwareManifest(Manifest):
    device: str = "cpu"
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    cpu_affinity: tuple[int, ...] | None = None
    tensorrt: TensorRTOptions | None = None


@dataclass(frozen=True)
class ReferenceLog(Manifest):
    model: dict[str, str] = field(default_factory=dict)
    dataset: dict[str, str] = field(default_factory=dict)
    backend: str = ""
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)
    performance: dict[str, dict[str, float]] = field(default_factory=dict)
    outputs: tuple[dict[str, Any], ...] = ()


# -- from a validated document (mlharness.specs.schema and model_schema) to the frozen manifest the runtime uses -----------------

def _artifact(doc: schema_parts.Artifact) -> Artifact:
    if doc.convert is not None:
        c = doc.convert
        return Artifact("", None, Conversion(c.source, c.to, c.opset, tuple(sorted(c.example_dims.items()))))
    return Artifact(doc.uri or "", doc.sha256)


def _tensor(doc: schema_parts.Tensor) -> TensorSpec:
    return TensorSpec(doc.name, doc.type, doc.element_type, tuple(doc.shape), doc.layout)


def _metric(doc: schema_parts.Metric | None) -> dict[str, Any]:
    return doc.model_dump() if doc is not None else {}  # a metric and its own options (no aliases)


def build_model(doc: model_schema.ModelDoc, raw: dict, path: Path, sha: str) -> ModelManifest:
    src = doc.sources or model_schema.Sources()
    sources = {key: _artifact(art) for key, art in (("graph", src.graph), ("weights", src.weights),
                                                     ("torchscript", src.torchscript)) if art is not None}
    sources.update({key: _artifact(art) for key, art in src.files.items()})
    gen = doc.generation
    return ModelManifest(
        kind="model", name=doc.name, version=doc.version, path=path, sha256=sha, doc=raw,
        description=doc.description, framework=doc.framework.name, framework_version=doc.framework.version,
        mlperf_benchmark=doc.mlperf_benchmark, inputs=tuple(map(_tensor, doc.inputs)),
        outputs=tuple(map(_tensor, doc.outputs)), result=_tensor(doc.result) if doc.result else None,
        sources=sources, factory=src.module.factory if src.module else None,
        graph_transforms=tuple(src.graph.transforms or ()) if src.graph else (),
        preprocess=doc.preprocess, postprocess=doc.postprocess, attributes=dict(doc.attributes),
        accuracy=_metric(doc.accuracy), default_dataset=doc.dataset,
        generation=GenerationSpec(max_new_tokens=gen.max_new_tokens, decoding=gen.decoding,
                                  chat_template=gen.chat_template, system_prompt=gen.system_prompt,
                                  stop=tuple(gen.stop), context_window=gen.context_window) if gen else None)


def build_dataset(doc: schema.DatasetDoc, raw: dict, path: Path, sha: str) -> DatasetManifest:
    return DatasetManifest(
        kind="dataset", name=doc.name, version=doc.version, path=path, sha256=sha, doc=raw,
        description=doc.description, sources={str(key): _artifact(art) for key, art in doc.sources.items()},
        samples=doc.samples, load=doc.load, sample_count=doc.sample_count, evaluation=_metric(doc.evaluation),
        attributes=dict(doc.attributes),
        max_new_tokens=doc.generation.max_new_tokens if doc.generation is not None else None)


def build_software(doc: schema.SoftwareDoc, raw: dict, path: Path, sha: str) -> SoftwareManifest:
    return SoftwareManifest(
        kind="software", name=doc.name, version=doc.version, path=path, sha256=sha, doc=raw,
        packages={str(k): str(v or "") for k, v in doc.packages.items()},
        environment={str(k): str(v) for k, v in doc.environment.items()})


def build_hardware(doc: schema.HardwareDoc, raw: dict, path: Path, sha: str) -> HardwareManifest:
    tensorrt = None
    if doc.tensorrt is not None:
        folder = Path(doc.tensorrt.engine_cache).expanduser() if doc.tensorrt.engine_cache else None
        if folder is not None and not folder.is_absolute():
            folder = path.parent / folder  # relative to the manifest, as every path in a manifest is
        tensorrt = TensorRTOptions(enabled=doc.tensorrt.enabled, fp16=doc.tensorrt.fp16,
                                   engine_cache=str(folder) if folder else None)
    return HardwareManifest(
        kind="hardware", name=doc.name, version=doc.version, path=path, sha256=sha, doc=raw, device=doc.device,
        intra_op_threads=doc.intra_op_threads, inter_op_threads=doc.inter_op_threads,
        cpu_affinity=tuple(doc.cpu_affinity) if doc.cpu_affinity else None, tensorrt=tensorrt)


def build_reference(doc: schema.ReferenceDoc, raw: dict, path: Path, sha: str) -> ReferenceLog:
    return ReferenceLog(
        kind="reference", name=doc.name, version=doc.version, path=path, sha256=sha, doc=raw,
        model=doc.model.model_dump(exclude_none=True), dataset=doc.dataset.model_dump(exclude_none=True),
        backend=doc.backend,
        accuracy={k: {"expected": v.expected_value, **({"tolerance": v.tolerance} if v.min_fraction is None
                                                          else {"min_fraction": v.min_fraction})}
                  for k, v in doc.accuracy.items()},
        performance=dict(doc.performance), outputs=tuple(raw.get("outputs") or ()))


BUILDERS: dict[str, Callable[[Any, dict, Path, str], Any]] = {
    "model": build_model, "dataset": build_dataset, "software": build_software, "hardware": build_hardware,
    "reference": build_reference}


def parse(kind: str, doc: Any, path: Path, sha: str) -> Any:
    """Validate `doc` against `kind`'s schema (every problem at once, one line each) and build its manifest."""
    root = schema.SCHEMAS[kind]
    try:
        valid = root.model_validate(doc)
    except ValidationError as exc:
        raise ManifestError(problems_from(exc, str(path), root, doc)) from None
    return BUILDERS[kind](valid, doc, path, sha)


def load_manifest(path: Path | str, kind: str | None = None) -> Any:
    """Load and validate one manifest file; its `kind` field picks the schema unless `kind` is given."""
    path = Path(path)
    doc = load_yaml(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    wanted = kind or (doc.get("kind") if isinstance(doc, dict) else None)
    if not isinstance(wanted, str) or wanted not in schema.SCHEMAS:
        got = doc.get("kind") if isinstance(doc, dict) else doc
        raise ManifestError([f"{path}: kind: expected one of {sorted(schema.SCHEMAS)}, got {_short(got)}"])
    return parse(wanted, doc, path, sha)
