"""DLSpec manifests: model, dataset, software, hardware, and reference logs. Each is its validated
schema document (mlharness.specs.schema), frozen, and carries the path and sha256 of its file so
that every result names what ran; the names here are the ones the runtime reads them by."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlharness.specs import schema

# Re-exported: other modules (and tests) read these here: the schemas' constants, the plugin entry
# points every registry keeps (mlharness.specs.plugins), the names the runtime's registries register.
from mlharness.specs.plugins import PluginEntryPoints, entry_points, load_entry_point  # noqa: F401
from mlharness.specs.schema import (  # noqa: F401
    CODE_REF,
    DECODINGS,
    DEVICE,
    DIM_NAME,
    ELEMENT_TYPES,
    GENERATIVE_FRAMEWORKS,
    SOURCE_ROLES,
    Artifact,
    Conversion,
)
from mlharness.specs.validation import (  # noqa: F401  (runtime registries register their names here)
    _NAME_SOURCES,
    NAME_OWNERS,
    ManifestError,
    _short,
    known_names,
    load_yaml,
    problems_from,
    register_names,
)

# One type per kind: the runtime's names for the schema documents (the same classes).
Manifest = schema.ManifestDoc
ModelManifest = schema.ModelDoc
DatasetManifest = schema.DatasetDoc
SoftwareManifest = schema.SoftwareDoc
HardwareManifest = schema.HardwareDoc
ReferenceLog = schema.ReferenceDoc
TensorSpec = schema.Tensor
GenerationSpec = schema.Generation
TensorRTOptions = schema.TensorRT


def parse(kind: str, doc: Any, path: Path, sha: str) -> Any:
    """Validate `doc` against `kind`'s schema (every problem at once, one line each): the manifest,
    located at `path` (relative paths inside it are taken from its folder)."""
    root = schema.SCHEMAS[kind]
    try:
        valid = root.model_validate(doc, context={"manifest": path})
    except ValidationError as exc:
        raise ManifestError(problems_from(exc, str(path), root, doc)) from None
    return valid.located(path, sha, doc)


def load_manifest(path: Path | str, kind: str | None = None) -> Any:
    """Load and validate one manifest file; its `kind` field picks the schema unless `kind` is given."""
    path = Path(path)
    doc = load_yaml(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    wanted = kind or (doc.get("kind") if isinstance(doc, dict) else None)
    if not isinstance(wanted, str) or wanted not in schema.SCHEMAS:
        got = doc.get("kind") if isinstance(doc, dict) else doc
        raise ManifestError([f"{path}: kind: expected one of {sorted(schema.SCHEMAS)}, got {_short(got)}"])
    return parse(wanted, doc, path, sha)
