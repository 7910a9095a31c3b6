"""The manifests' schemas, declared with pydantic v2: what each field of a model, dataset, software,
hardware and reference manifest may hold. A field's description is both what an editor shows
(`mlharness specs schema` writes these as JSON Schema) and what a problem line says was expected,
so the two cannot drift apart. Rules that relate several fields (what a framework needs among the
sources, TensorRT only on a cuda device) are model validators, checked once the fields are well formed.

mlharness.specs.manifests turns a validated document into the frozen manifest the runtime uses;
mlharness.specs.validation turns pydantic's errors into this project's one-line problems."""
from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from mlharness.running.setting_keys import SCENARIOS, SCOPES, SETTING_KEYS, setting_hint
from mlharness.specs.validation import NAME, SEMVER, SHA256, Expect, NamesOf, refuse, refuse_all

ELEMENT_TYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
CODE_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DIM_NAME = re.compile(r"^[A-Za-z_]\w*$")
SOURCE_ROLES = ("graph", "weights", "module", "torchscript", "files")
DEVICE = re.compile(r"^(cpu|cuda:\d+)$")
# Backends that generate tokens (mlharness.sut.llm); they need `generation:` and sources.weights.
GENERATIVE_FRAMEWORKS = ("transformers", "llama_cpp")
DECODINGS = ("greedy",)

SHA_TEXT = "64 lowercase hex digits (sha256)"
URI_TEXT = "a path, file://, package:// or https:// URI"
CODE_TEXT = "inline Python source or module:function"
CODE_SHAPE_TEXT = "inline Python source (several lines) or module:function"


class Doc(BaseModel):
    """A mapping of known fields: unknown ones, strings where numbers belong and the like are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)
    expected: ClassVar[str] = "a mapping"  # what a problem says when something else stands in its place

    @model_validator(mode="before")
    @classmethod
    def _empty_is_absent(cls, data: Any) -> Any:
        """`key:` with no value means the field is absent (its default, or missing when required), as
        does an empty string for a required field: YAML writes both when a value was left out."""
        if not isinstance(data, dict):
            return data
        fields = {f.alias or name: f for name, f in cls.model_fields.items()}
        return {k: v for k, v in data.items()
                if v is not None and not (v == "" and k in fields and fields[k].is_required())}


# -- field types -------------------------------------------------------------------------------------

def _code(value: str) -> str:
    if "\n" not in value and not CODE_REF.match(value.strip()):
        refuse(CODE_SHAPE_TEXT)
    return value


# JSON Schema's approximation of a PEP 440 version constraint (the loader parses it with `packaging`).
_OP = r"\s*(~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*"
CONSTRAINT_PATTERN = rf"^({_OP}(,{_OP})*)?$"


def _version_constraint(text: str) -> Any:
    def check(value: str) -> str:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            refuse(text)
        return value
    return AfterValidator(check)


def _dim(value: Any) -> int | str:
    if isinstance(value, bool) or not (isinstance(value, int) and value > 0
                                       or isinstance(value, str) and DIM_NAME.match(value)):
        refuse("a positive size or a symbolic dim name")
    return value


def _opset(value: int) -> int:
    if not 7 <= value <= 30:
        refuse("an ONNX opset number between 7 and 30")
    return value


def _nonblank(text: str) -> Any:
    def check(value: str) -> str:
        if not value.strip():
            refuse(text)
        return value
    return AfterValidator(check)


def _example_dims(value: dict[Any, Any]) -> dict[str, int]:
    bad = [((key,), "a symbolic dim name mapped to a positive size", size) for key, size in value.items()
           if not (isinstance(key, str) and DIM_NAME.match(key)) or isinstance(size, bool)
           or not isinstance(size, int) or size <= 0]
    if bad:
        refuse_all(bad)
    return value


def _file_name(key: str) -> str:
    if key in SOURCE_ROLES or not DIM_NAME.match(key):
        refuse(f"a file name of letters, digits and '_', not one of {list(SOURCE_ROLES)}")
    return key


Name = Annotated[str, Field(pattern=NAME.pattern, description="a name of letters, digits, '.', '_' or '-'")]
Version = Annotated[str, Field(pattern=SEMVER.pattern, description="a semantic version such as 1.0.0")]
Sha256 = Annotated[str, Field(pattern=SHA256.pattern, description=SHA_TEXT)]
CODE_SCHEMA_PATTERN = r"^(\s*[A-Za-z_][\w.]*:[A-Za-z_]\w*\s*|[\s\S]*\n[\s\S]*)$"
Code = Annotated[str, AfterValidator(_code), Field(description=CODE_TEXT, json_schema_extra={"pattern": CODE_SCHEMA_PATTERN})]
Dim = Annotated[Any, AfterValidator(_dim), Expect("a positive size or a symbolic dim name"),
                WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1},
                                          {"type": "string", "pattern": DIM_NAME.pattern}]})]
FileName = Annotated[str, AfterValidator(_file_name),
                     Expect(f"a file name of letters, digits and '_', not one of {list(SOURCE_ROLES)}")]
Description = Annotated[str, Field(description="a description")]
Mapping = Annotated[dict[str, Any], Field(description="a mapping")]

# A model's attributes are open (hints for user code: dims, num_classes, ...); the keys the harness
# itself reads are checked here, so a manifest that LoadGen or the workers would trip on is refused
# by `specs validate` and before any run, naming the field.
ATTRIBUTE_COUNTS = {"max_batch_size": "a batch size >= 1", "performance_sample_count": "a sample count >= 1"}


def _scope_text(scope: Any) -> str:
    close = difflib.get_close_matches(str(scope), SCENARIOS, n=1)
    return (f"'*' or a scenario name (did you mean {close[0]!r}?)" if close else
            f"'*' or one of {', '.join(SCENARIOS)}")


def _model_attributes(value: dict[str, Any]) -> dict[str, Any]:
    problems: list[tuple[tuple[Any, ...], str, Any]] = [
        ((key,), text, value[key]) for key, text in ATTRIBUTE_COUNTS.items()
        if key in value and (isinstance(value[key], bool) or not isinstance(value[key], int) or value[key] < 1)]
    settings = value.get("settings")
    if settings is not None and not isinstance(settings, dict):
        problems.append((("settings",), "a mapping '*'|Scenario -> {setting: value}", settings))
    for scope, entry in (settings.items() if isinstance(settings, dict) else ()):
        if scope not in SCOPES:
            problems.append((("settings", scope), _scope_text(scope), scope))
        elif entry is not None and not isinstance(entry, dict):
            problems.append((("settings", scope), "a mapping of settings", entry))
        else:
            problems += [(("settings", scope, key), f"a setting name ({setting_hint(key)})", key)
                         for key in entry or {} if key not in SETTING_KEYS]
    if problems:
        refuse_all(problems)
    return value


ModelAttributes = Annotated[dict[str, Any], AfterValidator(_model_attributes), Field(
    description="a mapping",
    json_schema_extra={"properties": {
        "max_batch_size": {"type": "integer", "minimum": 1}, "performance_sample_count": {"type": "integer", "minimum": 1},
        "settings": {"type": "object", "propertyNames": {"enum": list(SCOPES)},
                     "additionalProperties": {"type": ["object", "null"], "propertyNames": {"enum": SETTING_KEYS}}}}})]


class ManifestDoc(Doc):
    """What every manifest has: its kind (each kind's schema names its own), name, version, description."""

    kind: str = Field(description="the manifest's kind")
    name: Name
    version: Version
    description: Description = ""


# -- shared parts ------------------------------------------------------------------------------------

class Conversion(Doc):
    expected: ClassVar[str] = "a mapping {from, to, opset, example_dims}"

    source: str = Field(alias="from", min_length=1, description="the source model manifest's path, relative to this file")
    to: Annotated[str, NamesOf("conversion target")] = Field(description="a conversion target")
    opset: Annotated[int, AfterValidator(_opset)] | None = Field(
        None, description="an ONNX opset number such as 17", json_schema_extra={"minimum": 7, "maximum": 30})
    example_dims: Annotated[dict[Any, Any], AfterValidator(_example_dims),
                            WithJsonSchema({"type": "object", "propertyNames": {"pattern": DIM_NAME.pattern},
                                            "additionalProperties": {"type": "integer", "minimum": 1}})] = Field(
        default_factory=dict, description="a mapping symbolic dim -> example size")


class Artifact(Doc):
    """A file fetched and verified by its sha256, or made from another model by a recorded conversion."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["uri", "sha256"], "not": {"required": ["convert"]}},
        {"required": ["convert"], "not": {"anyOf": [{"required": ["uri"]}, {"required": ["sha256"]}]}}]})
    expected: ClassVar[str] = "a mapping {uri, sha256}"

    uri: str | None = Field(None, description=URI_TEXT, json_schema_extra={"minLength": 1})
    sha256: Sha256 | None = None
    transforms: list[Annotated[str, Expect("a transform name")]] | None = Field(
        None, description="a list of transform names")
    convert: Conversion | None = Field(None, description=Conversion.expected)

    @model_validator(mode="after")
    def _fetched_or_converted(self) -> Artifact:
        if self.convert is not None:
            # A conversion's bytes depend on the CPU's float kernels (weight folding), so they cannot be
            # pinned; the conversion's output check against the source is the gate, its sha256 is recorded.
            problems = []
            if self.sha256 is not None:
                problems.append((("sha256",), "no sha256 on a converted artifact (its bytes depend on the machine; "
                                 "the conversion's output check verifies it and the run records its sha256)",
                                 self.sha256))
            if self.uri is not None:
                problems.append((("uri",), "either uri or convert, not both", self.uri))
            if problems:
                refuse_all(problems)
            return self
        missing = [((key,), f"{text} (required field is missing)", None)
                   for key, text, value in (("sha256", SHA_TEXT, self.sha256), ("uri", URI_TEXT, self.uri))
                   if not value]
        if missing:
            refuse_all(missing)
        return self


class Tensor(Doc):
    expected: ClassVar[str] = "a mapping {name, type, element_type, shape, layout}"

    name: str = Field(min_length=1, description="a tensor name")
    type: str = Field("tensor", description="a tensor type such as image, tokens, probabilities")
    element_type: Literal[ELEMENT_TYPES] = Field(description=f"one of {list(ELEMENT_TYPES)}")  # type: ignore[valid-type]
    shape: list[Dim] = Field(description="a list of sizes and symbolic dims such as [batch, 3, 224, 224]")
    layout: str | None = Field(None, description="a layout such as NCHW")


class Metric(Doc):
    """`accuracy:` / `evaluation:`: a metric name and the metric's own options."""

    model_config = ConfigDict(extra="allow")
    expected: ClassVar[str] = "a mapping {metric, ...}"

    metric: str = Field(min_length=1, description="a metric name")


class ModelMetric(Metric):
    metric: str = Field(min_length=1, description="a metric name such as topk")


# -- model -------------------------------------------------------------------------------------------

class Framework(Doc):
    expected: ClassVar[str] = "a mapping {name, version}"

    name: Annotated[str, NamesOf("framework")] = Field(description="a backend's name")
    version: Annotated[str, _version_constraint("a version constraint such as '>=1.17'")] = Field(
        "", description="a version constraint such as '>=1.17'", json_schema_extra={"pattern": CONSTRAINT_PATTERN})


class Module(Doc):
    expected: ClassVar[str] = "a mapping {factory}"

    factory: Code


class Sources(Doc):
    expected: ClassVar[str] = "a mapping of sources (graph, weights, module, torchscript, files)"

    graph: Artifact | None = Field(None, description=Artifact.expected)
    weights: Artifact | None = Field(None, description=Artifact.expected)
    torchscript: Artifact | None = Field(None, description=Artifact.expected)
    module: Module | None = Field(None, description=Module.expected)
    # Named extra files user code reads as ctx.sources[name] (a tokenizer, a config), verified like the rest.
    files: dict[FileName, Artifact] = Field(default_factory=dict, description="a mapping name -> {uri, sha256}",
                                            json_schema_extra={"propertyNames": {"pattern": DIM_NAME.pattern,
                                                                                 "not": {"enum": list(SOURCE_ROLES)}}})


class Generation(Doc):
    """How a generative model (a causal LM) answers a prompt."""

    expected: ClassVar[str] = ("a mapping {max_new_tokens, decoding, chat_template, system_prompt, stop, "
                               "context_window}")

    max_new_tokens: int = Field(gt=0, description="a positive token count")
    decoding: Literal[DECODINGS] = Field(  # type: ignore[valid-type]
        "greedy", description="'greedy' (seeded sampling is not built yet)")
    chat_template: bool = Field(True, description="true or false")
    system_prompt: str | None = Field(None, description="the text of the system turn")
    stop: list[Annotated[str, Field(min_length=1), Expect("a non-empty stop string")]] = Field(
        default_factory=list, description="a list of non-empty stop strings")
    context_window: int | None = Field(None, gt=0, description="a positive token count")

    @model_validator(mode="after")
    def _room_to_generate(self) -> Generation:
        if self.context_window is not None and self.context_window <= self.max_new_tokens:
            refuse_all([(("context_window",), f"more tokens than max_new_tokens ({self.max_new_tokens})",
                         self.context_window)])
        return self


def _framework_is(*names: str) -> dict[str, Any]:
    return {"properties": {"framework": {"properties": {"name": {"enum": list(names)}}}}}


def _needs(*path: str) -> dict[str, Any]:
    """JSON Schema: the document has sources.<path...>."""
    *parents, last = path
    schema: dict[str, Any] = {"required": [last]}
    for parent in reversed(parents):
        schema = {"required": [parent], "properties": {parent: schema}}
    return schema


# The relations between fields that _what_the_framework_needs checks, for editors.
FRAMEWORK_RULES = {"allOf": [
    {"if": {"not": _framework_is("null")}, "then": _needs("sources")},
    {"if": _framework_is("onnxruntime"), "then": _needs("sources", "graph")},
    {"if": _framework_is("torch"), "then": {"anyOf": [_needs("sources", "module"), _needs("sources", "torchscript")]}},
    {"if": _framework_is(*GENERATIVE_FRAMEWORKS), "then": {"allOf": [_needs("sources", "weights"), _needs("generation")]},
     "else": {"not": {"required": ["generation"]}}},
]}


class ModelDoc(ManifestDoc):
    model_config = ConfigDict(json_schema_extra=FRAMEWORK_RULES)
    expected: ClassVar[str] = "a mapping with kind: model"

    kind: Literal["model"] = Field(description="'model'")
    framework: Framework = Field(description=Framework.expected)
    mlperf_benchmark: str | None = Field(None, description="an MLPerf benchmark name")
    inputs: list[Tensor] = Field(min_length=1, description="a non-empty list of tensors")
    outputs: list[Tensor] = Field(min_length=1, description="a non-empty list of tensors")
    result: Tensor | None = Field(None, description=Tensor.expected)
    sources: Sources | None = Field(None, description=Sources.expected)
    preprocess: Code | None = None
    postprocess: Code | None = None
    attributes: ModelAttributes = Field(default_factory=dict)
    accuracy: ModelMetric | None = Field(None, description=ModelMetric.expected)
    dataset: str | None = Field(None, description="a default dataset name")
    generation: Generation | None = Field(None, description=Generation.expected)

    @model_validator(mode="after")
    def _what_the_framework_needs(self) -> ModelDoc:
        fw = self.framework.name
        sources = self.sources or Sources()
        problems: list[tuple[tuple[str, ...], str, Any]] = []
        if self.sources is None and fw != "null":
            problems.append((("sources",), f"{Sources.expected} (required field is missing)", None))
        if fw == "onnxruntime" and sources.graph is None:
            problems.append((("sources", "graph"), "an ONNX graph {uri, sha256} for framework onnxruntime", None))
        if fw == "torch" and sources.module is None and sources.torchscript is None:
            problems.append((("sources", "module"),
                             "a module factory (with weights) or sources.torchscript for framework torch", None))
        generative = fw in GENERATIVE_FRAMEWORKS
        if generative and sources.weights is None:
            problems.append((("sources", "weights"),
                             f"the model's weights {{uri, sha256}} (a GGUF file) for framework {fw}", None))
        if generative and self.generation is None:
            problems.append((("generation",), f"a mapping {{max_new_tokens, decoding, ...}} for framework {fw}", None))
        if not generative and self.generation is not None:
            problems.append((("generation",), f"no generation settings for framework {fw} "
                             f"(generative frameworks: {', '.join(GENERATIVE_FRAMEWORKS)})", "a mapping"))
        if problems:
            refuse_all(problems)
        return self


# -- dataset, software, hardware, reference -----------------------------------------------------------

class DatasetGeneration(Doc):
    """What a prompt dataset asks of a generative model: how long its answers are (a one-word label
    needs a few tokens, a summary tens). It replaces the model manifest's generation.max_new_tokens."""

    expected: ClassVar[str] = "a mapping {max_new_tokens}"

    max_new_tokens: int = Field(gt=0, description="a positive token count")


class DatasetDoc(ManifestDoc):
    expected: ClassVar[str] = "a mapping with kind: dataset"

    kind: Literal["dataset"] = Field(description="'dataset'")
    sources: dict[Any, Artifact] = Field(default_factory=dict, description="a mapping name -> {uri, sha256}")
    samples: Code
    load: Code | None = None
    sample_count: int = Field(gt=0, description="a positive integer")
    evaluation: Metric | None = Field(None, description=Metric.expected)
    attributes: Mapping = Field(default_factory=dict)  # hints for user code, e.g. max_tokens
    generation: DatasetGeneration | None = Field(None, description=DatasetGeneration.expected)


PackageConstraint = Annotated[str, _version_constraint("a version constraint such as '==1.31.1' or '>=2.0'"),
                              Expect("a version constraint such as '==1.31.1' or '>=2.0'"),
                              Field(json_schema_extra={"pattern": CONSTRAINT_PATTERN})]


class SoftwareDoc(ManifestDoc):
    expected: ClassVar[str] = "a mapping with kind: software"

    kind: Literal["software"] = Field(description="'software'")
    packages: dict[str, PackageConstraint | None] = Field(
        default_factory=dict, description="a mapping package -> version constraint")
    environment: dict[str, Any] = Field(default_factory=dict, description="a mapping VAR -> value")


class TensorRT(Doc):
    """ONNX Runtime's TensorRT execution provider on a cuda:N device."""

    expected: ClassVar[str] = "a mapping {enabled, fp16, engine_cache}"

    enabled: bool = Field(True, description="true or false")
    fp16: bool = Field(False, description="true or false")
    engine_cache: Annotated[str, _nonblank("a folder for built engines (relative to this file)")] | None = Field(
        None, description="a folder for built engines (relative to this file)", json_schema_extra={"pattern": r"\S"})


ThreadCount = Annotated[int, Field(ge=0, description="a thread count >= 0 (0 = automatic)")]


class HardwareDoc(ManifestDoc):
    model_config = ConfigDict(json_schema_extra={"allOf": [{
        "if": {"properties": {"device": {"const": "cpu"}}, "required": ["tensorrt"]},
        "then": {"properties": {"tensorrt": {"required": ["enabled"], "properties": {"enabled": {"const": False}}}}}}]})
    expected: ClassVar[str] = "a mapping with kind: hardware"

    kind: Literal["hardware"] = Field(description="'hardware'")
    device: str = Field(pattern=DEVICE.pattern, description="cpu or cuda:N")
    intra_op_threads: ThreadCount = 0
    inter_op_threads: ThreadCount = 0
    cpu_affinity: list[Annotated[int, Field(ge=0), Expect("a CPU index >= 0")]] | None = Field(
        None, description="a list of CPU indices")
    system: Any = Field(None, description="a free-form description of the system")
    tensorrt: TensorRT | None = Field(None, description=TensorRT.expected)

    @model_validator(mode="after")
    def _tensorrt_on_cuda(self) -> HardwareDoc:
        if self.tensorrt is not None and self.tensorrt.enabled and not self.device.startswith("cuda:"):
            refuse_all([(("tensorrt", "enabled"), f"false on device {self.device} (TensorRT runs on a cuda:N device)",
                         True)])
        return self


class Identity(Doc):
    expected: ClassVar[str] = "a mapping {name, version, sha256}"

    name: str = Field(min_length=1, description="a manifest name")
    version: str = Field(pattern=SEMVER.pattern, description="a semantic version")
    sha256: str | None = Field(None, pattern=SHA256.pattern, description="the manifest's content sha256")


class Expectation(Doc):
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["tolerance"]}, {"required": ["min_fraction"]}]})
    expected: ClassVar[str] = "a mapping {expected, tolerance or min_fraction}"

    expected_value: float = Field(alias="expected", description="a number")
    # Two rules: `tolerance`, |measured - expected| <= tolerance; or MLPerf's one-sided rule for LLM
    # accuracy, measured >= min_fraction x expected (min_fraction 0.99: "99% of the reference's score").
    tolerance: float | None = Field(None, ge=0, description="a number >= 0")
    min_fraction: float | None = Field(None, gt=0, le=1, description="a fraction > 0 and <= 1 (MLPerf's rule: 0.99)")

    @model_validator(mode="after")
    def _one_rule(self) -> Expectation:
        if self.tolerance is None and self.min_fraction is None:
            refuse_all([(("tolerance",), "a number >= 0 (required field is missing)", None)])
        if self.tolerance is not None and self.min_fraction is not None:
            refuse_all([(("min_fraction",), "no min_fraction beside tolerance (one rule a metric: tolerance is "
                         "two-sided, min_fraction one-sided)", self.min_fraction)])
        return self


class OutputCheck(Doc):
    expected: ClassVar[str] = "a mapping {sample, values, atol}"

    sample: int = Field(ge=0, description="a sample index")
    values: list[Any] = Field(description="a list of expected values")
    atol: float | None = Field(None, ge=0, description="an absolute tolerance >= 0")


class ReferenceDoc(ManifestDoc):
    expected: ClassVar[str] = "a mapping with kind: reference"

    kind: Literal["reference"] = Field(description="'reference'")
    model: Identity = Field(description=Identity.expected)
    dataset: Identity = Field(description=Identity.expected)
    backend: str = Field(min_length=1, description="a backend name")
    accuracy: dict[str, Expectation] = Field(default_factory=dict,
                                             description="a mapping metric -> {expected, tolerance or min_fraction}")
    performance: dict[str, Any] = Field(default_factory=dict, description="a mapping scenario -> figures")
    outputs: list[OutputCheck] = Field(default_factory=list, description="a list of {sample, values, atol}")


SCHEMAS: dict[str, type[Doc]] = {"model": ModelDoc, "dataset": DatasetDoc, "software": SoftwareDoc,
                                 "hardware": HardwareDoc, "reference": ReferenceDoc}
