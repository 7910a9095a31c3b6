"""The settings vocabulary of the YAML files that carry settings (scenario presets here, sweep grids
in mlharness.sweeps.grid_schema), as pydantic types: a setting's name must be a known LoadGen or
harness key and its value a scalar. Each value's own rule (a positive duration, a known choice) is
checked where the value is applied (mlharness.running.settings), which names the layer that set it."""
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from mlharness.running.setting_keys import SCOPES, SETTING_KEYS, setting_hint
from mlharness.specs.schema import Doc
from mlharness.specs.validation import Expect, refuse, refuse_all

SETTING_TEXT = "a setting name (a LoadGen user.conf key or a harness key)"
SCALAR_SCHEMA = {"type": ["string", "number", "integer", "boolean"]}


def _scalar(value: Any) -> Any:
    if not isinstance(value, (str, int, float, bool)):
        refuse("a number, a string or true/false")
    return value


def _setting_text(key: Any) -> str:
    """What an unknown setting name should have been: the closest known one, not all of them."""
    return f"a setting name ({setting_hint(key)})"


def _known_setting(key: Any) -> Any:
    if key not in SETTING_KEYS:
        refuse(_setting_text(key))
    return key


# One error for a value that is not a scalar (a union would give one per member).
Scalar = Annotated[Any, AfterValidator(_scalar), Expect("a number, a string or true/false"),
                   WithJsonSchema(SCALAR_SCHEMA)]
SettingName = Annotated[Any, BeforeValidator(_known_setting), Expect(SETTING_TEXT), WithJsonSchema({"enum": SETTING_KEYS})]
SettingValues = Annotated[dict[SettingName, Scalar], WithJsonSchema({
    "type": "object", "propertyNames": {"enum": SETTING_KEYS}, "additionalProperties": SCALAR_SCHEMA})]


def _flat_or_scoped(value: dict[Any, Any]) -> dict[Any, Any]:
    """A flat {key: value} mapping, or one scoped by '*' and scenario names; every key a known setting."""
    scoped = bool(value) and all(k in SCOPES for k in value)
    problems = []
    for scope, entry in (value.items() if scoped else [(None, value)]):
        if not isinstance(entry, dict):
            problems.append(((scope,), "a mapping of settings", entry))
            continue
        problems += [((scope, key) if scope else (key,), _setting_text(key), key) for key in entry
                     if key not in SETTING_KEYS]
        problems += [((scope, key) if scope else (key,), "a number, a string or true/false", v)
                     for key, v in entry.items() if not isinstance(v, (str, int, float, bool))]
    if problems:
        refuse_all(problems)
    return value


# A grid's `set:` and a model entry's `set:`: flat, or scoped by '*' and scenario names.
FlatOrScopedSettings = Annotated[
    dict[Any, Any], AfterValidator(_flat_or_scoped), Field(description="a mapping of settings"),
    WithJsonSchema({"type": "object", "description": "settings: {key: value}, or scoped by '*' and scenario names: "
                    "{Offline: {key: value}}", "propertyNames": {"enum": [*SETTING_KEYS, *SCOPES]},
                    "additionalProperties": {"anyOf": [SCALAR_SCHEMA, {
                        "type": "object", "propertyNames": {"enum": SETTING_KEYS},
                        "additionalProperties": SCALAR_SCHEMA}]}})]


class PresetDoc(Doc):
    """A scenario preset (scenarios/<name>.yaml): settings by scope, '*' first, then the scenario's."""

    expected: ClassVar[str] = "a mapping {description, settings}"

    description: str = Field("", description="what the preset is for")
    settings: dict[Literal[SCOPES], SettingValues | None] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="a mapping Scenario|'*' -> {key: value}")
