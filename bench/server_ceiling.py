"""How close to its Offline rate a model's Server can get at its latency bound on this machine, before
any harness: the model's batch times measured with a plain `session.run` loop, fed to a queueing
model of Poisson arrivals (bench/queue_model.py). Two servers are modelled:

- greedy batching: one worker takes whatever has arrived, up to the batch limit, when it is free
  (what mlharness's Server SUT does with one worker and no batch wait);
- ideal: every sample answered on its own, in arrival order, at the full Offline rate (no batch holds
  a sample back). A SUT no faster than its Offline rate does not do better than this at a bound.

For each it prints the highest share of the Offline rate whose p99 stays within the bound, and the
bound that 0.9 of the Offline rate would need. The model leaves out LoadGen's early stopping (which
asks a little more than p99 within the bound) and a shared machine's noise, so measured Server runs
sit somewhat below it. Compare with `bench/model_efficiency.py --server-only` (the measured figure).
Printed, and written to bench/out/server_ceiling.json.

    .venv/bin/python bench/server_ceiling.py [--model resnet50-light] [--seconds 4] [--threads 0]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from queue_model import bound_needed, highest_rate_within, latency_percentile, poisson_gaps  # bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "server_ceiling.json"
PERCENTILE = 99.0  # LoadGen's Server latency percentile
SHARES = (0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def batch_times_ms(model_name: str, max_batch: int, threads: int, seconds: float) -> dict[int, float]:
    """The median time (ms) of one plain session.run of each batch size 1..max_batch, on the harness's
    graph and preprocessed samples (threads 0: ONNX Runtime chooses, as the harness's default)."""
    sys.path.insert(0, str(ROOT))
    from model_efficiency import _plain_session, _runtime  # bench/, beside this script

    runtime = _runtime(model_name, max_batch, threads)
    count = min(len(runtime.staged), int(runtime.model.attributes.get("performance_sample_count", 64)))
    runtime.staged.load_samples(list(range(count)))
    run = _plain_session(runtime, threads)  # the raw loop's own session (it closes the harness's)
    times: dict[int, float] = {}
    for batch in range(1, max_batch + 1):
        feed = {name: np.ascontiguousarray(np.resize(a, (batch, *a.shape[1:]))) for name, a in runtime.staged.arrays.items()}
        for _ in range(3):
            run(feed)
        taken = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(taken) < 5:
            started = time.perf_counter()
            run(feed)
            taken.append(time.perf_counter() - started)
        times[batch] = float(np.median(taken)) * 1e3
        print(f"  batch {batch}: {times[batch]:.1f} ms ({batch / times[batch] * 1e3:.1f} samples/s)", flush=True)
    return times


def ceiling(batch_ms: dict[int, float], bound_ms: float, queries: int, seed: int = 0) -> dict[str, Any]:
    """The modelled figures for the batch times `batch_ms` (batch size -> ms) at `bound_ms`."""
    max_batch = max(batch_ms)
    times = [batch_ms[b] for b in range(1, max_batch + 1)]
    offline = max(b * 1000.0 / t for b, t in batch_ms.items())  # the plain loop's best rate
    gaps = poisson_gaps(queries, seed)
    servers = {"greedy_batching": (times, max_batch), "ideal": ([1000.0 / offline], 1)}
    found: dict[str, Any] = {"offline_qps": round(offline, 3), "bound_ms": bound_ms, "percentile": PERCENTILE,
                             "queries_simulated": queries}
    for name, (service, limit) in servers.items():
        highest = highest_rate_within(bound_ms, service, limit, PERCENTILE, gaps, offline)
        found[name] = {
            "highest_share_within_bound": round(highest / offline, 4),
            "bound_needed_for_0.9_ms": round(bound_needed(0.9, service, limit, PERCENTILE, gaps, offline), 1),
            "p99_ms_by_share": {f"{share:.2f}": round(latency_percentile(share * offline, service, limit, PERCENTILE, gaps), 1)
                                for share in SHARES},
        }
    return found


def manifest_bound_ms(model_name: str) -> float:
    sys.path.insert(0, str(ROOT))
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index

    settings = select_model(default_index(), model_name, "onnxruntime").attributes.get("settings") or {}
    return float((settings.get("Server") or {})["target_latency"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50-light")
    parser.add_argument("--max-batch", type=int, default=8, help="the Server batch limit (the model's max_batch_size)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime chooses)")
    parser.add_argument("--seconds", type=float, default=4.0, help="how long each batch size is timed")
    parser.add_argument("--bound-ms", type=float, help="the latency bound (default: the manifest's Server target_latency)")
    parser.add_argument("--queries", type=int, default=200_000, help="simulated Server queries")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    bound = args.bound_ms if args.bound_ms is not None else manifest_bound_ms(args.model)
    load_before = os.getloadavg()
    print(f"{args.model}: plain session.run per batch size (load average {load_before[0]:.2f})")
    times = batch_times_ms(args.model, args.max_batch, args.threads, args.seconds)
    found = ceiling(times, bound, args.queries)
    print(f"Offline rate of the plain loop: {found['offline_qps']:.1f} samples/s; bound p99 <= {bound:g} ms")
    for name in ("greedy_batching", "ideal"):
        server = found[name]
        print(f"  {name}: highest share within the bound {server['highest_share_within_bound']:.3f}; "
              f"0.9 of Offline needs a bound of {server['bound_needed_for_0.9_ms']:.0f} ms")
        print("    p99 by share: " + ", ".join(f"{share}: {p99:.0f} ms" for share, p99 in server["p99_ms_by_share"].items()))
    result = {"model": args.model, "max_batch": args.max_batch, "threads": args.threads,
              "batch_ms": {str(b): round(t, 3) for b, t in times.items()}, **found,
              "machine": {"cpus": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
                          "python": platform.python_version(), "platform": platform.platform()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
