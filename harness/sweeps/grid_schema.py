"""A sweep grid's schema (pydantic, as the manifests' are in mlharness.specs.schema): which fields a grid file
may have and what each holds. mlharness.sweeps.sweep_grid validates a file with it (every problem at
once, one line each) and then checks what needs the specs index or the file system (that a named
manifest exists, that user_conf is a file) before expanding the grid into cells."""
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from mlharness.running.settings import MODES, SCENARIOS
from mlharness.running.settings_schema import SCALAR_SCHEMA, SETTING_KEYS, FlatOrScopedSettings, Scalar, SettingName
from mlharness.specs.schema import Doc
from mlharness.specs.validation import Expect, refuse

GRID_SCHEMA_VERSION = 1
NULL_HINT = " (quote \"null\": YAML reads a bare null as nothing)"
Settings = FlatOrScopedSettings


def _listed(value: Any) -> Any:
    """One value where a list is expected is a list of one (`scenarios: Offline`)."""
    return value if isinstance(value, list) else [value]


def one_or_many(item: Any, item_schema: dict[str, Any] | None, text: str) -> Any:
    """A non-empty list of `item`, or a single one; the JSON Schema says both where `item_schema`
    is given (else it says the list)."""
    listed = Annotated[list[item], BeforeValidator(_listed), Field(min_length=1, description=text)]
    if item_schema is None:
        return listed
    return Annotated[listed, WithJsonSchema({"anyOf": [item_schema, {"type": "array", "items": item_schema,
                                                                     "minItems": 1}], "description": text})]


def _backend(value: Any) -> Any:
    if not isinstance(value, str):
        refuse(f"a backend name or 'default'{NULL_HINT}")
    return value


Backend = Annotated[Any, BeforeValidator(_backend), Expect(f"a backend name or 'default'{NULL_HINT}"),
                    WithJsonSchema({"type": "string"})]
ManifestRef = Annotated[str, Field(min_length=1), Expect("a manifest name or path, or 'default'")]
_STRING = {"type": "string"}
Backends = one_or_many(Backend, _STRING, "backend names, or 'default'")
Datasets = one_or_many(ManifestRef, _STRING, "dataset manifest names or paths, or 'default'")
HardwareAxis = one_or_many(ManifestRef, _STRING, "hardware manifest names or paths, or 'default'")
SoftwareAxis = one_or_many(ManifestRef, _STRING, "software manifest names or paths, or 'default'")
Scenarios = one_or_many(Literal[SCENARIOS], {"enum": list(SCENARIOS)}, f"scenarios: {', '.join(SCENARIOS)}")
Values = one_or_many(Scalar, SCALAR_SCHEMA, "values to sweep")


def _name_alone_in_schema(schema: dict[str, Any]) -> None:
    """A model entry may be a model's name alone: the JSON Schema says so too."""
    entry = dict(schema)
    schema.clear()
    schema.update(anyOf=[{"type": "string"}, entry])


class ModelEntry(Doc):
    model_config = ConfigDict(json_schema_extra=_name_alone_in_schema)
    expected: ClassVar[str] = "a model name or {name, backends, datasets, set, endpoint}"

    name: str = Field(description="a model manifest name or path")
    backends: Backends | None = None
    datasets: Datasets | None = None
    set: Settings | None = None
    endpoint: str | None = Field(None, description="the server that runs this model (mlharness run --endpoint): "
                                                   "grpc://, http:// or openai+http:// HOST:PORT")

    @model_validator(mode="before")
    @classmethod
    def _a_name_alone(cls, data: Any) -> Any:
        if data is None:
            refuse(f"a model name or {{name, backends, datasets, set, endpoint}}{NULL_HINT}")
        return {"name": data} if isinstance(data, str) else data


class Cluster(Doc):
    expected: ClassVar[str] = "a mapping {cells_per_node: N}"

    cells_per_node: int = Field(1, ge=1, le=1000, description="an integer from 1 to 1000")


ModelEntries = one_or_many(ModelEntry, None, "model names or {name, backends, datasets, set, endpoint}")


def _one_model_in_schema(schema: dict[str, Any]) -> None:
    """`models: resnet50-light` (one name, no list) is a grid's too: the JSON Schema says so."""
    models = schema["properties"]["models"]
    schema["properties"]["models"] = {"anyOf": [{"type": "string"}, models], "description": models.get("description")}


class GridDoc(Doc):
    """A sweep grid: models x backends x datasets x hardware x software x scenarios x swept settings."""

    model_config = ConfigDict(json_schema_extra=_one_model_in_schema)

    expected: ClassVar[str] = "a mapping with models, scenarios, ..."

    schema_version: Literal[GRID_SCHEMA_VERSION] = Field(GRID_SCHEMA_VERSION, description=str(GRID_SCHEMA_VERSION))
    name: str | None = Field(None, description="the sweep's name (default: the file's stem)")
    description: str = Field("", description="a description")
    models: ModelEntries
    backends: Backends = ["default"]
    datasets: Datasets | None = None
    hardware: HardwareAxis | None = None
    software: SoftwareAxis | None = None
    scenarios: Scenarios
    mode: Literal[MODES] = Field("performance", description=f"one of {', '.join(MODES)}")
    batch_sizes: Values | None = Field(None, description="batch sizes to sweep")
    threads: Values | None = Field(None, description="intra-op thread counts to sweep")
    settings: dict[SettingName, Values] = Field(
        default_factory=dict, description="a mapping setting -> list of values to sweep",
        json_schema_extra={"propertyNames": {"enum": SETTING_KEYS}})
    set: Settings | None = None
    quick: bool = Field(False, description="true or false: the quick preset for every cell")
    presets: list[str] = Field(default_factory=list, description="a list of preset names")
    profile: list[str] = Field(default_factory=list, description="a list of profiling levels")
    user_conf: str | None = Field(None, description="a LoadGen user.conf file for every cell")
    repeat: int = Field(1, ge=1, description="an integer >= 1")
    timeout: float = Field(900.0, gt=0, description="a number of seconds > 0")
    exclude: list[dict[str, Any]] = Field(default_factory=list,
                                          description="a list of mappings such as {model: m, scenario: S}")
    cluster: Cluster | None = Field(None, description=Cluster.expected)
