"""Does this machine hold one speed? A plain loop of one model (bench/model_efficiency.py's, the
harness's graph and samples in a session of our own) timed in short windows, at each thread count
in turn, so a change of the machine's speed in the middle of a measurement shows as windows at two
levels rather than as a noisy figure.

On the 2-core machines this project is measured on, one thread ran at one level (windows within 3%)
while two threads moved between two levels about 20% apart, each held for seconds
(docs/tuning.md, "This machine's two speeds"): a comparison of two runs taken tens of seconds apart,
as the confirming pairs of bench/model_efficiency.py, can land each run on either level.

Printed, and written to bench/out/speed_levels.json: per thread count, every window's samples/s,
their spread (max over min) and the share of windows within 5% of the fastest.

    .venv/bin/python bench/speed_levels.py [--model light_inception_v2] [--threads 1 2] [--seconds 30] [--window 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from child_process import measured, report  # bench/child_process.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "speed_levels.json"


def windows(model: str, batch: int, threads: int, seconds: float, window: float) -> list[float]:
    """Samples/s of the plain loop in consecutive windows of `window` seconds, for `seconds` in all."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from model_efficiency import plain_loop

    timed = plain_loop(model, batch, threads)
    ends = time.perf_counter() + seconds
    rates = []
    while time.perf_counter() < ends:
        rates.append(round(timed(window)["samples_per_second"], 2))
    return rates


def summary(rates: list[float]) -> dict[str, Any]:
    fastest = max(rates)
    return {"windows_sps": rates, "spread": round(fastest / min(rates), 4),
            "share_within_5pct_of_fastest": round(sum(rate >= 0.95 * fastest for rate in rates) / len(rates), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="light_inception_v2",
                        help="a model name, manifest path, or light_<name> for the onnx wheel's light_* graphs")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="intra-op thread counts, in turn")
    parser.add_argument("--seconds", type=float, default=30.0, help="time at each thread count")
    parser.add_argument("--window", type=float, default=2.0, help="length of one window")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        report({"windows_sps": windows(spec["model"], spec["batch"], spec["threads"], spec["seconds"], spec["window"])})
        return

    sys.path.insert(0, str(ROOT))
    from bench.bricks import light_manifest
    from mlharness.running.system import cpu_model

    model = args.model
    if model.startswith("light_"):
        model = str(light_manifest(Path(tempfile.mkdtemp(prefix="mlharness-speed-")), model.removeprefix("light_")))
    print(f"{args.model}, batch {args.batch}: {cpu_model()}, {len(os.sched_getaffinity(0))} cpus, "
          f"load average {os.getloadavg()[0]:.2f}")
    levels = {}
    for threads in args.threads:
        spec = {"model": model, "batch": args.batch, "threads": threads, "seconds": args.seconds, "window": args.window}
        found = summary(measured(__file__, spec, None)["windows_sps"])
        levels[str(threads)] = found
        print(f"  {threads} thread(s): {found['windows_sps']} samples/s; spread {found['spread']:.3f}, "
              f"{found['share_within_5pct_of_fastest']:.0%} of windows within 5% of the fastest", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "batch": args.batch, "seconds": args.seconds,
                                    "window": args.window, "cpu_model": cpu_model(), "threads": levels}, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
