"""What a run against a server costs against the same server driven without LoadGen, and against
the model run in process (issue 35). Everything over loopback on this machine, in one run:

- null model, HTTP and gRPC: the sustained rate of a plain asynchronous client loop (the same client
  library, `concurrency` requests in flight, no LoadGen) hitting `mlharness serve null`; then the
  network SUT's Server scenario at rising fractions of that rate, the highest VALID one kept with
  its issue lag p99 (the client's own delay apart from waiting for a free slot); and Offline
  samples/s through the server.
- resnet50-light Offline over gRPC against the in-process run at the same batch size and threads.

Printed, and written to bench/out/network_overhead.json.

    .venv/bin/python bench/network_overhead.py [--seconds 10] [--concurrency 32]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "network_overhead.json"
sys.path.insert(0, str(ROOT))

from tests.network_support import mlharness_serve  # noqa: E402  (the suite's own server starter)

FRACTIONS = (0.4, 0.6, 0.8, 0.9, 1.0, 1.1)


async def plain_loop(url: str, seconds: float, concurrency: int) -> float:
    """Requests/s of `concurrency` workers each sending the null model's raw sample in a loop."""
    import numpy as np

    from mlharness.specs.endpoint import parse_endpoint
    from mlharness.sut.network.oip_client import make_client

    client = make_client(parse_endpoint(url), concurrency, 30.0)
    sample = np.array([7], dtype=np.int64)
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await client.infer("null", {"x": sample})
            done += 1
    await worker_warm(client, sample)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rate = done / (time.perf_counter() - started)
    await client.close()
    return rate


async def worker_warm(client: Any, sample: Any) -> None:
    for _ in range(50):
        await client.infer("null", {"x": sample})


def run(model: str, scenario: str, results: Path, *args: str) -> dict[str, Any]:
    """One `mlharness run` in a fresh process; its run.json (None when it failed)."""
    command = [sys.executable, "-m", "mlharness.cli", "run", model, "--scenario", scenario, "--quiet",
               "--results-dir", str(results), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, MLHARNESS_PROGRESS="off"))
    newest = sorted(results.glob(f"*/{model}/{scenario}/*/*/run.json"), key=lambda p: p.stat().st_mtime)
    if done.returncode != 0 or not newest:
        return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(newest[-1].read_text())


def network_figures(record: dict[str, Any]) -> dict[str, Any]:
    network = ((record.get("loadgen") or {}).get("performance") or {}).get("sut", {}).get("network") or {}
    return {"issue_lag_p99_ms": (network.get("issue_lag_ms") or {}).get("p99"),
            "client_lag_p99_ms": (network.get("client_lag_ms") or {}).get("p99"),
            "client_fell_behind": network.get("client_fell_behind")}


def server_ladder(url: str, rate: float, seconds: float, results: Path) -> dict[str, Any]:
    steps = []
    for fraction in FRACTIONS:
        target = max(1.0, round(rate * fraction, 1))
        record = run("null", "Server", results, "--endpoint", url, "--set", f"target_qps={target}",
                     "--set", f"min_duration={int(seconds * 1000)}", "--set", "min_query_count=100",
                     "--set", "endpoint_concurrency=64")
        perf = record.get("performance") or {}
        step = {"target_qps": target, "result": perf.get("result"), "failed": record.get("failed"),
                "completed_qps": perf.get("completed_samples_per_second"), **network_figures(record)}
        steps.append(step)
        print(f"  Server {url.split(':')[0]} target {target:9.1f}: {step['result']} "
              f"(issue lag p99 {step['issue_lag_p99_ms']} ms, client's own p99 {step['client_lag_p99_ms']} ms)")
    valid = [s for s in steps if s["result"] == "VALID"]
    best = max(valid, key=lambda s: s["target_qps"]) if valid else None
    return {"steps": steps, "highest_valid_qps": best["target_qps"] if best else None,
            "issue_lag_p99_ms_at_best": best["issue_lag_p99_ms"] if best else None}


def offline(model: str, results: Path, seconds: float, *args: str) -> float | None:
    record = run(model, "Offline", results, "--set", f"min_duration={int(seconds * 1000)}",
                 "--set", "min_query_count=1", *args)
    return (record.get("performance") or {}).get("samples_per_second")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each measurement's length")
    parser.add_argument("--concurrency", type=int, default=32, help="the plain loop's requests in flight")
    args = parser.parse_args()
    results = Path(tempfile.mkdtemp(prefix="mlharness-network-bench-"))
    figures: dict[str, Any] = {"bench": "network_overhead", "seconds": args.seconds, "load_average": os.getloadavg()}
    with mlharness_serve("null") as served:
        for url in (served.grpc, served.http):
            protocol = url.split(":")[0]
            rate = asyncio.run(plain_loop(url, args.seconds, args.concurrency))
            print(f"null over {protocol}: plain client loop {rate:.0f} requests/s")
            ladder = server_ladder(url, rate, args.seconds, results)
            through = offline("null", results, args.seconds, "--endpoint", url, "--set", "target_qps=20000")
            figures[f"null_{protocol}"] = {"plain_loop_rps": round(rate, 1), **ladder, "offline_sps": through,
                                           "network_sut_server_vs_plain_loop":
                                               round(ladder["highest_valid_qps"] / rate, 3) if ladder["highest_valid_qps"] else None}
            print(f"  highest VALID Server QPS {ladder['highest_valid_qps']} ({figures[f'null_{protocol}']['network_sut_server_vs_plain_loop']} "
                  f"of the plain loop); Offline {through} samples/s")
    same = ("--set", "max_batch_size=8", "--set", "intra_op_threads=2", "--no-tuned")
    here = offline("resnet50-light", results, args.seconds, *same)
    with mlharness_serve("resnet50-light", *same[:4], http=False) as served:
        remote = offline("resnet50-light", results, args.seconds, "--endpoint", served.grpc, "--set",
                         "endpoint_concurrency=32", "--no-tuned")
    ratio = round(remote / here, 3) if here and remote else None
    figures["resnet50_light_offline"] = {"in_process_sps": here, "grpc_sps": remote, "grpc_vs_in_process": ratio}
    print(f"resnet50-light Offline: in process {here} samples/s, over gRPC {remote} ({ratio} of in process)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
