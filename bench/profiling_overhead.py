"""What profiling costs, measured as XSP does: the same LoadGen test (resnet50-light, Offline) run
with profiling off, with each level alone, and with all levels; repeats are interleaved round-robin
so drift on a shared machine hits every configuration alike. Prints a table and writes
bench/out/profiling_overhead.json.

Profiling off: the run path adds one nullcontext() and one `if not request.profile` per LoadGen test
and nothing per batch (the SUT's observer is None). That cost is timed directly and set against
the off runs' wall time; the off runs' spread is the noise floor any level's figure must clear.

The Offline query is sized from target_qps: measured on this machine by calibration runs with profiling
off (the model manifest's figure fits a 2-core machine; a faster one would end each test early,
INVALID and too short to measure an overhead), or given with --target-qps.

Usage: .venv/bin/python bench/profiling_overhead.py [--repeats 3] [--min-duration-ms 3000] [--target-qps Q]"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mlharness import RunRequest, run  # noqa: E402
from mlharness.atomic_io import write_json  # noqa: E402
from mlharness.running.runner import _profile_session  # noqa: E402
from mlharness.running.system import cpu_model  # noqa: E402
from mlharness.profiling import LEVELS  # noqa: E402

CONFIGS = {"off": [], **{level: [level] for level in LEVELS}, "full": list(LEVELS)}


def one_run(levels: list[str], min_duration_ms: int, results: Path, target_qps: float | None = None) -> dict:
    overrides = [f"min_duration={min_duration_ms}"] + ([f"target_qps={target_qps:.3f}"] if target_qps else [])
    request = RunRequest(model="resnet50-light", scenario="Offline", quick=True, results_dir=results,
                         overrides=overrides, profile=list(levels))
    record = run(request)
    return {"samples_per_s": float(record.performance["metric"]["value"]),
            "wall_s": record.performance["wall_seconds"], "valid": record.performance.get("result")}


def off_path_seconds() -> float:
    """The statements a run without --profile executes because profiling exists, per LoadGen test."""
    request = RunRequest(model="x", scenario="Offline")

    def off_path() -> None:
        profile = _profile_session(request, None, "performance")  # type: ignore[arg-type]
        with profile.measuring(None) if profile is not None else contextlib.nullcontext():
            pass

    loops = 100_000
    return min(timeit.repeat(off_path, number=loops, repeat=5)) / loops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-duration-ms", type=int, default=3000)
    parser.add_argument("--target-qps", type=float, help="Offline target_qps (default: measured by a first run)")
    args = parser.parse_args()
    os.environ.pop("MLHARNESS_DB", None)  # the runs stay in the temporary results folder
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="mlharness-bench-profiling-") as tmp:
        target_qps = args.target_qps
        if not target_qps:
            # Twice: the first query (the manifest's figure) may hold only a few batches, which
            # underestimates the rate; the second is sized from the first and lasts about a second.
            for step in range(2):
                target_qps = one_run([], 1000, Path(tmp) / f"calibration-{step}", target_qps)["samples_per_s"]
            print(f"calibration: {target_qps:.3f} samples/s (target_qps of the measured runs)", flush=True)
        for repeat in range(args.repeats):
            for name, levels in CONFIGS.items():
                figures = one_run(levels, args.min_duration_ms, Path(tmp) / f"{name}-{repeat}", target_qps)
                runs[name].append(figures)
                print(f"repeat {repeat} {name:<10} {figures['samples_per_s']:8.3f} samples/s", flush=True)
    off = statistics.median(r["samples_per_s"] for r in runs["off"])
    off_values = [r["samples_per_s"] for r in runs["off"]]
    noise_pct = 100 * (max(off_values) - min(off_values)) / off if len(off_values) > 1 else None
    table = {}
    for name, items in runs.items():
        median = statistics.median(r["samples_per_s"] for r in items)
        table[name] = {"samples_per_s": [round(r["samples_per_s"], 4) for r in items],
                       "median_samples_per_s": round(median, 4),
                       "overhead_pct": round(100 * (off / median - 1), 2)}  # extra time per sample
    off_wall = statistics.median(r["wall_s"] for r in runs["off"])
    static = off_path_seconds()
    result = {
        "benchmark": "profiling_overhead", "model": "resnet50-light", "scenario": "Offline",
        "min_duration_ms": args.min_duration_ms, "repeats": args.repeats, "target_qps": target_qps,
        "machine": {"cpus": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "command": "python bench/profiling_overhead.py " + " ".join(sys.argv[1:]),
        "configs": table,
        "off_noise_pct": round(noise_pct, 2) if noise_pct is not None else None,
        "profiling_off": {"added_seconds_per_test": static, "off_wall_seconds": off_wall,
                          "cost_pct": 100 * static / off_wall, "within_1_pct": 100 * static / off_wall <= 1.0},
    }
    print(f"\n{'config':<10} {'median samples/s':>17} {'overhead %':>11}")
    for name, row in table.items():
        print(f"{name:<10} {row['median_samples_per_s']:>17.3f} {row['overhead_pct']:>11.2f}")
    print(f"\noff runs spread (noise): {result['off_noise_pct']} %")
    print(f"profiling off adds {static * 1e9:.0f} ns per LoadGen test = {result['profiling_off']['cost_pct']:.2e} % "
          f"of a {off_wall:.1f} s test (<= 1 %: {result['profiling_off']['within_1_pct']})")
    out = REPO / "bench" / "out" / "profiling_overhead.json"
    write_json(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
