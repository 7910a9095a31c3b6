"""DLSpec manifests: model, dataset, software, hardware, and reference logs. Each is frozen,
validated on load, and carries the sha256 of its file so that every result names what ran."""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.errors import UserError
from specs.validation import NAME, SEMVER, SHA256, Checker, load_yaml

ELEMENT_TYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
CODE_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DIM_NAME = re.compile(r"^[A-Za-z_]\w*$")
SOURCE_ROLES = ("graph", "weights", "module", "torchscript", "files")


# -- names the runtime owns ------------------------------------------------------------------------
# The spec layer checks names that runtime registries own (framework names: sut.backends; conversion
# targets: sut.conversion). Each owner registers a function returning its current names; until one
# has, the owner is imported by name when a manifest first needs the names (the owners register
# names only and import no framework), so that the spec layer never imports the runtime itself.
NAME_OWNERS = {"framework": "sut.backends", "conversion target": "sut.conversion"}
_NAME_SOURCES: dict[str, Callable[[], list[str]]] = {}


def register_names(kind: str, source: Callable[[], list[str]]) -> None:
    """The runtime's registry of `kind` (a key of NAME_OWNERS) hands the spec layer its names."""
    _NAME_SOURCES[kind] = source


def known_names(kind: str) -> list[str]:
    """The names a manifest may use for `kind`, asked of the registry that owns them."""
    if kind not in _NAME_SOURCES:
        importlib.import_module(NAME_OWNERS[kind])  # registers its source
    return list(_NAME_SOURCES[kind]())


# -- entry points (third-party backends, metrics, tracers, in the manner of pyperf's hooks) --------

def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The installed distributions' entry points of `group` by name; nothing is imported."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


class PluginEntryPoints:
    """A registry's entry points: read at first call (nothing imported), without the names the
    registry has built in; each registry (backends, metrics, tracers) keeps one."""

    def __init__(self, group: str, builtin: Mapping[str, Any]):
        self.group = group
        self._builtin = builtin
        self._found: dict[str, importlib.metadata.EntryPoint] | None = None

    def __call__(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._found is None:
            self._found = {name: ep for name, ep in entry_points(self.group).items() if name not in self._builtin}
        return self._found


def load_entry_point(ep: importlib.metadata.EntryPoint) -> Any:
    """The object an entry point names; a plugin that cannot load is a one-line UserError naming it."""
    dist = getattr(ep, "dist", None)
    owner = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    try:
        return ep.load()
    except Exception as exc:  # an import error or any error raised while importing the plugin
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(f"entry point {ep.group}:{ep.name} = {ep.value} (from {owner}) cannot be loaded: "
                        f"{type(exc).__name__}: {detail}") from None


@dataclass(frozen=True)
class Conversion:
    """An artifact made from another model manifest by a recorded export step (sut.conversion)."""

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
    generation: GenerationSpec | None = None  # set for a generative model (a causal LM, sut.llm)


@dataclass(frozen=True)
class DatasetManifest(Manifest):
    description: str = ""
    sources: dict[str, Artifact] = field(default_factory=dict)
    samples: str = ""
    load: str | None = None
    sample_count: int = 0
    evaluation: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)  # hints for user code, e.g. max_tokens


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


def _common(check: Checker, doc: Any, kind: str) -> tuple[str, str]:
    if not isinstance(doc, dict):
        check.fail("", f"a mapping with kind: {kind}", doc)
        return "", ""
    got_kind = doc.get("kind")
    if got_kind != kind:
        check.fail("kind", repr(kind), got_kind)
    name = check.pattern(doc, "name", "", NAME, "a name of letters, digits, '.', '_' or '-'") or ""
    version = check.pattern(doc, "version", "", SEMVER, "a semantic version such as 1.0.0") or ""
    return name, version


def _artifact(check: Checker, doc: Any, path: str) -> Artifact | None:
    if isinstance(doc, str):
        check.fail(path, "a mapping {uri, sha256}", doc)
        return None
    if not isinstance(doc, dict):
        check.fail(path, "a mapping {uri, sha256}", doc)
        return None
    check.unknown_keys(doc, path, ("uri", "sha256", "transforms", "convert"))
    if "convert" in doc:
        if "sha256" in doc:
            # A conversion's bytes depend on the CPU's float kernels (weight folding), so they cannot be
            # pinned; the conversion's output check against the source is the gate, its sha256 is recorded.
            check.fail(f"{path}.sha256", "no sha256 on a converted artifact (its bytes depend on the machine; "
                       "the conversion's output check verifies it and the run records its sha256)", doc["sha256"])
        if "uri" in doc:
            check.fail(f"{path}.uri", "either uri or convert, not both", doc["uri"])
        conversion = _conversion(check, doc["convert"], f"{path}.convert")
        return Artifact("", None, conversion) if conversion else None
    sha = check.pattern(doc, "sha256", path, SHA256, "64 lowercase hex digits (sha256)")
    uri = check.get(doc, "uri", path, str, "a path, file://, package:// or https:// URI")
    return Artifact(uri, sha) if uri else None


def _conversion(check: Checker, doc: Any, path: str) -> Conversion | None:
    if not isinstance(doc, dict):
        check.fail(path, "a mapping {from, to, opset, example_dims}", doc)
        return None
    check.unknown_keys(doc, path, ("from", "to", "opset", "example_dims"))
    source = check.get(doc, "from", path, str, "the source model manifest's path, relative to this file")
    to = check.one_of(doc, "to", path, known_names("conversion target"))
    opset = check.get(doc, "opset", path, int, "an ONNX opset number such as 17", False)
    if opset is not None and not 7 <= opset <= 30:
        check.fail(f"{path}.opset", "an ONNX opset number between 7 and 30", opset)
    dims = check.get(doc, "example_dims", path, dict, "a mapping symbolic dim -> example size", False, {}) or {}
    for dim, size in dims.items():
        if not (isinstance(dim, str) and DIM_NAME.match(dim)) or isinstance(size, bool) or not isinstance(size, int) \
                or size <= 0:
            check.fail(f"{path}.example_dims.{dim}", "a symbolic dim name mapped to a positive size", size)
    if not source or not to:
        return None
    return Conversion(source, to, opset, tuple(sorted((str(k), int(v)) for k, v in dims.items() if isinstance(v, int))))


def _code(check: Checker, doc: dict, key: str, path: str, required: bool) -> str | None:
    value = check.get(doc, key, path, str, "inline Python source or module:function", required)
    if value is None:
        return None
    if "\n" not in value and not CODE_REF.match(value.strip()):
        check.fail(f"{path}.{key}" if path else key, "inline Python source (several lines) or module:function", value)
        return None
    return value


def _tensor(check: Checker, doc: Any, path: str) -> TensorSpec | None:
    if not isinstance(doc, dict):
        check.fail(path, "a mapping {name, type, element_type, shape, layout}", doc)
        return None
    check.unknown_keys(doc, path, ("name", "type", "element_type", "shape", "layout"))
    name = check.get(doc, "name", path, str, "a tensor name") or ""
    kind = check.get(doc, "type", path, str, "a tensor type such as image, tokens, probabilities", False, "tensor")
    dtype = check.one_of(doc, "element_type", path, ELEMENT_TYPES) or "float32"
    shape = check.get(doc, "shape", path, list, "a list of sizes and symbolic dims such as [batch, 3, 224, 224]")
    dims: list[int | str] = []
    for i, dim in enumerate(shape or []):
        if isinstance(dim, bool) or not (isinstance(dim, int) and dim > 0 or isinstance(dim, str) and DIM_NAME.match(dim)):
            check.fail(f"{path}.shape[{i}]", "a positive size or a symbolic dim name", dim)
        else:
            dims.append(dim)
    layout = check.get(doc, "layout", path, str, "a layout such as NCHW", False)
    return TensorSpec(name, kind, dtype, tuple(dims), layout)


def _tensors(check: Checker, doc: dict, key: str) -> tuple[TensorSpec, ...]:
    items = check.get(doc, key, "", list, "a non-empty list of tensors")
    if items == []:
        check.fail(key, "a non-empty list of tensors", items)
    found = [_tensor(check, item, f"{key}[{i}]") for i, item in enumerate(items or [])]
    return tuple(t for t in found if t is not None)


def parse_model(doc: Any, path: Path, sha: str) -> ModelManifest:
    check = Checker(str(path))
    name, version = _common(check, doc, "model")
    doc = doc if isinstance(doc, dict) else {}
    check.unknown_keys(doc, "", (
        "kind", "name", "version", "description", "framework", "mlperf_benchmark", "inputs", "outputs",
        "result", "sources", "preprocess", "postprocess", "attributes", "accuracy", "dataset", "generation"))
    framework = check.get(doc, "framework", "", dict, "a mapping {name, version}") or {}
    check.unknown_keys(framework, "framework", ("name", "version"))
    fw_name = check.one_of(framework, "name", "framework", known_names("framework")) if isinstance(doc.get("framework"), dict) else ""
    fw_version = check.get(framework, "version", "framework", str, "a version constraint such as '>=1.17'", False, "")
    if fw_version:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(fw_version)
        except InvalidSpecifier:
            check.fail("framework.version", "a version constraint such as '>=1.17'", fw_version)
    inputs = _tensors(check, doc, "inputs")
    outputs = _tensors(check, doc, "outputs")
    result = _tensor(check, doc["result"], "result") if doc.get("result") is not None else None
    sources_doc = check.get(doc, "sources", "", dict, "a mapping of sources (graph, weights, module, torchscript, files)",
                            required=fw_name != "null", default={}) or {}
    check.unknown_keys(sources_doc, "sources", ("graph", "weights", "module", "torchscript", "files"))
    sources: dict[str, Artifact] = {}
    transforms: tuple[str, ...] = ()
    for key in ("graph", "weights", "torchscript"):
        if key in sources_doc:
            art = _artifact(check, sources_doc[key], f"sources.{key}")
            if art:
                sources[key] = art
    # Named extra files user code reads as ctx.sources[name] (a tokenizer, a config), verified like the rest.
    files = check.get(sources_doc, "files", "sources", dict, "a mapping name -> {uri, sha256}", False, {}) or {}
    for key, value in files.items():
        if key in SOURCE_ROLES or not (isinstance(key, str) and DIM_NAME.match(key)):
            check.fail(f"sources.files.{key}", f"a file name of letters, digits and '_', not one of {list(SOURCE_ROLES)}")
            continue
        art = _artifact(check, value, f"sources.files.{key}")
        if art:
            sources[key] = art
    if isinstance(sources_doc.get("graph"), dict):
        raw = sources_doc["graph"].get("transforms") or []
        if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
            check.fail("sources.graph.transforms", "a list of transform names", raw)
        else:
            transforms = tuple(raw)
    factory = None
    if "module" in sources_doc:
        module = sources_doc["module"]
        if not isinstance(module, dict):
            check.fail("sources.module", "a mapping {factory}", module)
        else:
            check.unknown_keys(module, "sources.module", ("factory",))
            factory = _code(check, module, "factory", "sources.module", True)
    if fw_name == "onnxruntime" and "graph" not in sources_doc:
        check.fail("sources.graph", "an ONNX graph {uri, sha256} for framework onnxruntime")
    if fw_name == "torch" and not (factory or "torchscript" in sources_doc):
        check.fail("sources.module", "a module factory (with weights) or sources.torchscript for framework torch")
    generation = _generation(check, doc, fw_name or "", sources_doc)
    attributes = check.get(doc, "attributes", "", dict, "a mapping", False, {}) or {}
    accuracy = check.get(doc, "accuracy", "", dict, "a mapping {metric, ...}", False, {}) or {}
    if accuracy:
        check.get(accuracy, "metric", "accuracy", str, "a metric name such as topk")
    return _done(check, ModelManifest(
        kind="model", name=name, version=version, path=path, sha256=sha, doc=doc,
        description=check.get(doc, "description", "", str, "a description", False, "") or "",
        framework=fw_name or "", framework_version=fw_version or "",
        mlperf_benchmark=check.get(doc, "mlperf_benchmark", "", str, "an MLPerf benchmark name", False),
        inputs=inputs, outputs=outputs, result=result, sources=sources, factory=factory,
        graph_transforms=transforms,
        preprocess=_code(check, doc, "preprocess", "", False),
        postprocess=_code(check, doc, "postprocess", "", False),
        attributes=attributes, accuracy=accuracy,
        default_dataset=check.get(doc, "dataset", "", str, "a default dataset name", False),
        generation=generation))


# -- generative models (issue 19) ------------------------------------------------------------------
GENERATIVE_FRAMEWORKS = ("transformers", "llama_cpp")  # backends that generate tokens (sut.llm); they need `generation:`
DECODINGS = ("greedy",)


def _generation(check: Checker, doc: dict, fw_name: str, sources_doc: dict) -> GenerationSpec | None:
    """`generation: {max_new_tokens, decoding, chat_template, system_prompt, stop, context_window}`;
    required by (and only allowed with) a generative framework, which also needs sources.weights."""
    raw = doc.get("generation")
    generative = fw_name in GENERATIVE_FRAMEWORKS
    if generative and "weights" not in sources_doc:
        check.fail("sources.weights", f"the model's weights {{uri, sha256}} (a GGUF file) for framework {fw_name}")
    if raw is None:
        if generative:
            check.fail("generation", f"a mapping {{max_new_tokens, decoding, ...}} for framework {fw_name}")
        return None
    if not generative:
        check.fail("generation", f"no generation settings for framework {fw_name or '?'} "
                   f"(generative frameworks: {', '.join(GENERATIVE_FRAMEWORKS)})", "a mapping")
        return None
    if not isinstance(raw, dict):
        check.fail("generation", "a mapping {max_new_tokens, decoding, chat_template, system_prompt, stop, "
                   "context_window}", raw)
        return None
    check.unknown_keys(raw, "generation", ("max_new_tokens", "decoding", "chat_template", "system_prompt", "stop",
                                           "context_window"))
    max_new = check.get(raw, "max_new_tokens", "generation", int, "a positive token count")
    if max_new is not None and max_new <= 0:
        check.fail("generation.max_new_tokens", "a positive token count", max_new)
    decoding = raw.get("decoding", "greedy")
    if decoding not in DECODINGS:
        check.fail("generation.decoding", "'greedy' (seeded sampling is not built yet)", decoding)
    chat = check.get(raw, "chat_template", "generation", bool, "true or false", False, True)
    system = check.get(raw, "system_prompt", "generation", str, "the text of the system turn", False)
    stop = check.get(raw, "stop", "generation", list, "a list of stop strings", False, []) or []
    if not all(isinstance(item, str) and item for item in stop):
        check.fail("generation.stop", "a list of non-empty stop strings", stop)
    window = check.get(raw, "context_window", "generation", int, "a positive token count", False)
    if window is not None and window <= 0:
        check.fail("generation.context_window", "a positive token count", window)
    if window is not None and max_new is not None and 0 < window <= max_new:
        check.fail("generation.context_window", f"more tokens than max_new_tokens ({max_new})", window)
    if max_new is None or max_new <= 0 or decoding not in DECODINGS:
        return None
    return GenerationSpec(max_new_tokens=max_new, decoding=str(decoding), chat_template=bool(chat),
                          system_prompt=system, stop=tuple(s for s in stop if isinstance(s, str)),
                          context_window=window)


def parse_dataset(doc: Any, path: Path, sha: str) -> DatasetManifest:
    check = Checker(str(path))
    name, version = _common(check, doc, "dataset")
    doc = doc if isinstance(doc, dict) else {}
    check.unknown_keys(doc, "", ("kind", "name", "version", "description", "sources", "samples", "load",
                                 "sample_count", "evaluation", "attributes"))
    sources_doc = check.get(doc, "sources", "", dict, "a mapping name -> {uri, sha256}", False, {}) or {}
    sources = {}
    for key, value in sources_doc.items():
        art = _artifact(check, value, f"sources.{key}")
        if art:
            sources[str(key)] = art
    count = check.get(doc, "sample_count", "", int, "a positive integer")
    if count is not None and count <= 0:
        check.fail("sample_count", "a positive integer", count)
    evaluation = check.get(doc, "evaluation", "", dict, "a mapping {metric, ...}", False, {}) or {}
    if evaluation:
        check.get(evaluation, "metric", "evaluation", str, "a metric name")
    return _done(check, DatasetManifest(
        kind="dataset", name=name, version=version, path=path, sha256=sha, doc=doc,
        description=check.get(doc, "description", "", str, "a description", False, "") or "",
        sources=sources, samples=_code(check, doc, "samples", "", True) or "",
        load=_code(check, doc, "load", "", False), sample_count=count or 0, evaluation=evaluation,
        attributes=check.get(doc, "attributes", "", dict, "a mapping", False, {}) or {}))


def parse_software(doc: Any, path: Path, sha: str) -> SoftwareManifest:
    check = Checker(str(path))
    name, version = _common(check, doc, "software")
    doc = doc if isinstance(doc, dict) else {}
    check.unknown_keys(doc, "", ("kind", "name", "version", "description", "packages", "environment"))
    packages = check.get(doc, "packages", "", dict, "a mapping package -> version constraint", False, {}) or {}
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for pkg, spec in packages.items():
        try:
            SpecifierSet(str(spec) if spec is not None else "")
        except InvalidSpecifier:
            check.fail(f"packages.{pkg}", "a version constraint such as '==1.31.1' or '>=2.0'", spec)
    env = check.get(doc, "environment", "", dict, "a mapping VAR -> value", False, {}) or {}
    return _done(check, SoftwareManifest(
        kind="software", name=name, version=version, path=path, sha256=sha, doc=doc,
        packages={str(k): str(v or "") for k, v in packages.items()},
        environment={str(k): str(v) for k, v in env.items()}))


DEVICE = re.compile(r"^(cpu|cuda:\d+)$")


def parse_hardware(doc: Any, path: Path, sha: str) -> HardwareManifest:
    check = Checker(str(path))
    name, version = _common(check, doc, "hardware")
    doc = doc if isinstance(doc, dict) else {}
    check.unknown_keys(doc, "", ("kind", "name", "version", "description", "device", "intra_op_threads",
                                 "inter_op_threads", "cpu_affinity", "system", "tensorrt"))
    device = check.pattern(doc, "device", "", DEVICE, "cpu or cuda:N") or "cpu"
    threads = {}
    for key in ("intra_op_threads", "inter_op_threads"):
        value = check.get(doc, key, "", int, "a thread count >= 0 (0 = automatic)", False, 0)
        if value is not None and value < 0:
            check.fail(key, "a thread count >= 0 (0 = automatic)", value)
        threads[key] = value or 0
    affinity = check.get(doc, "cpu_affinity", "", list, "a list of CPU indices", False)
    if affinity is not None and not all(isinstance(c, int) and c >= 0 for c in affinity):
        check.fail("cpu_affinity", "a list of CPU indices", affinity)
    return _done(check, HardwareManifest(
        kind="hardware", name=name, version=version, path=path, sha256=sha, doc=doc, device=device,
        cpu_affinity=tuple(affinity) if affinity else None, tensorrt=_tensorrt(check, doc, path, device),
        **threads))


def _tensorrt(check: Checker, doc: dict, path: Path, device: str) -> TensorRTOptions | None:
    """`tensorrt: {enabled, fp16, engine_cache}`: the onnxruntime backend's TensorRT provider on a cuda device."""
    raw = doc.get("tensorrt")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        check.fail("tensorrt", "a mapping {enabled, fp16, engine_cache}", raw)
        return None
    check.unknown_keys(raw, "tensorrt", ("enabled", "fp16", "engine_cache"))
    enabled = check.get(raw, "enabled", "tensorrt", bool, "true or false", False, True)
    fp16 = check.get(raw, "fp16", "tensorrt", bool, "true or false", False, False)
    cache = check.get(raw, "engine_cache", "tensorrt", str, "a folder for built engines (relative to this file)",
                      False)
    if cache is not None and not cache.strip():
        check.fail("tensorrt.engine_cache", "a folder for built engines (relative to this file)", cache)
        cache = None
    if enabled and not device.startswith("cuda:"):
        check.fail("tensorrt.enabled", f"false on device {device} (TensorRT runs on a cuda:N device)", enabled)
    folder = Path(cache).expanduser() if cache else None
    if folder is not None and not folder.is_absolute():
        folder = path.parent / folder
    return TensorRTOptions(enabled=bool(enabled), fp16=bool(fp16), engine_cache=str(folder) if folder else None)


def parse_reference(doc: Any, path: Path, sha: str) -> ReferenceLog:
    check = Checker(str(path))
    name, version = _common(check, doc, "reference")
    doc = doc if isinstance(doc, dict) else {}
    check.unknown_keys(doc, "", ("kind", "name", "version", "description", "model", "dataset", "backend",
                                 "accuracy", "performance", "outputs"))
    idents = {}
    for key in ("model", "dataset"):
        ident = check.get(doc, key, "", dict, "a mapping {name, version, sha256}") or {}
        check.get(ident, "name", key, str, "a manifest name")
        check.pattern(ident, "version", key, SEMVER, "a semantic version")
        check.pattern(ident, "sha256", key, SHA256, "the manifest's content sha256", required=False)
        idents[key] = {str(k): str(v) for k, v in ident.items()}
    accuracy = check.get(doc, "accuracy", "", dict, "a mapping metric -> {expected, tolerance}", False, {}) or {}
    for metric, spec in accuracy.items():
        check.get(spec, "expected", f"accuracy.{metric}", float, "a number")
        check.get(spec, "tolerance", f"accuracy.{metric}", float, "a number >= 0")
    performance = check.get(doc, "performance", "", dict, "a mapping scenario -> figures", False, {}) or {}
    outputs = check.get(doc, "outputs", "", list, "a list of {sample, values, atol}", False, []) or []
    for i, item in enumerate(outputs):
        check.get(item, "sample", f"outputs[{i}]", int, "a sample index")
        check.get(item, "values", f"outputs[{i}]", list, "a list of expected values")
    return _done(check, ReferenceLog(
        kind="reference", name=name, version=version, path=path, sha256=sha, doc=doc,
        model=idents["model"], dataset=idents["dataset"],
        backend=check.get(doc, "backend", "", str, "a backend name") or "",
        accuracy={k: {"expected": float(v.get("expected", 0)), "tolerance": float(v.get("tolerance", 0))}
                  for k, v in accuracy.items() if isinstance(v, dict) and not check.problems},
        performance=performance, outputs=tuple(outputs)))


PARSERS = {"model": parse_model, "dataset": parse_dataset, "software": parse_software,
           "hardware": parse_hardware, "reference": parse_reference}


def _done(check: Checker, manifest: Manifest) -> Any:
    check.raise_if_any()
    return manifest


def load_manifest(path: Path | str, kind: str | None = None) -> Any:
    """Load and validate one manifest file; its `kind` field picks the parser unless `kind` is given."""
    path = Path(path)
    doc = load_yaml(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    wanted = kind or (doc.get("kind") if isinstance(doc, dict) else None)
    parser = PARSERS.get(wanted) if isinstance(wanted, str) else None
    if parser is None:
        check = Checker(str(path))
        check.fail("kind", f"one of {sorted(PARSERS)}", doc.get("kind") if isinstance(doc, dict) else doc)
        check.raise_if_any()
    return parser(doc, path, sha)
