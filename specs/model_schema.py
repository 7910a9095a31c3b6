"""A model manifest's schema: its framework, sources, generation settings and attributes, and the
rules that relate them (what each framework needs among the sources). The framework rules are the
one place the spec layer names frameworks (onnxruntime, torch, the generative ones)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

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
    stop: tuple[Annotated[str, Field(min_length=1), Expect("a non-empty stop string")], ...] = Field(
        (), description="a list of non-empty stop strings")
    context_window: int | None = Field(None, gt=0, description="a positive token count")

    @model_validator(mode="after")
    def _room_to_generate(self) -> Generation:
        if self.context_window is not None and self.context_window <= self.max_new_tokens:
            refuse_all([(("context_window",), f"more tokens than max_new_tokens ({self.max_new_tokens})",
                         self.context_window)])
        return self

    def describe(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "decoding": self.decoding, "chat_template": self.chat_template,
                "system_prompt": self.system_prompt, "stop": list(self.stop), "context_window": self.context_window}


# -- what each framework needs ---------------------------------------------------------------------
# One table, read twice: by the model validator (a problem line per broken rule) and by the JSON
# Schema written for editors (an if/then per rule), so the two cannot say different things.

@dataclass(frozen=True)
class FrameworkRule:
    """What a model manifest must (or must not) have for the frameworks named, or (`others`) for
    every framework but those: one of the fields at `needs` (document paths), or no field `refuses`.
    `text` is what the problem line says was expected ({fw}: the manifest's framework)."""

    frameworks: tuple[str, ...]
    text: str
    needs: tuple[tuple[str, ...], ...] = ()
    refuses: tuple[str, ...] = ()
    others: bool = False
    got: Any = None  # what the problem line says was found (None: nothing, as for a missing field)

    def applies(self, framework: str) -> bool:
        return (framework in self.frameworks) != self.others

    def broken(self, doc: BaseModel) -> bool:
        if self.refuses:
            return _at(doc, self.refuses) is not None
        return all(_at(doc, path) is None for path in self.needs)

    def problem(self, framework: str) -> tuple[tuple[str, ...], str, Any]:
        return (self.refuses or self.needs[0]), self.text.replace("{fw}", framework), self.got

    def json_schema(self) -> dict[str, Any]:
        when = {"properties": {"framework": {"properties": {"name": {"enum": list(self.frameworks)}}}}}
        if self.refuses:
            then: dict[str, Any] = {"not": _required(self.refuses)}
        else:
            then = _required(self.needs[0]) if len(self.needs) == 1 else {"anyOf": list(map(_required, self.needs))}
        return {"if": {"not": when} if self.others else when, "then": then}


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    """The value at a document path (field names as the file writes them), None where absent."""
    for key in path:
        if doc is None:
            return None
        name = next((n for n, f in type(doc).model_fields.items() if key in (n, f.alias)), key)
        doc = getattr(doc, name)
    return doc


def _required(path: tuple[str, ...]) -> dict[str, Any]:
    """JSON Schema: the document has the field at `path`."""
    *parents, last = path
    schema: dict[str, Any] = {"required": [last]}
    for parent in reversed(parents):
        schema = {"required": [parent], "properties": {parent: schema}}
    return schema


FRAMEWORK_RULES = (
    FrameworkRule(("null",), f"{Sources.expected} (required field is missing)", needs=(("sources",),), others=True),
    FrameworkRule(("onnxruntime",), "an ONNX graph {uri, sha256} for framework onnxruntime",
                  needs=(("sources", "graph"),)),
    FrameworkRule(("torch",), "a module factory (with weights) or sources.torchscript for framework torch",
                  needs=(("sources", "module"), ("sources", "torchscript"))),
    FrameworkRule(GENERATIVE_FRAMEWORKS, "the model's weights {uri, sha256} (a GGUF file) for framework {fw}",
                  needs=(("sources", "weights"),)),
    FrameworkRule(GENERATIVE_FRAMEWORKS, "a mapping {max_new_tokens, decoding, ...} for framework {fw}",
                  needs=(("generation",),)),
    FrameworkRule(GENERATIVE_FRAMEWORKS, f"no generation settings for framework {{fw}} "
                  f"(generative frameworks: {', '.join(GENERATIVE_FRAMEWORKS)})",
                  refuses=("generation",), others=True, got="a mapping"),
)


def _non_empty(value: tuple[Any, ...]) -> tuple[Any, ...]:
    if not value:
        refuse("a non-empty list of tensors")
    return value


# A check of its own, not min_length: pydantic's tuple says "too short" again when an item is wrong.
Tensors = Annotated[tuple[Tensor, ...], AfterValidator(_non_empty), Field(json_schema_extra={"minItems": 1})]


class ModelDoc(ManifestDoc):
    """A model manifest, as validated and as the runtime reads it: the sections the file writes
    (framework, sources, accuracy) are kept whole, and read through flat views (framework: the
    name, sources: role or file name -> artifact, accuracy: the metric and its options)."""

    model_config = ConfigDict(json_schema_extra={"allOf": [rule.json_schema() for rule in FRAMEWORK_RULES]})
    expected: ClassVar[str] = "a mapping with kind: model"

    kind: Literal["model"] = Field(description="'model'")
    framework_section: Framework = Field(alias="framework", description=Framework.expected)
    mlperf_benchmark: str | None = Field(None, description="an MLPerf benchmark name")
    inputs: Tensors = Field(description="a non-empty list of tensors")
    outputs: Tensors = Field(description="a non-empty list of tensors")
    result: Tensor | None = Field(None, description=Tensor.expected)
    sources_section: Sources | None = Field(None, alias="sources", description=Sources.expected)
    preprocess: Code | None = None
    postprocess: Code | None = None
    attributes: ModelAttributes = Field(default_factory=dict)
    accuracy_section: ModelMetric | None = Field(None, alias="accuracy", description=ModelMetric.expected)
    dataset: str | None = Field(None, description="a default dataset name")
    generation: Generation | None = Field(None, description=Generation.expected)

    @model_validator(mode="after")
    def _what_the_framework_needs(self) -> ModelDoc:
        fw = self.framework
        problems = [rule.problem(fw) for rule in FRAMEWORK_RULES if rule.applies(fw) and rule.broken(self)]
        if problems:
            refuse_all(problems)
        return self

    @property
    def framework(self) -> str:
        return self.framework_section.name

    @property
    def framework_version(self) -> str:
        return self.framework_section.version

    @property
    def sources(self) -> dict[str, Artifact]:
        """Every file the model reads by its role (graph, weights, torchscript) or its name (files)."""
        src = self.sources_section or Sources()
        roles = {"graph": src.graph, "weights": src.weights, "torchscript": src.torchscript}
        return {**{role: art for role, art in roles.items() if art is not None}, **src.files}

    @property
    def factory(self) -> str | None:
        module = self.sources_section.module if self.sources_section else None
        return module.factory if module else None

    @property
    def graph_transforms(self) -> tuple[str, ...]:
        graph = self.sources_section.graph if self.sources_section else None
        return tuple(graph.transforms or ()) if graph else ()

    @property
    def accuracy(self) -> dict[str, Any]:
        """The metric and its own options, as a metric is called with them."""
        return self.accuracy_section.model_dump() if self.accuracy_section is not None else {}

    @property
    def default_dataset(self) -> str | None:
        return self.dataset
