"""The manifests' schemas, declared with pydantic v2: what each field of a model, dataset, software,
hardware and reference manifest may hold. A field's description is both what an editor shows
(`mlharness specs schema` writes these as JSON Schema) and what a problem line says was expected,
so the two cannot drift apart. Rules that relate several fields (what a framework needs among the
sources, TensorRT only on a cuda device) are model validators, checked once the fields are well formed.

SCHEMAS names each kind's root schema. This module holds the dataset, software, hardware and
reference schemas; the model's is mlharness.specs.model_schema, the parts several kinds share
(artifact, tensor, metric) mlharness.specs.schema_parts, and the base class and shared field types
mlharness.specs.schema_fields.

A validated document is the manifest the runtime reads (frozen; mlharness.specs.manifests loads it
and names each kind as the runtime does, ModelManifest for ModelDoc and so on): where the runtime
reads a section in another shape than the file writes it (a reference's accuracy rules as mappings),
a property gives that view, so there is one type per manifest kind and nothing is copied by hand.
mlharness.specs.validation turns pydantic's errors into this project's one-line problems."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from mlharness.specs.model_schema import (  # noqa: F401  (every schema class stays reachable here, as before the split)
    DECODINGS,
    GENERATIVE_FRAMEWORKS,
    SOURCE_ROLES,
    Framework,
    Generation,
    ModelDoc,
    Module,
    Sources,
)
from mlharness.specs.schema_fields import (  # noqa: F401
    CODE_REF,
    CONSTRAINT_PATTERN,
    DIM_NAME,
    Code,
    Doc,
    ManifestDoc,
    Mapping,
    nonblank,
    version_constraint,
)
from mlharness.specs.schema_parts import ELEMENT_TYPES, Artifact, Conversion, Metric, ModelMetric, Tensor  # noqa: F401
from mlharness.specs.validation import SEMVER, SHA256, Expect, refuse_all

DEVICE = re.compile(r"^(cpu|cuda:\d+)$")


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
    evaluation_section: Metric | None = Field(None, alias="evaluation", description=Metric.expected)
    attributes: Mapping = Field(default_factory=dict)  # hints for user code, e.g. max_tokens
    generation: DatasetGeneration | None = Field(None, description=DatasetGeneration.expected)

    @field_validator("sources")
    @classmethod
    def _names_as_text(cls, value: dict[Any, Artifact]) -> dict[str, Artifact]:
        return {str(key): art for key, art in value.items()}  # YAML reads `7:` as a number

    @property
    def evaluation(self) -> dict[str, Any]:
        """The metric and its own options, as a metric is called with them ({}: none declared)."""
        return self.evaluation_section.model_dump() if self.evaluation_section is not None else {}

    @property
    def max_new_tokens(self) -> int | None:
        """generation.max_new_tokens: replaces a generative model's own."""
        return self.generation.max_new_tokens if self.generation is not None else None


PackageConstraint = Annotated[str, version_constraint("a version constraint such as '==1.31.1' or '>=2.0'"),
                              Expect("a version constraint such as '==1.31.1' or '>=2.0'"),
                              Field(json_schema_extra={"pattern": CONSTRAINT_PATTERN})]


class SoftwareDoc(ManifestDoc):
    expected: ClassVar[str] = "a mapping with kind: software"

    kind: Literal["software"] = Field(description="'software'")
    packages: dict[str, PackageConstraint | None] = Field(
        default_factory=dict, description="a mapping package -> version constraint")
    environment: dict[str, Any] = Field(default_factory=dict, description="a mapping VAR -> value")

    @field_validator("packages")
    @classmethod
    def _any_version(cls, value: dict[str, str | None]) -> dict[str, str]:
        return {name: constraint or "" for name, constraint in value.items()}  # `numpy:` alone: any version

    @field_validator("environment")
    @classmethod
    def _values_as_text(cls, value: dict[str, Any]) -> dict[str, str]:
        return {name: str(setting) for name, setting in value.items()}  # as a process environment holds them


class TensorRT(Doc):
    """ONNX Runtime's TensorRT execution provider on a cuda:N device."""

    expected: ClassVar[str] = "a mapping {enabled, fp16, engine_cache}"

    enabled: bool = Field(True, description="true or false")
    fp16: bool = Field(False, description="true or false")
    engine_cache: Annotated[str, nonblank("a folder for built engines (relative to this file)")] | None = Field(
        None, description="a folder for built engines (relative to this file)", json_schema_extra={"pattern": r"\S"})

    @field_validator("engine_cache")
    @classmethod
    def _beside_the_manifest(cls, value: str | None, info: ValidationInfo) -> str | None:
        """The folder as the runtime opens it: home expanded, a relative one taken from the manifest's
        folder (the loader's context), as every path in a manifest is."""
        if value is None:
            return None
        folder = Path(value).expanduser()
        manifest = (info.context or {}).get("manifest")
        return str(folder if folder.is_absolute() or manifest is None else Path(manifest).parent / folder)

    def describe(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "fp16": self.fp16, "engine_cache": self.engine_cache}


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
    cpu_affinity: tuple[Annotated[int, Field(ge=0), Expect("a CPU index >= 0")], ...] | None = Field(
        None, description="a list of CPU indices")
    system: Any = Field(None, description="a free-form description of the system")
    tensorrt: TensorRT | None = Field(None, description=TensorRT.expected)

    @model_validator(mode="after")
    def _tensorrt_on_cuda(self) -> HardwareDoc:
        if self.tensorrt is not None and self.tensorrt.enabled and not self.device.startswith("cuda:"):
            refuse_all([(("tensorrt", "enabled"), f"false on device {self.device} (TensorRT runs on a cuda:N device)",
                         True)])
        return self

    @field_validator("cpu_affinity")
    @classmethod
    def _empty_is_no_affinity(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return value or None  # [] pins nothing: every CPU, as no list


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
    model_section: Identity = Field(alias="model", description=Identity.expected)
    dataset_section: Identity = Field(alias="dataset", description=Identity.expected)
    backend: str = Field(min_length=1, description="a backend name")
    accuracy_section: dict[str, Expectation] = Field(
        default_factory=dict, alias="accuracy", description="a mapping metric -> {expected, tolerance or min_fraction}")
    performance: dict[str, Any] = Field(default_factory=dict, description="a mapping scenario -> figures")
    outputs_section: tuple[OutputCheck, ...] = Field((), alias="outputs", description="a list of {sample, values, atol}")

    @property
    def model(self) -> dict[str, str]:
        """The model's identity as the file gives it (no sha256 key where it gives none)."""
        return self.model_section.model_dump(exclude_none=True)

    @property
    def dataset(self) -> dict[str, str]:
        return self.dataset_section.model_dump(exclude_none=True)

    @property
    def accuracy(self) -> dict[str, dict[str, float]]:
        """metric -> {expected, and tolerance or min_fraction}: the rule that metric is checked by."""
        return {name: {"expected": rule.expected_value, **({"tolerance": rule.tolerance} if rule.min_fraction is None
                                                          else {"min_fraction": rule.min_fraction})}
                for name, rule in self.accuracy_section.items()}

    @property
    def outputs(self) -> tuple[dict[str, Any], ...]:
        """Each output check as {sample, values, atol where given}."""
        return tuple(check.model_dump(exclude_none=True) for check in self.outputs_section)


SCHEMAS: dict[str, type[Doc]] = {"model": ModelDoc, "dataset": DatasetDoc, "software": SoftwareDoc,
                                 "hardware": HardwareDoc, "reference": ReferenceDoc}
