"""JSON Schema files of the manifest kinds (and of sweep grids), written from the same pydantic
models that validate them, for editors: a YAML language server pointed at them checks and
completes a manifest while it is typed. The schemas say what JSON Schema can say (types, patterns,
required fields, what a framework needs); the loader's checks that need code (a version constraint
that parses, a name a plugin registered after the schema was written) stay the loader's."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mlharness.atomic_io import write_text
from mlharness.errors import UserError

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_models() -> dict[str, type[BaseModel]]:
    """Every kind that has a schema: the manifest kinds, `grid` (a sweep grid) and `preset` (a scenario preset)."""
    from mlharness.running.settings_schema import PresetDoc
    from mlharness.sweeps.grid_schema import GridDoc
    from mlharness.specs.schema import SCHEMAS

    return {**SCHEMAS, "grid": GridDoc, "preset": PresetDoc}


def json_schema(kind: str) -> dict[str, Any]:
    models = schema_models()
    if kind not in models:
        raise UserError(f"specs schema: KIND: expected one of {', '.join(models)}, got {kind!r}")
    found = models[kind].model_json_schema(by_alias=True)
    return {"$schema": DIALECT, "$id": f"mlharness-{kind}.schema.json",
            "title": f"mlharness {kind} {'file' if kind in ('grid', 'preset') else 'manifest'}", **found}


def write_schemas(out: Path, kinds: list[str] | None = None) -> list[Path]:
    """`<out>/<kind>.schema.json` for each kind (all of them by default); each file is written whole
    or not at all."""
    written = []
    for kind in kinds or list(schema_models()):
        path = out / f"{kind}.schema.json"
        text = json.dumps(json_schema(kind), indent=2, sort_keys=False) + "\n"
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_text(path, text)
        except OSError as exc:
            raise UserError(f"{path}: cannot write: {exc.strerror or exc}") from None
        written.append(path)
    return written
