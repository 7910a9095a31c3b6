"""`mlharness convert MODEL`: run (or verify from the cache) the conversions a model's manifests
declare, e.g. the ONNX export of a torch model, and print where each file, its sha256 and its
provenance are. Runs do the same on first use; this command makes the step explicit."""
from __future__ import annotations

import argparse
import os
from typing import Any

from mlharness.errors import UserError


def manifests_with_conversions(name_or_path: str, backend: str | None) -> list[Any]:
    from mlharness.specs.index import default_index

    index = default_index()
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        candidates = [index.find("model", name_or_path)]
    else:
        candidates = index.named("model", name_or_path) or [index.find("model", name_or_path)]
    if backend:
        candidates = [m for m in candidates if m.framework == backend]
    found = [m for m in candidates if any(a.convert for a in m.sources.values())]
    if not found:
        which = f" for backend {backend!r}" if backend else ""
        raise UserError(f"model {name_or_path!r}{which}: no manifest declares a conversion (sources.<role>.convert)")
    return found


def cmd_convert(args: argparse.Namespace) -> int:
    from mlharness.sut.conversion import convert

    for manifest in manifests_with_conversions(args.model, args.backend):
        for role, artifact in manifest.sources.items():
            if artifact.convert is None:
                continue
            where = f"{manifest.path}: sources.{role}"
            done = convert(artifact, where, manifest.path.parent, force=args.force)
            state = "cached (verified)" if done.reused else "converted"
            check = done.provenance.get("exporter", {}).get("check", {}).get("max_abs_diff")
            print(f"{manifest.name} [{manifest.framework}] sources.{role}: {state}")
            print(f"  file       : {done.path}")
            print(f"  sha256     : {done.sha256}")
            print(f"  provenance : {done.provenance_path}")
            if check:
                print(f"  check      : max |diff| vs source {', '.join(f'{k}={v:.3g}' for k, v in check.items())}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("convert", help="run the conversions a model manifest declares (e.g. torch -> ONNX)")
    parser.add_argument("model", help="model manifest name (under specs/models) or path")
    parser.add_argument("--backend", help="only the manifest for this backend (e.g. onnxruntime)")
    parser.add_argument("--force", action="store_true", help="convert again even when a verified cached file exists")
    parser.set_defaults(func=cmd_convert)
