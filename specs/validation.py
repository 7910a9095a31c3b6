"""Reading manifests and naming their problems: the YAML reader, and pydantic's validation errors
(mlharness.specs.schema) as one line each naming the file, the field path, what was expected and what was
found. Every problem of a file is reported at once."""
from __future__ import annotations

import importlib
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, NoReturn, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from mlharness.errors import UserError

SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MISSING = object()
_INPUT = object()  # a problem's value is the value the validator was given
PROBLEMS = "mlharness"  # the error type of this project's own validators (refuse, refuse_all)


class ManifestError(UserError):
    """All problems found in one or more manifests, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


# -- the schemas' own vocabulary (mlharness.specs.schema) ----------------------------------------------------

@dataclass(frozen=True)
class Expect:
    """What a list item, mapping value or key held in place of a field must be: a type's metadata,
    read when a problem is named (a field says it in its description)."""

    text: str


def refuse(expected: str) -> NoReturn:
    """A validator's verdict on the value it was given: `expected WHAT, got VALUE` at its own place."""
    raise PydanticCustomError(PROBLEMS, "{expected}", {"expected": expected, "problems": [((), expected, _INPUT)]})


def refuse_all(problems: list[tuple[tuple[Any, ...], str, Any]]) -> NoReturn:
    """Several problems at once, each (place below the validated value, what was expected, the value;
    None: no value to show, as for a missing field)."""
    raise PydanticCustomError(PROBLEMS, "{expected}", {"expected": problems[0][1], "problems": problems})


# -- names the runtime owns ------------------------------------------------------------------------
# The spec layer checks names that runtime registries own (framework names: sut.backends; conversion
# targets: mlharness.sut.conversion). Each owner registers a function returning its current names; until one
# has, the owner is imported by name when a manifest first needs the names (the owners register
# names only and import no framework), so that the spec layer never imports the runtime itself.
NAME_OWNERS = {"framework": "mlharness.sut.backends", "conversion target": "mlharness.sut.conversion"}
_NAME_SOURCES: dict[str, Callable[[], list[str]]] = {}


def register_names(kind: str, source: Callable[[], list[str]]) -> None:
    """The runtime's registry of `kind` (a key of NAME_OWNERS) hands the spec layer its names."""
    _NAME_SOURCES[kind] = source


def known_names(kind: str) -> list[str]:
    """The names a manifest may use for `kind`, asked of the registry that owns them."""
    if kind not in _NAME_SOURCES:
        importlib.import_module(NAME_OWNERS[kind])  # registers its source
    return list(_NAME_SOURCES[kind]())


@dataclass(frozen=True)
class NamesOf:
    """A string field whose values a runtime registry owns (known_names(kind)): checked against the
    names at validation, listed as the JSON Schema's enum when a schema is written."""

    kind: str

    def expected(self) -> str:
        return f"one of {known_names(self.kind)}"

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        def check(value: str) -> str:
            if value not in known_names(self.kind):
                refuse(self.expected())
            return value
        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> Any:
        found = handler(schema)
        found["enum"] = known_names(self.kind)
        return found


# -- pydantic's errors as one-line problems --------------------------------------------------------

def problems_from(error: ValidationError, source: str, root: type[BaseModel], doc: Any = None) -> list[str]:
    """Each of pydantic's errors as `FILE: field.path: expected WHAT, got VALUE`; a model validator's
    several problems become several lines. Given the document, the lines follow its order of
    top-level fields (problems of fields it lacks come last), so they read along with the file."""
    found: list[tuple[tuple[Any, ...], str]] = []
    for err in error.errors():
        loc = tuple(err["loc"])
        is_key = bool(loc) and loc[-1] == "[key]"  # a mapping's key, not its value, is at fault
        loc = loc[:-1] if is_key else loc
        if err["type"] == PROBLEMS:
            for below, expected, got in err["ctx"]["problems"]:
                shown = err["input"] if got is _INPUT else got
                at = loc + tuple(below)
                found.append((at, _line(source, _path(root, at), expected, shown if got is not None else _MISSING)))
            continue
        path = _path(root, loc)
        expected = _expected_at(root, loc, is_key)
        if err["type"] == "missing":
            found.append((loc, _line(source, path, f"{expected} (required field is missing)")))
        elif err["type"] == "extra_forbidden":
            found.append((loc, _line(source, path, f"no such field (allowed: {', '.join(_allowed(root, loc[:-1]))})")))
        else:
            found.append((loc, _line(source, path, expected, err["input"])))
    if isinstance(doc, dict):
        order = {key: i for i, key in enumerate(doc)}
        found.sort(key=lambda item: order.get(next(iter(item[0]), None), len(order)))
    return [line for _, line in found]


def _line(source: str, path: str, expected: str, got: Any = _MISSING) -> str:
    got = list(got) if isinstance(got, tuple) else got  # a list in the file, made a tuple as it was read
    got_text = "" if got is _MISSING else f", got {_short(got)}"
    return f"{source}: {path or '<document>'}: expected {expected}{got_text}"


def _steps(root: type[BaseModel], loc: tuple[Any, ...]) -> list[tuple[str, Any, list[Any]]]:
    """Walk `loc` through the schema: for each step, (how the step is written, the type reached,
    that type's metadata and description texts)."""
    steps = []
    current: Any = root
    for part in loc:
        base, meta = unwrap(current)
        if isinstance(base, type) and issubclass(base, BaseModel):
            field = _field(base, part)
            if field is None:
                current, meta = Any, []
            else:
                current = field.annotation
                inner_base, inner_meta = unwrap(current)
                meta = [field.description, *field.metadata, *inner_meta]
            steps.append((f".{part}", current, meta))
        elif get_origin(base) in (list, tuple):  # tuple: tuple[X, ...], a list in the file
            current = get_args(base)[0]
            steps.append((f"[{part}]", current, unwrap(current)[1]))
        elif get_origin(base) is dict:
            current = get_args(base)[1]
            steps.append((f".{part}", current, unwrap(current)[1]))
        else:
            current = Any
            steps.append((f".{part}", current, []))
    return steps


def _path(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    return "".join(text for text, _, _ in _steps(root, loc)).removeprefix(".")


def _expected_at(root: type[BaseModel], loc: tuple[Any, ...], is_key: bool) -> str:
    """What the schema wants at `loc`: the Expect or description of the innermost step that has one,
    or the mapping a model class stands for (every schema class is a mlharness.specs.schema.Doc, which says)."""
    if not loc:
        return root.expected  # type: ignore[attr-defined]
    if is_key:  # a key of a mapping field: loc is (..., the field, the key)
        mapping, _ = unwrap(_steps(root, loc[:-1])[-1][1])
        key_type = get_args(mapping)[0]
        return _text(unwrap(key_type)[1]) or _of_type(key_type, "a key")
    _, current, meta = _steps(root, loc)[-1]
    return _text(meta) or _of_type(current, "a valid value")


def _of_type(tp: Any, otherwise: str) -> str:
    """What a type without a description expects: its model's mapping, its Literal's choices, or the
    plain type's name."""
    base, _ = unwrap(tp)
    if isinstance(base, type) and issubclass(base, BaseModel):
        return base.expected  # type: ignore[attr-defined]
    if get_origin(base) is Literal:
        return f"one of {', '.join(map(str, get_args(base)))}"
    return _PLAIN.get(get_origin(base) or base, otherwise)


_PLAIN = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
          tuple: "a list", dict: "a mapping"}


def _text(meta: list[Any]) -> str | None:
    for item in meta:
        if isinstance(item, NamesOf):
            return item.expected()
    for item in meta:
        if isinstance(item, Expect):
            return item.text
    for item in meta:
        if isinstance(item, str) and item:
            return item
        description = getattr(item, "description", None)  # a Field(...) inside Annotated
        if description:
            return str(description)
    return None


def unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """A type without its Annotated metadata and its `X | None`: (the base type, the metadata)."""
    meta: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            args = get_args(tp)
            tp, meta = args[0], [*meta, *args[1:]]
        elif get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return tp, meta
            tp = rest[0]
        else:
            return tp, meta


def _field(model: type[BaseModel], part: Any) -> Any:
    for name, field in model.model_fields.items():
        if part in (name, field.alias):
            return field
    return None


def _allowed(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The fields of the model at `loc` (an unknown field's parent, always a model)."""
    base = unwrap(_steps(root, loc)[-1][1])[0] if loc else root
    return sorted(field.alias or name for name, field in base.model_fields.items())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(f"key {key!r} given twice")
        self.key, self.line, self.first_line = key, line, first_line


class _UniqueKeys:
    """A safe loader's constructor, but a mapping that names a key twice is refused: YAML keeps the last
    value without a word, so a manifest or grid would run with a value other than the one the reader
    saw first. A merge (`<<: *anchor`) followed by a key is YAML's override, not a duplicate."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    continue
                if earlier is not None:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1, earlier)
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)  # type: ignore[misc]


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """PyYAML's own parser: its error messages are the ones a user reads."""


class _FastUniqueKeyLoader(_UniqueKeys, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser (in PyYAML's wheels), about 7x faster; every run process loads all the manifests.
    A file it refuses is parsed again by _UniqueKeyLoader, whose message is the one reported."""


def load_yaml(path: Path) -> Any:
    """Parse one YAML file; a syntax error or a key given twice becomes one line naming the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ManifestError([f"{path}: byte {exc.start}: expected UTF-8 text, got {exc.object[exc.start:exc.start + 1]!r}"]) from None
    try:
        try:
            return yaml.load(text, Loader=_FastUniqueKeyLoader)  # noqa: S506 - a SafeLoader
        except yaml.YAMLError:
            return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except _DuplicateKey as exc:
        raise ManifestError([f"{path}: line {exc.line}: key {exc.key!r} given twice (first on line {exc.first_line}); "
                             f"YAML would keep only the last"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError([f"{path}: {where}: expected valid YAML, {problem}"]) from None
