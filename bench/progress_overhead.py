"""What the progress display costs a run (issue 16): the null model, where the harness's own cost is
all there is, with progress off (MLHARNESS_PROGRESS=off) and on (plain lines every 0.2 s, 50x the
default rate), in interleaved rounds of fresh `mlharness run` processes.

Figures, each the best round of its configuration (other work on a shared machine only slows a run):
- Offline samples/s, on / off;
- Server completed samples/s at a fixed target QPS, on / off;
- SingleStream p90 latency, off / on.
Each ratio is "with progress" relative to "without": 1.0 is no cost, below 1 a cost.
Printed, and written to bench/out/progress_overhead.json.

    .venv/bin/python bench/progress_overhead.py [--rounds 3] [--seconds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "progress_overhead.json"
CASES = {
    "Offline": (["--set", "target_qps=2000000"], "samples_per_second", True),
    "Server": (["--set", "target_qps=50000"], "completed_samples_per_second", True),
    "SingleStream": ([], "p90_latency_ns", False),
}


def one_run(scenario: str, extra: list[str], seconds: float, progress: bool, results: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLHARNESS_")}
    env["MLHARNESS_PROGRESS"] = "on" if progress else "off"
    env["MLHARNESS_PROGRESS_INTERVAL"] = "0.2"
    command = [sys.executable, "-m", "mlharness.cli", "run", "null", "--scenario", scenario,
               "--set", f"min_duration={int(seconds * 1000)}", *extra, "--results-dir", str(results)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    lines = [line for line in done.stderr.splitlines() if line.startswith("[progress]")]
    run_json = sorted(results.glob(f"*/null/{scenario}/runs/*/run.json"))[-1]
    record = json.loads(run_json.read_text())
    return {"performance": record["performance"], "progress_lines": len(lines)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="min_duration of each run")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mlharness-progress-bench-") as tmp:
        for scenario, (extra, key, higher) in CASES.items():
            values: dict[str, list[float]] = {"off": [], "on": []}
            lines = 0
            for _ in range(args.rounds):
                for label in ("off", "on"):  # interleaved: both see the same machine
                    result = one_run(scenario, extra, args.seconds, label == "on", Path(tmp) / label)
                    values[label].append(float(result["performance"][key]))
                    lines += result["progress_lines"] if label == "on" else 0
            best = {label: (max(v) if higher else min(v)) for label, v in values.items()}
            ratio = best["on"] / best["off"] if higher else best["off"] / best["on"]
            figures[scenario] = {"figure": key, "off": best["off"], "on": best["on"], "all": values,
                                 "on_over_off": ratio, "progress_lines_drawn": lines}
            print(f"{scenario:<13} {key:<30} off {best['off']:>14,.1f}  on {best['on']:>14,.1f}  "
                  f"on/off {ratio:.3f} (1.0 = no cost; {lines} progress lines drawn)", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"bench": "progress_overhead", "rounds": args.rounds, "seconds": args.seconds,
                               "interval_seconds": 0.2, "figures": figures}, indent=2))
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
