"""`mlharness compare-outputs MODEL --dataset D --backends torch,onnxruntime`: the same samples through
two backends' manifests of one model; per output, max |diff|, cosine similarity and top-1
agreement; exit 1 when any is beyond the tolerance.

A generative model (`--backends transformers,llama_cpp`) is compared by its tokens: per sample, the
prompt ids, the generated ids, the first differing position and the token agreement; exit 1 when
fewer samples than --min-agreement generate identical ids. `--generations A.jsonl,B.jsonl` compares
two accuracy runs' accuracy/generations.jsonl instead (the ids LoadGen logged; no engine is loaded)."""
from __future__ import annotations

import argparse
from pathlib import Path


def cmd_compare_outputs(args: argparse.Namespace) -> int:
    from mlharness.atomic_io import write_json
    from mlharness.compare.divergence import (
        Tolerance,
        compare_backends,
        compare_generation_logs,
    )
    from mlharness.errors import UserError
    from mlharness.specs.index import default_index

    if args.generations:
        paths = tuple(Path(p.strip()) for p in args.generations.split(",") if p.strip())
        if len(paths) != 2:
            raise UserError(f"--generations: expected two generations.jsonl files, comma-separated, got {args.generations!r}")
        report = compare_generation_logs(paths, args.min_agreement)  # type: ignore[arg-type]
        print(report.text(), end="")
        if args.json:
            write_json(Path(args.json), report.as_dict())
        return 0 if report.passed else 1
    if not args.model:
        raise UserError("compare-outputs: expected a model name (or --generations A.jsonl,B.jsonl)")
    # Both are slice bounds below: a negative one would compare the wrong rows, and say so nowhere.
    if args.batch_size < 0:
        raise UserError(f"--batch-size: expected a number of samples >= 0 (0 = the model's max_batch_size), "
                        f"got {args.batch_size}")
    if args.limit < 0:
        raise UserError(f"--limit: expected a number of samples >= 0 (0 = all), got {args.limit}")
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    tolerance = Tolerance(args.tolerance, args.min_cosine, args.min_agreement)
    report = compare_backends(default_index(), args.model, args.dataset, backends, tolerance,
                              hardware=args.hardware, limit=args.limit, batch_size=args.batch_size)
    print(report.text(), end="")
    if args.json:
        write_json(Path(args.json), report.as_dict())
    return 0 if report.passed else 1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("compare-outputs", help="run two backends on the same samples and compare their outputs")
    parser.add_argument("model", nargs="?", help="model name with a manifest for each backend")
    parser.add_argument("--dataset", help="dataset manifest name or path (default: the model's)")
    parser.add_argument("--backends", default="torch,onnxruntime", help="two backends, comma-separated (default: torch,onnxruntime)")
    parser.add_argument("--hardware", default="cpu", help="hardware manifest (default: cpu)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N samples (default: all)")
    parser.add_argument("--batch-size", type=int, default=0, help="batch size (default: the model's max_batch_size)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest allowed max |diff| (default: 1e-3)")
    parser.add_argument("--min-cosine", type=float, default=0.9999, help="smallest allowed mean cosine similarity (default: 0.9999)")
    parser.add_argument("--min-agreement", type=float, default=1.0,
                        help="smallest allowed top-1 agreement; for a generative model, the fraction of samples "
                             "generating identical token ids (default: 1.0)")
    parser.add_argument("--generations", help="two accuracy runs' accuracy/generations.jsonl, comma-separated: "
                                              "their token agreement (a generative model; no MODEL needed)")
    parser.add_argument("--json", help="also write the report as JSON to this file")
    parser.set_defaults(func=cmd_compare_outputs)
