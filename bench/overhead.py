"""How close mlharness gets to LoadGen's own limit, on a null model with 1000 float32 outputs per sample.

Four ways of answering LoadGen, measured in one invocation, each run in a fresh subprocess:
  (a) limit   - bare LoadGen ConstructFastSUT completing every sample with an empty response
  (b) native  - mlharness (null backend), C handoff
  (c) python  - mlharness (null backend), pure-Python handoff
  (pyissue)   - mlharness, native handoff, Server's issue path through the Python binding (the GIL), not
                the native issue queue: the Server search only, to show what the native path gains
  (d) refcopy - the MLCommons reference harness's response style: each sample's row copied to bytes,
                then into an array.array, one response object per sample (ConstructSUT, QuerySample objects)

Figures: Offline samples/s; the highest Server QPS giving a VALID run with p99 <= 10 ms; SingleStream
p90 latency; each against (a); peak RSS of every run. Printed, and written to bench/out/overhead.json.

    .venv/bin/python bench/overhead.py [--duration-ms 2000] [--skip-server]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from child_process import report, run_child, without_db  # bench/child_process.py, beside this script
from qps_search import highest_passing_rate

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "overhead.json"
VARIANTS = ("limit", "native", "python", "refcopy")
HARNESS_VARIANTS = ("native", "python", "pyissue")  # pyissue: native handoff, Server issue through the binding
OUTPUT_FLOATS = 1000  # the null model's outputs per sample
MAX_BATCH_SIZE = 1024  # the null model's max_batch_size, the harness default
SERVER_LATENCY_MS = 10
# First guesses for Offline calibration runs (samples/s); the measured run uses what calibration saw.
OFFLINE_GUESS = {"limit": 2_000_000, "native": 2_000_000, "python": 1_000_000, "refcopy": 100_000}


# ------------------------------------------------------------------------------ child: one measurement

def _loadgen_settings(scenario: str, overrides: list[str], workdir: Path) -> Any:
    """The TestSettings mlharness would build for the null model with these overrides, so the bare
    variants run under exactly the settings the harness variants get."""
    from mlharness.running.request import RunRequest
    from mlharness.running.resolve import prepare_settings, select_model
    from mlharness.running.settings import apply_to_loadgen
    from mlharness.specs.index import default_index

    model = select_model(default_index(), "null", "null")
    settings = prepare_settings(RunRequest(model="null", scenario=scenario, overrides=overrides), model)
    user_conf = workdir / "user.conf"
    user_conf.write_text(settings.user_conf_text())
    return apply_to_loadgen(settings, user_conf)


def _limit_sut(lg: Any, max_batch_size: int) -> tuple[Any, Any]:
    response = lg.QuerySampleResponse
    complete = lg.QuerySamplesComplete

    def issue(query_ids: list[int], sample_indices: list[int]) -> None:
        # In batches like the harness: one call for a whole Offline query (millions of samples)
        # would be slower and hold every response object at once.
        for start in range(0, len(query_ids), max_batch_size):
            complete([response(qid, 0, 0) for qid in query_ids[start:start + max_batch_size]])

    sut = lg.ConstructFastSUT(issue, lambda: None)
    return sut, lg.DestroyFastSUT


def _refcopy_sut(lg: Any, max_batch_size: int) -> tuple[Any, Any]:
    """Written after the reference harness's habits (not its code): inputs stacked per batch with
    np.array over a list, and every response row copied twice before LoadGen sees it."""
    import array

    import numpy as np

    staged = [np.array([index], np.float32) for index in range(1024)]
    outputs = np.zeros((max_batch_size, OUTPUT_FLOATS), np.float32)  # a null model's output buffer

    def issue(samples: list[Any]) -> None:
        for start in range(0, len(samples), max_batch_size):
            batch = samples[start:start + max_batch_size]
            inputs = np.array([staged[sample.index] for sample in batch])
            results = outputs[: len(inputs)]
            responses, keep_alive = [], []
            for row, sample in enumerate(batch):
                data = array.array("B", np.array(results[row], np.float32).tobytes())
                keep_alive.append(data)
                address, length = data.buffer_info()
                responses.append(lg.QuerySampleResponse(sample.id, address, length))
            lg.QuerySamplesComplete(responses)

    sut = lg.ConstructSUT(issue, lambda: None)
    return sut, lg.DestroySUT


def _measure_bare(variant: str, scenario: str, overrides: list[str]) -> dict[str, Any]:
    import mlperf_loadgen as lg

    from mlharness.records.loadgen_logs import parse_summary

    with tempfile.TemporaryDirectory(prefix="mlharness-bench-") as workdir:
        test_settings = _loadgen_settings(scenario, overrides, Path(workdir))
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = workdir
        log_settings.log_output.copy_summary_to_stdout = False
        sut, destroy = (_limit_sut if variant == "limit" else _refcopy_sut)(lg, MAX_BATCH_SIZE)
        qsl = lg.ConstructQSL(1024, 1024, lambda indices: None, lambda indices: None)
        try:
            lg.StartTestWithLogSettings(sut, qsl, test_settings, log_settings, str(Path(workdir) / "no-audit.config"))
        finally:
            lg.DestroyQSL(qsl)
            destroy(sut)
        return {"summary": parse_summary(Path(workdir) / "mlperf_log_summary.txt")}


def _measure_harness(variant: str, scenario: str, overrides: list[str]) -> dict[str, Any]:
    os.environ["MLHARNESS_HANDOFF"] = "native" if variant == "pyissue" else variant
    if variant == "pyissue":  # Server's issue path through the Python binding (with the GIL), for comparison
        os.environ["MLHARNESS_ISSUE"] = "python"
    from mlharness import RunRequest, run
    from mlharness.sut.handoff import load_handoff

    handoff = load_handoff()
    with tempfile.TemporaryDirectory(prefix="mlharness-bench-") as results_dir:
        record = run(RunRequest(model="null", scenario=scenario, backend="null", overrides=overrides,
                                results_dir=Path(results_dir), command="bench/overhead.py"))
    return {"summary": record.performance, "handoff": handoff.name,
            "issue_path": ((record.loadgen or {}).get("performance") or {}).get("sut", {}).get("issue_path"),
            "completion": getattr(handoff, "completion", "pybind"),
            # The run has a process of its own (mlharness.running.launcher): its peak RSS is in the record.
            "run_peak_rss_bytes": (record.cold_start or {}).get("peak_rss_bytes")}


def child(spec: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT))
    started = time.perf_counter()
    measure = _measure_harness if spec["variant"] in HARNESS_VARIANTS else _measure_bare
    result = measure(spec["variant"], spec["scenario"], spec["overrides"])
    result["wall_seconds"] = round(time.perf_counter() - started, 3)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    result["peak_rss_bytes"] = max(own, result.pop("run_peak_rss_bytes", None) or 0)
    report(result)


# ------------------------------------------------------------------------------ parent: the plan

def measure(variant: str, scenario: str, overrides: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {"variant": variant, "scenario": scenario, "overrides": overrides}
    result, process = run_child(__file__, spec, 600, without_db())
    if result is None:
        raise SystemExit(f"{variant} {scenario} {overrides}: measurement failed (exit {process.returncode}):\n"
                         f"{process.stderr[-3000:]}")
    summary = result.pop("summary")
    run = {**spec, **result, "valid": summary.get("valid"),
           **{key: summary.get(key) for key in ("samples_per_second", "completed_samples_per_second",
                                                "p90_latency_ns", "p99_latency_ns", "target_qps")},
           "qps_with_loadgen_overhead": (summary.get("raw") or {}).get("QPS w/ loadgen overhead")}
    runs.append(run)
    shown = {k: run[k] for k in ("samples_per_second", "completed_samples_per_second", "p90_latency_ns",
                                 "p99_latency_ns") if run.get(k) is not None}
    print(f"  {variant:8s} {scenario:12s} {' '.join(overrides):60s} valid={run['valid']!s:5s} {shown} "
          f"rss={run['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    return run


def offline(variant: str, duration_ms: int, runs: list[dict[str, Any]]) -> float:
    # A short calibration run sets target_qps so the measured run lasts about the minimum duration.
    calibration = measure(variant, "Offline", [f"target_qps={OFFLINE_GUESS[variant]}", "min_duration=500",
                                               "min_query_count=1"], runs)
    calibration["calibration"] = True
    # No headroom on purpose: LoadGen already issues 10% more than target_qps * min_duration, and a
    # larger query (millions of samples) costs memory and time in every variant alike.
    rate = int(calibration["samples_per_second"])
    return measure(variant, "Offline", [f"target_qps={rate}", f"min_duration={duration_ms}",
                                        "min_query_count=1"], runs)["samples_per_second"]


def singlestream(variant: str, duration_ms: int, runs: list[dict[str, Any]]) -> int:
    # LoadGen plans a SingleStream test's queries from the expected latency (twice min_duration's
    # worth, ~300 bytes each) and ends it early when the SUT answers faster than half of that:
    # INVALID, and for a harness run an error. The bare variants get no help from the harness, and
    # how fast any variant answers depends on the CPU (LoadGen's own limit: ~5 us a query on the
    # 2-core Xeon this was checked on). So a short calibration run expecting 1 us measures the time
    # a query takes, LoadGen included, and the measured run expects that: enough queries on any CPU,
    # and no more than twice what the run uses.
    calibration = measure(variant, "SingleStream", ["target_latency=0.001", "min_duration=100", "min_query_count=1"],
                          runs)
    calibration["calibration"] = True
    query_ms = 1e3 / float(calibration["qps_with_loadgen_overhead"])
    return measure(variant, "SingleStream", [f"target_latency={query_ms:.6f}", f"min_duration={duration_ms}",
                                             "min_query_count=1"], runs)["p90_latency_ns"]


def server_max_valid_qps(variant: str, duration_ms: int, start_qps: int, cap_qps: int,
                         runs: list[dict[str, Any]]) -> int:
    """Double from start_qps until a run is not VALID with p99 <= 10 ms, then bisect to within 5%."""
    def passes(qps: float) -> bool:
        run = measure(variant, "Server", [f"target_qps={int(qps)}", f"target_latency={SERVER_LATENCY_MS}",
                                          f"min_duration={duration_ms}", "min_query_count=1"], runs)
        return bool(run["valid"]) and (run["p99_latency_ns"] or 0) <= SERVER_LATENCY_MS * 1_000_000

    low, _ = highest_passing_rate(passes, start_qps, factor=2.0, cap=cap_qps, bisections=10, tolerance=0.05)
    return int(low or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--duration-ms", type=int, default=2000, help="LoadGen min_duration of measured runs")
    parser.add_argument("--skip-server", action="store_true", help="leave out the Server search (the slow part)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return

    sys.path.insert(0, str(ROOT))
    from mlharness.running.system import cpu_model

    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} (cpus: {os.cpu_count()}, {cpu_model()})")
    print("Offline (null model, 1000 float32 outputs per sample):")
    offline_sps = {variant: offline(variant, args.duration_ms, runs) for variant in VARIANTS}
    print("SingleStream:")
    singlestream_p90 = {variant: singlestream(variant, args.duration_ms, runs) for variant in VARIANTS}
    server_qps: dict[str, int] = {}
    if not args.skip_server:
        print(f"Server (highest VALID target_qps with p99 <= {SERVER_LATENCY_MS} ms):")
        for variant in ("limit", "native", "pyissue"):
            # Start below the variant's Offline rate (the cap), however slow this machine is.
            cap = int(offline_sps["native" if variant == "pyissue" else variant])
            server_qps[variant] = server_max_valid_qps(variant, args.duration_ms, min(50_000, max(1_000, cap // 4)),
                                                       cap, runs)

    limit_sps, limit_p90 = offline_sps["limit"], singlestream_p90["limit"]
    figures: dict[str, Any] = {
        "offline_limit_sps": limit_sps,
        "offline_native_sps": offline_sps["native"],
        "offline_python_sps": offline_sps["python"],
        "offline_refcopy_sps": offline_sps["refcopy"],
        "server_native_max_valid_qps": server_qps.get("native"),
        "server_limit_max_valid_qps": server_qps.get("limit"),
        "server_python_issue_max_valid_qps": server_qps.get("pyissue"),
        "singlestream_limit_p90_ns": limit_p90,
        "singlestream_native_p90_ns": singlestream_p90["native"],
        "singlestream_python_p90_ns": singlestream_p90["python"],
        "singlestream_refcopy_p90_ns": singlestream_p90["refcopy"],
        "ratios_to_limit": {
            **{f"offline_{v}": round(offline_sps[v] / limit_sps, 3) for v in VARIANTS},
            **{f"singlestream_p90_{v}": round(singlestream_p90[v] / limit_p90, 3) for v in VARIANTS},
            **({"server_native": round(server_qps["native"] / server_qps["limit"], 3),
                "server_python_issue": round(server_qps["pyissue"] / server_qps["limit"], 3)}
               if server_qps.get("limit") else {}),
        },
        "offline_native_vs_refcopy": round(offline_sps["native"] / offline_sps["refcopy"], 1),
        "singlestream_native_minus_limit_p90_ns": singlestream_p90["native"] - limit_p90,
        "peak_rss_bytes": {f"{r['variant']}/{r['scenario']}/{' '.join(r['overrides'])}": r["peak_rss_bytes"]
                           for r in runs},
        "targets": {
            "offline_native_ge_half_limit": offline_sps["native"] >= 0.5 * limit_sps,
            "offline_native_ge_10x_refcopy": offline_sps["native"] >= 10 * offline_sps["refcopy"],
            "server_native_valid_ge_100k_qps": (server_qps["native"] >= 100_000) if "native" in server_qps else None,
            "server_native_ge_1.5x_binding_limit": (server_qps["native"] >= 1.5 * server_qps["limit"])
            if server_qps.get("limit") else None,
            "singlestream_native_p90_within_20us": singlestream_p90["native"] - limit_p90 <= 20_000,
        },
        "machine": {"cpus": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "settings": {"duration_ms": args.duration_ms, "server_latency_ms": SERVER_LATENCY_MS,
                     "note": "harness defaults (max_batch_size 1024, 1 worker); bare variants get the same "
                             "LoadGen settings, built by the harness's settings layers"},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")

    print("\nfigure                         limit (a)    native (b)   python (c)   refcopy (d)")
    print(f"Offline samples/s           {limit_sps:>12,.0f} {offline_sps['native']:>12,.0f} "
          f"{offline_sps['python']:>12,.0f} {offline_sps['refcopy']:>12,.0f}")
    print("  ratio to (a)              " + "".join(f"{offline_sps[v] / limit_sps:>12.3f} " for v in VARIANTS))
    print(f"SingleStream p90 (us)       " + "".join(f"{singlestream_p90[v] / 1000:>12.1f} " for v in VARIANTS))
    print("  ratio to (a)              " + "".join(f"{singlestream_p90[v] / limit_p90:>12.3f} " for v in VARIANTS))
    if server_qps:
        print(f"Server max VALID qps        {server_qps['limit']:>12,} {server_qps['native']:>12,}   "
              f"(native handoff with the binding's issue path: {server_qps['pyissue']:,})")
    print(f"targets: {json.dumps(figures['targets'])}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
