"""Layer-level benchmarks over a suite (issue 13, docs/bricks.md): for each model, the composed
estimate from its bricks against its latency measured whole by LoadGen (SingleStream p50, batch 1),
its lower bound, and the suite's benchmarking time against benchmarking every model whole to the
same confidence.

The suite: the shipped ONNX models (resnet50-light, mobilenet-v2 on ONNX Runtime, converted from its
torch manifest) and the onnx wheel's `light_*` graphs, each through a model manifest written here as
a user would (the graph's input and output, synthetic-images, ImageNet preprocessing). The models run
in order, as `mlharness bricks` runs a suite, so later models reuse earlier ones' bricks from the
results database.

The zoo (issue 39): `--zoo` builds the zoo's members as `mlharness zoo build` does (into the cache's
zoo folder) and adds their manifests to the suite, family by family (`--family F` and `--member NAME`,
both repeatable, choose fewer; `--zoo-only` drops the suite above). `--hold-out NAME` (repeatable)
leaves a zoo member out of the suite; after the suite it is composed from the stored bricks as
`mlharness bricks --estimate-only --measure-missing` does (only the bricks not stored are measured,
and counted as new measurements), then measured whole by LoadGen with the suite's settings, for its
error. Held-out members run in the order given, so a later one may reuse an earlier one's new bricks.
`--threads N` sets intra_op_threads for the bricks and the LoadGen runs alike (1 on a noisy 2-core
machine, where the model's second thread is preempted and the whole-model figure with it).

Figures: each model's estimate error (vs LoadGen and vs a plain session), the share of models within
2%, 5% and 10% of each, the speedup = (sum of the seconds each model took to reach the confidence
rule whole) / (sum of the seconds the bricks took, reuse included) and without reuse, the held-out
rows, and the machine's load average at the start and the end. Printed, and written to
bench/out/bricks.json (or --out). A model whose run fails is listed under `failed` with its one-line
error and the rest of the suite still runs; the exit status is then 1.

    .venv/bin/python bench/bricks.py [--models resnet50-light light_vgg19 ...] [--time-cap 1] [--no-variants]
    .venv/bin/python bench/bricks.py --zoo-only [--family squeezenet] [--hold-out squeezenet-1.1] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlharness.bricks import compose  # noqa: E402
from mlharness.bricks.estimate import MEASURE_MISSING  # noqa: E402
from mlharness.bricks.suite import measuring_request, run_suite  # noqa: E402
from mlharness.errors import RunInterrupted, UserError  # noqa: E402
from mlharness.records.run_record import RunRecord  # noqa: E402
from mlharness.running.launcher import run_request  # noqa: E402
from mlharness.running.request import RunRequest  # noqa: E402
from mlharness.sut import zoo  # noqa: E402
from mlharness.tables import format_table  # noqa: E402

OUT = ROOT / "bench" / "out" / "bricks.json"
LIGHT = ("resnet50", "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet",
         "vgg19", "zfnet512")
SHIPPED = ("resnet50-light", "mobilenet-v2")

MANIFEST = """\
kind: model
name: {name}
version: 1.0.0
description: The onnx wheel's {stem} graph, through a manifest written for the bricks bench.
framework: {{name: onnxruntime, version: ">=1.17"}}
dataset: synthetic-images
inputs: [{{name: "{input}", type: image, element_type: float32, shape: [batch, 3, 224, 224], layout: NCHW}}]
outputs: [{{name: "{output}", type: probabilities, element_type: float32, shape: {output_shape}}}]
sources:
  graph: {{uri: "package://onnx/backend/test/data/light/{stem}.onnx", sha256: {sha256}}}
preprocess: |
  import numpy as np

  MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
  STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)

  def preprocess(image, ctx):
      h, w, _ = image.shape
      top, left = (h - 224) // 2, (w - 224) // 2
      crop = image[top:top + 224, left:left + 224].astype(np.float32) / 255.0
      return (crop.transpose(2, 0, 1) - MEAN) / STD
attributes:
  max_batch_size: 1
  performance_sample_count: 64
  settings: {{SingleStream: {{target_latency: 50}}}}
"""


def light_manifest(folder: Path, short: str) -> Path:
    """A user's manifest for light_<short>.onnx: its input and output read from the graph."""
    import hashlib

    import onnx

    stem = f"light_{short}"
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{stem}.onnx"
    model = onnx.load(path)
    weights = {init.name for init in model.graph.initializer}
    (graph_input,) = [i for i in model.graph.input if i.name not in weights]
    graph_output = model.graph.output[0]
    dims = [d.dim_value for d in graph_output.type.tensor_type.shape.dim]
    text = MANIFEST.format(name=stem.replace("_", "-"), stem=stem, input=graph_input.name, output=graph_output.name,
                           output_shape=json.dumps(["batch", *dims[1:]]),
                           sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    out = folder / f"{stem}.yaml"
    out.write_text(text)
    return out


def zoo_choice(args: argparse.Namespace) -> tuple[list[zoo.ZooMember], list[zoo.ZooMember]]:
    """The zoo members of the suite, in family order (with --zoo and nothing chosen: every member), and
    the held-out ones, left out of the suite. Unknown names are one line each, before anything is built."""
    known = zoo.families()
    unknown = [f for f in args.family if f not in known]
    if unknown:
        raise UserError(f"--family {unknown[0]}: not a zoo family (known: {', '.join(known)})")
    named = {zoo.member(name) for name in args.member}  # an unknown name is one line, with close names
    held = list(dict.fromkeys(zoo.member(name) for name in args.hold_out))
    every = not args.family and not args.member
    chosen = [m for m in zoo.ZOO if args.zoo and (every or m.family in args.family or m in named) and m not in held]
    return sorted(chosen, key=lambda m: known.index(m.family)), held  # sorted is stable: zoo order within a family


def build_members(members: list[zoo.ZooMember]) -> dict[str, str]:
    """Each member built as `mlharness zoo build` does (converted, or its cached graph verified); its manifest's path."""
    paths: dict[str, str] = {}
    for i, zoo_member in enumerate(members, 1):
        built = zoo.build(zoo_member)
        paths[zoo_member.name] = str(built.manifest)
        print(f"zoo {i}/{len(members)}: {zoo_member.name} ({zoo_member.family}) "
              f"{'cached (verified)' if built.reused else 'converted'} in {built.seconds:.1f} s", flush=True)
    return paths


def suite_row(record: RunRecord, families: dict[str, str]) -> dict[str, Any]:
    s = record.bricks["summary"]
    return {"model": record.model_name, "family": families.get(record.model_name), "nodes": s["nodes"],
            "unique_bricks": s["unique_bricks"], "reused_bricks": s["reused_bricks"], "estimate_ms": s["estimate_ms"],
            "lower_bound_ms": s["lower_bound_ms"], "measured_ms": s["measured_ms"],
            "error_pct": s["error_pct"], "plain_session_ms": s["plain_session_ms"],
            "plain_session_error_pct": s["plain_session_error_pct"],
            "brick_seconds": s["brick_seconds"], "variant_seconds": s["variant_seconds"],
            "reuse_saved_seconds": s["reuse_saved_seconds"], "whole_model_seconds": s["whole_model_seconds"],
            "whole_model_stable": s["whole_model_stable"], "phase_seconds": s.get("phase_seconds"),
            "run_id": record.run_id, "measured_run": s["measured_run"], "results_path": record.results_path}


def held_out_row(name: str, manifest: str, base: RunRequest, say: Callable[[str], None]) -> dict[str, Any]:
    """The held-out member composed from the stored bricks (measuring only the missing ones, as
    `mlharness bricks --estimate-only --measure-missing`), then measured whole by LoadGen as the
    suite's models are, after the estimate, so the estimate cannot lean on it."""
    estimated = run_suite([manifest], replace(base, brick_estimate=MEASURE_MISSING), measure=False, say=say).bricks[0]
    s = estimated.bricks["summary"]
    measured = run_request(measuring_request(replace(base, model=manifest), base.batch))
    p50 = measured.perf.p50_latency_ns if measured.perf else None
    measured_ms = float(p50) / 1e6 if p50 else None
    error = compose.error_pct(s["estimate_ms"], measured_ms)
    say(f"{name} (held out): estimate {s['estimate_ms']:.3f} ms, measured {measured_ms or float('nan'):.3f} ms "
        f"(LoadGen p50, run {measured.run_id})" + (f", error {error:+.1f}%" if error is not None else "")
        + f"; {s['new_measurements']} new measurements")
    return {"model": name, "nodes": s["nodes"], "unique_bricks": s["unique_bricks"],
            "reused_bricks": s["reused_bricks"], "missing_bricks": s["missing_bricks"],
            "empty_call_measured": s["empty_call_measured"], "new_measurements": s["new_measurements"],
            "estimate_ms": s["estimate_ms"], "estimate_ci_ms": s["estimate_ci_ms"], "measured_ms": measured_ms,
            "error_pct": error, "estimate_seconds": s["estimate_seconds"], "brick_seconds": s["brick_seconds"],
            "run_id": estimated.run_id, "measured_run": measured.run_id, "results_path": estimated.results_path}


def share_within(errors: list[float], limit: float) -> float | None:
    return sum(abs(e) <= limit for e in errors) / len(errors) if errors else None


def summarize(rows: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    errors = [r["error_pct"] for r in rows if r["error_pct"] is not None]
    plain = [r["plain_session_error_pct"] for r in rows if r["plain_session_error_pct"] is not None]
    whole = sum(r["whole_model_seconds"] or 0.0 for r in rows)
    bricks = sum(r["brick_seconds"] for r in rows)
    without_reuse = bricks + sum(r["reuse_saved_seconds"] for r in rows)
    # The machine's own noise floor: the two whole-model references of the same model, in the same run.
    references = [reference_gap_pct(r) for r in rows if r["measured_ms"] and r["plain_session_ms"]]
    return {
        "models": len(rows),
        "within_2pct": share_within(errors, 2), "within_5pct": share_within(errors, 5),
        "within_10pct": share_within(errors, 10),
        "mean_abs_error_pct": sum(map(abs, errors)) / len(errors) if errors else None,
        "plain_within_2pct": share_within(plain, 2), "plain_within_5pct": share_within(plain, 5),
        "plain_within_10pct": share_within(plain, 10),
        "plain_mean_abs_error_pct": sum(map(abs, plain)) / len(plain) if plain else None,
        "whole_model_seconds": whole, "brick_seconds": bricks, "brick_seconds_without_reuse": without_reuse,
        "speedup": whole / bricks if bricks else None,
        "speedup_without_reuse": whole / without_reuse if without_reuse else None,
        "unique_bricks": sum(r["unique_bricks"] for r in rows), "reused_bricks": sum(r["reused_bricks"] for r in rows),
        "references_gap_median_pct": statistics.median(references) if references else None,
        "references_within_5pct": share_within(references, 5),
        "wall_seconds": wall,
    }


def reference_gap_pct(row: dict[str, Any]) -> float:
    """How far LoadGen's p50 and the plain session of one model are apart, in % of the plain session."""
    return abs(row["measured_ms"] / row["plain_session_ms"] - 1) * 100


def _pct(share: float | None) -> str:
    return f"{share:.0%}" if share is not None else "-"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _signed(value: float | None) -> str:
    return f"{value:+.1f}%" if value is not None else "-"


def print_figures(rows: list[dict[str, Any]], held: list[dict[str, Any]], summary: dict[str, Any],
                  machine: dict[str, Any]) -> None:
    print(format_table(("model", "bricks", "reused", "estimate ms", "measured ms", "error", "plain ms", "vs plain",
                        "lower bound ms"),
                       [(r["model"], r["unique_bricks"], r["reused_bricks"], r["estimate_ms"], r["measured_ms"],
                         _signed(r["error_pct"]), r["plain_session_ms"], _signed(r["plain_session_error_pct"]),
                         r["lower_bound_ms"]) for r in rows]))
    print(f"within 5%: {_pct(summary['within_5pct'])} of {summary['models']} models, within 2%: "
          f"{_pct(summary['within_2pct'])}, within 10%: {_pct(summary['within_10pct'])} (LoadGen p50); against the "
          f"plain session: {_pct(summary['plain_within_5pct'])}, {_pct(summary['plain_within_2pct'])}, "
          f"{_pct(summary['plain_within_10pct'])}")
    if summary["references_gap_median_pct"] is not None:
        print(f"noise floor: LoadGen's p50 and the plain session of the same model are a median "
              f"{summary['references_gap_median_pct']:.1f}% apart (within 5% for {_pct(summary['references_within_5pct'])}"
              f" of the models); errors smaller than that are not resolved on this machine")
    print(f"benchmarking time: whole models {summary['whole_model_seconds']:.1f} s, bricks "
          f"{summary['brick_seconds']:.1f} s (reuse included; {summary['brick_seconds_without_reuse']:.1f} s without), "
          f"speedup {_x(summary['speedup'])} ({_x(summary['speedup_without_reuse'])} without reuse)")
    if held:
        print(format_table(("held out", "bricks", "missing", "new measurements", "estimate ms", "measured ms", "error",
                            "estimate s"),
                           [(h["model"], h["unique_bricks"], h["missing_bricks"], h["new_measurements"], h["estimate_ms"],
                             h["measured_ms"], _signed(h["error_pct"]), h["estimate_seconds"]) for h in held]))
    print(f"machine: {machine['cpu_count']} CPUs ({machine['cpus_available']} available), intra_op_threads "
          f"{machine['threads'] if machine['threads'] is not None else 'default'}, load average "
          f"{machine['loadavg_start'][0]:.2f} at the start, {machine['loadavg_end'][0]:.2f} at the end")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=[*SHIPPED, *(f"light_{m}" for m in LIGHT)])
    parser.add_argument("--time-cap", type=float, default=1.0, help="seconds of timed calls per brick")
    parser.add_argument("--no-variants", action="store_true", help="no lower bound (faster)")
    parser.add_argument("--measure-ms", type=int, default=5000, help="min_duration of the LoadGen run, ms")
    parser.add_argument("--results-dir", type=Path, help="keep the results here (default: a temp folder)")
    parser.add_argument("--zoo", action="store_true", help="add the zoo's members to the suite, family by family")
    parser.add_argument("--zoo-only", action="store_true", help="the zoo's members only (implies --zoo)")
    parser.add_argument("--family", action="append", default=[], metavar="F", help="only this zoo family (repeatable; implies --zoo)")
    parser.add_argument("--member", action="append", default=[], metavar="NAME", help="this zoo member (repeatable; implies --zoo)")
    parser.add_argument("--hold-out", action="append", default=[], metavar="NAME",
                        help="a zoo member left out of the suite, then estimated from its stored bricks (repeatable)")
    parser.add_argument("--threads", type=int, metavar="N", help="intra_op_threads for the bricks and LoadGen runs")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the JSON's path (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    args.zoo = args.zoo or args.zoo_only or bool(args.family or args.member)
    if args.threads is not None and args.threads < 0:
        parser.error("--threads: expected 0 (ONNX Runtime's default) or more")
    return args


def main() -> int:
    args = parse_args()
    machine = {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
               "cpus_available": len(os.sched_getaffinity(0)), "threads": args.threads,
               "loadavg_start": list(os.getloadavg())}
    workdir = Path(tempfile.mkdtemp(prefix="mlharness-bricks-bench-"))
    results = args.results_dir or workdir / "results"
    os.environ.pop("MLHARNESS_DB", None)  # the bench's own database: reuse is measured from empty
    models = [] if args.zoo_only else [str(light_manifest(workdir, m.removeprefix("light_"))) if m.startswith("light_")
                                       else m for m in args.models]
    try:
        chosen, held_members = zoo_choice(args)
        if not models and not chosen:
            raise UserError("no model left in the suite (everything chosen is held out)")
    except UserError as error:
        print(f"bench/bricks.py: {error}", file=sys.stderr)
        return 1
    if chosen or held_members:
        print(f"zoo: {len(chosen)} members in the suite, {len(held_members)} held out", flush=True)
    paths = build_members([*chosen, *held_members])
    models += [paths[m.name] for m in chosen]
    held_paths = {m.name: paths[m.name] for m in held_members}
    families = {m.name: m.family for m in zoo.ZOO}
    overrides = (f"min_duration={args.measure_ms}",) + ((f"intra_op_threads={args.threads}",)
                                                         if args.threads is not None else ())
    base = RunRequest(model=models[0], scenario="SingleStream", kind="bricks", backend="onnxruntime",
                      results_dir=results, variants=not args.no_variants, brick_time_cap=args.time_cap,
                      overrides=overrides, command="bench/bricks.py")
    say = lambda text: print(text, flush=True)  # noqa: E731
    started = time.perf_counter()
    records, failed = [], []
    for model in models:  # one at a time: a model that fails is reported and the suite goes on
        records += going_on(lambda: run_suite([model], base, measure=True, say=say).bricks, model, failed, say) or []
    wall = time.perf_counter() - started
    held = [row for name, path in held_paths.items()
            if (row := going_on(lambda: held_out_row(name, path, base, say), name, failed, say))]
    machine["loadavg_end"] = list(os.getloadavg())

    rows = [suite_row(record, families) for record in records]
    summary = summarize(rows, wall) | {"failed": len(failed)}
    print_figures(rows, held, summary, machine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"bench": "bricks", "machine": machine,
                                    "settings": {"time_cap": args.time_cap, "variants": not args.no_variants,
                                                 "measure_ms": args.measure_ms, "threads": args.threads,
                                                 "zoo": args.zoo, "zoo_only": args.zoo_only, "families": args.family,
                                                 "members": args.member, "hold_out": args.hold_out},
                                    "summary": summary, "models": rows, "held_out": held, "failed": failed},
                                   indent=2))
    print(f"written to {args.out}")
    if failed:
        print(f"bench/bricks.py: {len(failed)} model(s) failed: " + "; ".join(f["model"] for f in failed), file=sys.stderr)
    return 1 if failed else 0


def going_on(step: Callable[[], Any], model: str, failed: list[dict[str, str]], say: Callable[[str], None]) -> Any:
    """`step`'s result; a run that failed (not one stopped from outside) is added to `failed` and None
    returned, so the figures of the models before and after it are still written."""
    try:
        return step()
    except RunInterrupted:
        raise
    except UserError as error:
        failed.append({"model": model, "error": str(error)})
        say(f"{model}: failed: {error}")
        return None


if __name__ == "__main__":
    sys.exit(main())
