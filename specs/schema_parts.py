"""Parts several manifest kinds share: an artifact (fetched and verified by its sha256, or made from
another model by a recorded conversion), a tensor and a metric. Validated, they are what the runtime
reads (mlharness.specs.manifests names them Artifact, Conversion, TensorSpec)."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, model_validator

from mlharness.specs.schema_fields import DIM_NAME, SHA_TEXT, URI_TEXT, Doc, Sha256
from mlharness.specs.validation import Expect, NamesOf, refuse, refuse_all

ELEMENT_TYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")


def _dim(value: Any) -> int | str:
    if isinstance(value, bool) or not (isinstance(value, int) and value > 0
                                       or isinstance(value, str) and DIM_NAME.match(value)):
        refuse("a positive size or a symbolic dim name")
    return value


def _opset(value: int) -> int:
    if not 7 <= value <= 30:
        refuse("an ONNX opset number between 7 and 30")
    return value


def _example_dims(value: dict[Any, Any]) -> dict[str, int]:
    bad = [((key,), "a symbolic dim name mapped to a positive size", size) for key, size in value.items()
           if not (isinstance(key, str) and DIM_NAME.match(key)) or isinstance(size, bool)
           or not isinstance(size, int) or size <= 0]
    if bad:
        refuse_all(bad)
    return dict(sorted(value.items()))  # by name: the conversion's description (its cache key) ignores the file's order


Dim = Annotated[Any, AfterValidator(_dim), Expect("a positive size or a symbolic dim name"),
                WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1},
                                          {"type": "string", "pattern": DIM_NAME.pattern}]})]


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

    def describe(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.to, "opset": self.opset, "example_dims": dict(self.example_dims)}


class Artifact(Doc):
    """A file fetched and verified by its sha256, or made from another model by a recorded conversion."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["uri", "sha256"], "not": {"required": ["convert"]}},
        {"required": ["convert"], "not": {"anyOf": [{"required": ["uri"]}, {"required": ["sha256"]}]}}]})
    expected: ClassVar[str] = "a mapping {uri, sha256}"

    uri: str = Field("", description=URI_TEXT, json_schema_extra={"minLength": 1})  # "": made by its conversion
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
            if "uri" in self.model_fields_set:
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
    shape: tuple[Dim, ...] = Field(description="a list of sizes and symbolic dims such as [batch, 3, 224, 224]")
    layout: str | None = Field(None, description="a layout such as NCHW")

    def sample_shape(self) -> tuple[int | str, ...]:
        """The shape of one sample: the declared shape without its leading batch dimension."""
        return self.shape[1:] if self.shape and self.shape[0] == "batch" else self.shape


class Metric(Doc):
    """`accuracy:` / `evaluation:`: a metric name and the metric's own options."""

    model_config = ConfigDict(extra="allow")
    expected: ClassVar[str] = "a mapping {metric, ...}"

    metric: str = Field(min_length=1, description="a metric name")


class ModelMetric(Metric):
    metric: str = Field(min_length=1, description="a metric name such as topk")
