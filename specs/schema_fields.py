"""The vocabulary the manifest schemas are written in: `Doc`, the base of every schema class (the
manifests', a sweep grid's, a scenario preset's), `ManifestDoc`, what every manifest has, and the
field types several kinds share (names, versions, sha256, code, version constraints), each with the
description a problem line and the JSON Schema both show."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from typing_extensions import Self

from mlharness.specs.validation import NAME, SEMVER, SHA256, refuse, unwrap

CODE_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DIM_NAME = re.compile(r"^[A-Za-z_]\w*$")

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

    @model_validator(mode="before")
    @classmethod
    def _lists_as_tuples(cls, data: Any) -> Any:
        """A YAML list where a field holds a tuple (frozen data, as the runtime reads it) is taken as one."""
        if not isinstance(data, dict):
            return data
        tuples = {f.alias or name for name, f in cls.model_fields.items()
                  if get_origin(unwrap(f.annotation)[0]) is tuple}
        return {k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in data.items()}


# -- field types -------------------------------------------------------------------------------------

def _code(value: str) -> str:
    if "\n" not in value and not CODE_REF.match(value.strip()):
        refuse(CODE_SHAPE_TEXT)
    return value


# JSON Schema's approximation of a PEP 440 version constraint (the loader parses it with `packaging`).
_OP = r"\s*(~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*"
CONSTRAINT_PATTERN = rf"^({_OP}(,{_OP})*)?$"


def version_constraint(text: str) -> Any:
    """A validator refusing what `packaging` cannot parse as a version constraint, saying `text`."""
    def check(value: str) -> str:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            refuse(text)
        return value
    return AfterValidator(check)


def nonblank(text: str) -> Any:
    """A validator refusing an empty or all-blank string, saying `text`."""
    def check(value: str) -> str:
        if not value.strip():
            refuse(text)
        return value
    return AfterValidator(check)


Name = Annotated[str, Field(pattern=NAME.pattern, description="a name of letters, digits, '.', '_' or '-'")]
Version = Annotated[str, Field(pattern=SEMVER.pattern, description="a semantic version such as 1.0.0")]
Sha256 = Annotated[str, Field(pattern=SHA256.pattern, description=SHA_TEXT)]
CODE_SCHEMA_PATTERN = r"^(\s*[A-Za-z_][\w.]*:[A-Za-z_]\w*\s*|[\s\S]*\n[\s\S]*)$"
Code = Annotated[str, AfterValidator(_code), Field(description=CODE_TEXT, json_schema_extra={"pattern": CODE_SCHEMA_PATTERN})]
Description = Annotated[str, Field(description="a description")]
Mapping = Annotated[dict[str, Any], Field(description="a mapping")]


class ManifestDoc(Doc):
    """What every manifest has: its kind (each kind's schema names its own), name, version, description;
    and, once loaded (`located`), the file it was read from, that file's sha256 and the document as
    parsed. A manifest compares by its fields, path and sha256, not by its document."""

    # A field whose file name differs from its own (`framework` is the view the runtime reads, the
    # section is `framework_section`) is written in a file by its file name only.
    model_config = ConfigDict(populate_by_name=False)

    kind: str = Field(description="the manifest's kind")
    name: Name
    version: Version
    description: Description = ""

    _path: Path = PrivateAttr(default_factory=Path)
    _sha256: str = PrivateAttr("")
    _doc: dict[str, Any] = PrivateAttr(default_factory=dict)

    def located(self, path: Path, sha256: str, doc: dict[str, Any] | None = None) -> Self:
        """This manifest as read from `path`, whose bytes have `sha256`, parsed as `doc`."""
        found = self.model_copy()
        found._path, found._sha256, found._doc = Path(path), sha256, doc if doc is not None else {}
        return found

    @property
    def path(self) -> Path:
        return self._path

    @property
    def sha256(self) -> str:
        return self._sha256

    @property
    def doc(self) -> dict[str, Any]:
        return self._doc

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def identity(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "path": str(self.path)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ManifestDoc):
            return NotImplemented
        return (type(self) is type(other) and self.__dict__ == other.__dict__
                and (self.path, self.sha256) == (other.path, other.sha256))

    def __hash__(self) -> int:
        return hash((type(self), self.path, self.sha256))  # equal manifests have these equal
