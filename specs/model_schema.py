"""A model manifest's schema: its framework, sources, generation settings and attributes, and the
rules that relate them (what each framework needs among the sources). The framework rules are the
one place the spec layer names frameworks (onnxruntime, torch, the generative ones)."""
from __future__ import annotations

import difflib
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from mlharness.running.setting_keys import SCENARIOS, SCOPES, SETTING_KEYS, setting_hint
from mlharness.specs.schema_fields import (
    CONSTRAINT_PATTERN,
    DIM_NAME,
    Code,
    Doc,
    ManifestDoc,
    version_constraint,
)
from mlharness.specs.schema_parts import Artifact, ModelMetric, Tensor
from mlharness.specs.validation import Expect, NamesOf, refuse, refuse_all

SOURCE_ROLES = ("graph", "weights", "module", "torchscript", "files")
# Backends that generate tokens (mlharness.sut.llm); they need `generation:` and sources.weights.
GENERATIVE_FRAMEWORKS = ("transformers", "llama_cpp")
DECODINGS = ("greedy",)


def _file_name(key: str) -> str:
    if key in SOURCE_ROLES or not DIM_NAME.match(key):
        refuse(f"a file name of letters, digits and '_', not one of {list(SOURCE_ROLES)}")
    return key


FileName = Annotated[str, AfterValidator(_file_name),
                     Expect(f"a file name of letters, digits and '_', not one of {list(SOURCE_ROLES)}")]

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


class Framework(Doc):
    expected: ClassVar[str] = "a mapping {name, version}"

    name: Annotated[str, NamesOf("framework")] = Field(description="a backend's name")
    version: Annotated[str, version_constraint("a version constraint such as '>=1.17'")] = Field(
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


# -- what each framework needs ---------------------------------------------------------------------

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
