"""`mlharness specs`: list the shipped manifests, validate manifest files, and write the JSON
Schema files an editor's YAML language server uses to check and complete them while they are typed."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlharness.errors import UserError


def cmd_specs_list(args: argparse.Namespace) -> int:
    from mlharness.specs.index import KIND_FOLDERS, default_index

    index = default_index()
    for kind in KIND_FOLDERS:
        for manifest in index.all(kind):
            extra = f" [{manifest.framework}]" if kind == "model" else ""
            print(f"{kind:<9} {manifest.ref:<32}{extra:<14} {manifest.path}")
    return 0


def cmd_specs_validate(args: argparse.Namespace) -> int:
    from mlharness.specs.index import spec_files
    from mlharness.specs.manifests import load_manifest
    from mlharness.specs.validation import ManifestError

    paths = [Path(p) for p in args.paths] or spec_files()
    problems: list[str] = []
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.rglob("*.yaml")) if path.is_dir() else [path])
    for path in files:
        try:
            load_manifest(path)
        except ManifestError as exc:
            problems.extend(exc.problems)
        except UserError as exc:
            problems.append(str(exc))
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"{len(files)} manifest(s) valid")
    return 1 if problems else 0


def cmd_specs_schema(args: argparse.Namespace) -> int:
    from mlharness.schema_files import schema_models, write_schemas

    kinds = [args.kind] if args.kind else list(schema_models())
    for path in write_schemas(Path(args.out), kinds):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    specs = sub.add_parser("specs", help="list, validate or write the schemas of manifests").add_subparsers(
        dest="specs_command", required=True)
    specs.add_parser("list", help="list the manifests under specs/").set_defaults(func=cmd_specs_list)
    validate = specs.add_parser("validate", help="validate manifest files (default: all of specs/)")
    validate.add_argument("paths", nargs="*")
    validate.set_defaults(func=cmd_specs_validate)
    schema = specs.add_parser("schema", help="write JSON Schema files of the manifest kinds and sweep grids "
                              "(for an editor's YAML language server; see README)")
    schema.add_argument("kind", nargs="?", metavar="KIND",
                        help="model, dataset, software, hardware, reference or grid (default: all)")
    schema.add_argument("--out", required=True, metavar="DIR", help="folder for <kind>.schema.json files")
    schema.set_defaults(func=cmd_specs_schema)
