"""Layer-level benchmarks over a suite (issue 13, docs/bricks.md): for each model, the composed
estimate from its bricks against its latency measured whole by LoadGen (SingleStream p50, batch 1),
its lower bound, and the suite's benchmarking time against benchmarking every model whole to the
same confidence.

The suite: the shipped ONNX models (resnet50-light, mobilenet-v2 on ONNX Runtime, converted from its
torch manifest) and the onnx wheel's `light_*` graphs, each through a model manifest written here as
a user would (the graph's input and output, synthetic-images, ImageNet preprocessing). The models run
in order through one `mlharness bricks` invocation, so later models reuse earlier ones' bricks from
the results database, as a suite does.

Figures: each model's estimate error (vs LoadGen and vs a plain session), the share of models within
5% and within 10%, and the speedup = (sum of the seconds each model took to reach the confidence rule
whole) / (sum of the seconds the bricks took, reuse included). Printed, and written to
bench/out/bricks.json.

    .venv/bin/python bench/bricks.py [--models resnet50-light light_vgg19 ...] [--time-cap 1] [--no-variants]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=[*SHIPPED, *(f"light_{m}" for m in LIGHT)])
    parser.add_argument("--time-cap", type=float, default=1.0, help="seconds of timed calls per brick")
    parser.add_argument("--no-variants", action="store_true", help="no lower bound (faster)")
    parser.add_argument("--measure-ms", type=int, default=5000, help="min_duration of the LoadGen run, ms")
    parser.add_argument("--results-dir", type=Path, help="keep the results here (default: a temp folder)")
    args = parser.parse_args()

    from mlharness.bricks.suite import run_suite
    from mlharness.running.request import RunRequest

    workdir = Path(tempfile.mkdtemp(prefix="mlharness-bricks-bench-"))
    results = args.results_dir or workdir / "results"
    os.environ.pop("MLHARNESS_DB", None)  # the bench's own database: reuse is measured from empty
    models = [str(light_manifest(workdir, m.removeprefix("light_"))) if m.startswith("light_") else m
              for m in args.models]
    base = RunRequest(model=models[0], scenario="SingleStream", kind="bricks", backend="onnxruntime",
                      results_dir=results, variants=not args.no_variants, brick_time_cap=args.time_cap,
                      overrides=(f"min_duration={args.measure_ms}",), command="bench/bricks.py")
    started = time.perf_counter()
    outcome = run_suite(models, base, measure=True, say=lambda text: print(text, flush=True))
    wall = time.perf_counter() - started

    rows = []
    for record in outcome.bricks:
        s = record.bricks["summary"]
        rows.append({"model": record.model_name, "nodes": s["nodes"], "unique_bricks": s["unique_bricks"],
                     "reused_bricks": s["reused_bricks"], "estimate_ms": s["estimate_ms"],
                     "lower_bound_ms": s["lower_bound_ms"], "measured_ms": s["measured_ms"],
                     "error_pct": s["error_pct"], "plain_session_ms": s["plain_session_ms"],
                     "plain_session_error_pct": s["plain_session_error_pct"],
                     "brick_seconds": s["brick_seconds"], "variant_seconds": s["variant_seconds"],
                     "reuse_saved_seconds": s["reuse_saved_seconds"], "whole_model_seconds": s["whole_model_seconds"],
                     "whole_model_stable": s["whole_model_stable"], "phase_seconds": s.get("phase_seconds"),
                     "run_id": record.run_id,
                     "measured_run": s["measured_run"]})
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    whole = sum(r["whole_model_seconds"] for r in rows)
    bricks = sum(r["brick_seconds"] for r in rows)
    without_reuse = bricks + sum(r["reuse_saved_seconds"] for r in rows)
    summary = {
        "models": len(rows),
        "within_5pct": sum(e <= 5 for e in errors) / len(errors) if errors else None,
        "within_10pct": sum(e <= 10 for e in errors) / len(errors) if errors else None,
        "mean_abs_error_pct": sum(errors) / len(errors) if errors else None,
        "whole_model_seconds": whole, "brick_seconds": bricks, "brick_seconds_without_reuse": without_reuse,
        "speedup": whole / bricks if bricks else None,
        "speedup_without_reuse": whole / without_reuse if without_reuse else None,
        "unique_bricks": sum(r["unique_bricks"] for r in rows), "reused_bricks": sum(r["reused_bricks"] for r in rows),
        "wall_seconds": wall,
    }
    from mlharness.tables import format_table

    print(format_table(("model", "bricks", "reused", "estimate ms", "measured ms", "error", "plain ms", "lower bound ms"),
                       [(r["model"], r["unique_bricks"], r["reused_bricks"], r["estimate_ms"], r["measured_ms"],
                         f"{r['error_pct']:+.1f}%" if r["error_pct"] is not None else "-", r["plain_session_ms"],
                         r["lower_bound_ms"]) for r in rows]))
    print(f"within 5%: {summary['within_5pct']:.0%} of models, within 10%: {summary['within_10pct']:.0%}; "
          f"benchmarking time: whole models {whole:.1f} s, bricks {bricks:.1f} s (reuse included; "
          f"{without_reuse:.1f} s without), speedup {summary['speedup']:.2f}x "
          f"({summary['speedup_without_reuse']:.2f}x without reuse)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"bench": "bricks", "machine": {"cpu": platform.processor() or platform.machine(),
                                                              "cpus_available": len(os.sched_getaffinity(0))},
                               "settings": {"time_cap": args.time_cap, "variants": not args.no_variants,
                                            "measure_ms": args.measure_ms},
                               "summary": summary, "models": rows}, indent=2))
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
