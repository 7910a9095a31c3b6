"""Manifest-declared conversions: a model manifest's source may be *made* from another model manifest
(`sources.graph.convert: {from, to, opset}`), e.g. an ONNX graph exported from a torch module.

The export is a recorded step. Its output lives in the cache (`<cache>/converted/<name>-<to>-<key>/`)
beside `<file>.sha256` and `<file>.provenance.json` (source manifest, its verified files, exporter and
version, opset, dynamic axes, a numeric check against the source). The cache key covers everything
the output depends on, so a changed source, factory module (or a module of its package it imports),
option or exporter version converts again; a cached file is reused only if its sha256 still matches
its provenance. A manifest never pins a converted file's sha256: weight folding does float math
whose last bits depend on the CPU's kernels, so the bytes differ between machines; the output check
against the source is the gate and the sha256 is recorded (provenance, run record, results database)."""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlharness.atomic_io import write_json, write_text
from mlharness.errors import UserError
from mlharness.specs import artifacts
from mlharness.specs.manifests import (
    Artifact,
    Conversion,
    HardwareManifest,
    ModelManifest,
    load_manifest,
    register_names,
)
from mlharness.sut.factory_code import factory_code_sha256

PROVENANCE_SCHEMA_VERSION = 1
CHECK_TOLERANCE = 1e-3  # max |diff| allowed between source and export, relative to the output's scale

Exporter = Callable[[ModelManifest, dict[str, Path], Conversion, Path], dict[str, Any]]


@dataclass(frozen=True)
class _ExporterEntry:
    func: Exporter
    suffix: str
    packages: tuple[str, ...]  # whose versions change the output (part of the cache key)


_EXPORTERS: dict[tuple[str, str], _ExporterEntry] = {}


def exporter(source_framework: str, target: str, suffix: str, packages: tuple[str, ...]) -> Callable[[Exporter], Exporter]:
    def register(func: Exporter) -> Exporter:
        _EXPORTERS[(source_framework, target)] = _ExporterEntry(func, suffix, packages)
        return func
    return register


def targets() -> list[str]:
    """The formats a manifest's `convert.to` may name: those some exporter makes."""
    return list(dict.fromkeys(target for _, target in _EXPORTERS))


@dataclass(frozen=True)
class Converted:
    path: Path
    sha256: str
    provenance_path: Path
    provenance: dict[str, Any]
    reused: bool  # True when the cached output was verified and used as is


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def source_manifest(conversion: Conversion, base: Path, where: str) -> ModelManifest:
    path = Path(conversion.source)
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise UserError(f"{where}: convert.from: no model manifest at {path}")
    return load_manifest(path, "model")


def _factory_code_sha(source: ModelManifest) -> str | None:
    """The digest of a `module:function` factory's code (mlharness.sut.factory_code): editing it, or a
    module of its package it imports, must convert again."""
    factory = (source.factory or "").strip()
    if "\n" in factory or ":" not in factory:
        return None  # inline source is part of the manifest, whose sha256 is already in the key
    return factory_code_sha256(factory.partition(":")[0])


def _key_material(source: ModelManifest, conversion: Conversion, entry: _ExporterEntry) -> dict[str, Any]:
    return {
        "schema": PROVENANCE_SCHEMA_VERSION,
        "source_manifest_sha256": source.sha256,
        "source_files": {k: a.sha256 for k, a in sorted(source.sources.items())},
        "factory_sha256": _factory_code_sha(source),
        "conversion": conversion.describe(),
        "exporter_versions": {p: _package_version(p) for p in entry.packages},
    }


def _read_provenance(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def convert(artifact: Artifact, where: str, base: Path, force: bool = False) -> Converted:
    """The converted file for `artifact` (which must carry a Conversion), from the cache or made now."""
    conversion = artifact.convert
    if conversion is None:
        raise UserError(f"{where}: declares no conversion")
    source = source_manifest(conversion, base, where)
    entry = _EXPORTERS.get((source.framework, conversion.to))
    if entry is None:
        known = ", ".join(f"{a}->{b}" for a, b in _EXPORTERS)
        raise UserError(f"{where}: convert: no exporter from {source.framework} to {conversion.to} (known: {known})")
    material = _key_material(source, conversion, entry)
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    folder = artifacts.cache_dir() / "converted" / f"{source.name}-{conversion.to}-{key[:16]}"
    out = folder / f"{source.name}{entry.suffix}"
    provenance_path = out.with_name(out.name + ".provenance.json")
    if not force:
        cached = _verified_cache(out, provenance_path)
        if cached is not None:
            return cached
    files = artifacts.resolve_all(source)  # verifies every source file's sha256 before export
    partial = folder / f".{out.name}.{os.getpid()}.partial"  # one per process: concurrent runs never share it
    folder.mkdir(parents=True, exist_ok=True)
    try:
        details = entry.func(source, files, conversion, partial)
    except UserError:
        partial.unlink(missing_ok=True)
        raise
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"{where}: converting {source.path} to {conversion.to} failed: {type(exc).__name__}: {exc}") from None
    sha = artifacts.sha256_file(partial)
    os.replace(partial, out)
    write_text(out.with_name(out.name + ".sha256"), f"{sha}  {out.name}\n")
    provenance = {
        "schema_version": PROVENANCE_SCHEMA_VERSION,
        "artifact": {"path": str(out), "sha256": sha, "bytes": out.stat().st_size, "format": conversion.to},
        "source": {"manifest": source.identity(), "framework": source.framework, "factory": source.factory,
                   "factory_sha256": material["factory_sha256"],
                   "files": {k: {"uri": a.uri, "sha256": a.sha256, "path": str(files[k])}
                             for k, a in sorted(source.sources.items())}},
        "conversion": conversion.describe(),
        "exporter": details,
        "cache_key": key,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    write_json(provenance_path, provenance)  # written last: its presence marks a complete conversion
    return Converted(out, sha, provenance_path, provenance, reused=False)


def _verified_cache(out: Path, provenance_path: Path) -> Converted | None:
    provenance = _read_provenance(provenance_path)
    if provenance is None or not out.is_file():
        return None
    recorded = provenance.get("artifact", {}).get("sha256")
    sha = artifacts.sha256_file(out)
    if sha != recorded:
        return None  # damaged or half-replaced: convert again
    return Converted(out, sha, provenance_path, provenance, reused=True)


def resolve_conversion(artifact: Artifact, where: str, base: Path) -> Path:
    """What mlharness.specs.artifacts.resolve calls for a converted source: a verified local file."""
    return convert(artifact, where, base).path


artifacts.register_converter(resolve_conversion)
register_names("conversion target", targets)  # the spec layer checks `convert.to` against the exporters


# -- exporters -------------------------------------------------------------------------------------

def _example_inputs(source: ModelManifest, dims: dict[str, int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in source.inputs:
        shape = tuple(int(dims.get(d, 2)) if isinstance(d, str) else d for d in spec.shape)
        if np.dtype(spec.element_type).kind == "f":
            arrays.append(rng.standard_normal(shape).astype(spec.element_type))
        else:
            arrays.append(np.ones(shape, spec.element_type))  # valid as token ids, masks and type ids alike
    return arrays


def _dynamic_axes(source: ModelManifest) -> dict[str, dict[int, str]]:
    return {spec.name: {i: d for i, d in enumerate(spec.shape) if isinstance(d, str)}
            for spec in (*source.inputs, *source.outputs) if any(isinstance(d, str) for d in spec.shape)}


def _cpu_hardware() -> HardwareManifest:
    return HardwareManifest(kind="hardware", name="conversion-cpu", version="1.0.0", device="cpu").located(
        Path("<conversion>"), "")


@exporter("torch", "onnx", ".onnx", ("torch",))
def torch_to_onnx(source: ModelManifest, files: dict[str, Path], conversion: Conversion, out: Path) -> dict[str, Any]:
    """torch.onnx.export (TorchScript exporter) of the source manifest's module; symbolic dims of the
    source's declared inputs and outputs become dynamic axes with the same names."""
    import torch

    from mlharness.sut.backends.torch_backend import TorchBackend

    backend = TorchBackend(model=source, sources=files, hardware=_cpu_hardware(), options={})
    backend.load()
    wrapper = _positional_module(torch, backend.module, backend.input_names, backend.output_names,
                                backend.keyword_inputs).eval()
    dims = dict(conversion.example_dims)
    example = [torch.from_numpy(a) for a in _example_inputs(source, dims, seed=0)]
    opset = conversion.opset or 17
    dynamic_axes = _dynamic_axes(source)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(wrapper, tuple(example), str(out), input_names=backend.input_names,
                          output_names=backend.output_names, dynamic_axes=dynamic_axes, opset_version=opset,
                          do_constant_folding=True, dynamo=False)
    seen = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})
    check = _check_against_source(source, backend, out, dims)
    return {"name": "torch.onnx.export", "dynamo": False, "torch": torch.__version__, "opset": opset,
            "dynamic_axes": {k: {str(i): d for i, d in v.items()} for k, v in dynamic_axes.items()},
            "example_dims": dims, "warnings": seen[:20], "check": check}


def _check_against_source(source: ModelManifest, backend: Any, graph: Path, dims: dict[str, int]) -> dict[str, Any]:
    """Run the export and the source on other example sizes (one more in each symbolic dim, so a size
    baked in at trace time shows up) and compare; a difference above tolerance fails the conversion."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {"skipped": "onnxruntime is not installed"}
    symbolic = {d for spec in source.inputs for d in spec.shape if isinstance(d, str)}
    bigger = {d: int(dims.get(d, 2)) + 1 for d in symbolic}
    inputs = dict(zip(backend.input_names, _example_inputs(source, bigger, seed=1)))
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    got = dict(zip(backend.output_names, session.run(backend.output_names, inputs)))
    expected = backend.predict(inputs)
    diffs = {}
    for name in backend.output_names:
        ref = np.asarray(expected[name], np.float64)
        diff = float(np.max(np.abs(np.asarray(got[name], np.float64) - ref))) if ref.size else 0.0
        scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
        diffs[name] = diff
        if not diff <= CHECK_TOLERANCE * scale:
            raise UserError(f"{source.path}: the ONNX export disagrees with the torch module on output {name!r}: "
                            f"max |diff| {diff:.3g} > {CHECK_TOLERANCE * scale:.3g} at dims {bigger}")
    return {"dims": bigger, "max_abs_diff": diffs, "tolerance": CHECK_TOLERANCE}


def _positional_module(torch: Any, module: Any, input_names: list[str], output_names: list[str], keyword: bool) -> Any:
    """A module taking the inputs positionally and returning a tuple of the named outputs, which is
    what the exporter traces (transformers models take keywords and return a dict-like output)."""

    class PositionalModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *args: Any) -> Any:
            raw = self.inner(**dict(zip(input_names, args))) if keyword else self.inner(*args)
            if isinstance(raw, torch.Tensor):
                return raw
            if hasattr(raw, "keys"):
                return tuple(raw[name] for name in output_names)
            return tuple(raw)[: len(output_names)]

    return PositionalModule()
