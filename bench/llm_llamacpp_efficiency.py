"""How much of the llama.cpp engine's speed mlharness keeps (issue 19 item 7, the llama.cpp part):
smollm2-135m on llama_cpp, mlharness against llama-cpp-python's own plain generation loop
(`Llama.generate`, greedy, the KV cache cleared before each prompt, nothing else) on the same prompt
ids and at the same threads.

- offline_tokens_ratio: mlharness Offline output tokens/s (LoadGen's figure) over the plain loop's
  (prompts one after another, output tokens over wall time).
- singlestream_ttft_p50_ratio, _p90_ratio: mlharness SingleStream TTFT (LoadGen's) over the plain loop's
  (generate called until its first token).
- singlestream_tpot_p50_ratio, _p90_ratio: the same for the time per output token (after the first).

The engine runs one sequence at a time (llama-cpp-python's Llama holds one sequence), so there is no
batch to match: both sides run batch 1. Each measurement runs in a fresh process; every configuration
is measured in --repeats interleaved rounds and each figure is its best round (on a shared machine
other work only slows a run down). Printed, and written to bench/out/llm_llamacpp_efficiency.json.
`llamacpp_figures()` is the function a wider LLM bench can call.

    .venv/bin/python bench/llm_llamacpp_efficiency.py [--threads 1] [--prompts 20] [--seconds 30] [--repeats 2]
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

# Beside this script in bench/: how a measurement runs in its own process, and the LLM engines' helpers.
from child_process import hermetic, measured, report
from llm_engines import harness_run_record, load_engine, ms, prompt_ids

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "llm_llamacpp_efficiency.json"
MODEL, BACKEND = "smollm2-135m", "llama_cpp"
WARMUP_PROMPTS = 3


# ------------------------------------------------------------------------------ children

def _engine(threads: int) -> Any:
    """The harness's engine, loaded as a run loads it: its prompt ids and its Llama (same parameters)."""
    return load_engine(MODEL, BACKEND, threads)


def plain_loop(threads: int, prompts: int, seconds: float) -> dict[str, Any]:
    """llama-cpp-python's own loop over the prompts, cycled for `seconds`: per prompt the time to its first
    token and to its last, and output tokens over the whole wall time."""
    import numpy as np

    engine = _engine(threads)
    llm, stop, most = engine.llm, engine.stop_ids, engine.max_new_tokens
    ids = prompt_ids(engine, prompts)

    def one(prompt: list[int]) -> tuple[int, int, int]:
        llm.reset()
        started = time.perf_counter_ns()
        first = count = 0
        for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
            count += 1
            if count == 1:
                first = time.perf_counter_ns()
            if token in stop or count >= most:
                break
        return first - started, time.perf_counter_ns() - started, count

    for prompt in ids[:WARMUP_PROMPTS]:
        one(prompt)
    ttft, tpot, tokens, done = [], [], 0, 0
    started = time.perf_counter_ns()
    deadline = started + int(seconds * 1e9)
    while time.perf_counter_ns() < deadline or done < len(ids):
        first, total, count = one(ids[done % len(ids)])
        ttft.append(first)
        if count > 1:
            tpot.append((total - first) / (count - 1))
        tokens += count
        done += 1
    elapsed = (time.perf_counter_ns() - started) / 1e9
    engine.close()
    return {"tokens_per_second": tokens / elapsed, "samples_per_second": done / elapsed, "samples": done,
            "tokens": tokens, "ttft_p50_ns": int(np.percentile(ttft, 50)), "ttft_p90_ns": int(np.percentile(ttft, 90)),
            "tpot_p50_ns": int(np.percentile(tpot, 50)) if tpot else None,
            "tpot_p90_ns": int(np.percentile(tpot, 90)) if tpot else None}


def harness_run(scenario: str, threads: int, prompts: int, overrides: list[str]) -> dict[str, Any]:
    record = harness_run_record(MODEL, BACKEND, scenario, threads, prompts, WARMUP_PROMPTS, overrides,
                                "bench/llm_llamacpp_efficiency.py")
    perf = record.performance
    keys = ("valid", "tokens_per_second", "samples_per_second", "ttft_p50_ns", "ttft_p90_ns", "tpot_p50_ns",
            "tpot_p90_ns", "p90_latency_ns")
    return {**{key: perf.get(key) for key in keys}, "backend": record.backend_info}


def child(spec: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT))
    started = time.perf_counter()
    if spec["kind"] == "plain":
        result = plain_loop(spec["threads"], spec["prompts"], spec["seconds"])
    else:
        result = harness_run(spec["scenario"], spec["threads"], spec["prompts"], spec["overrides"])
    result["wall_seconds"] = round(time.perf_counter() - started, 3)
    report(result)


# ------------------------------------------------------------------------------ parent

def measure(spec: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    result = {**spec, **measured(__file__, spec, hermetic()), "load_average": os.getloadavg()[0]}
    runs.append(result)
    label = "plain loop" if spec["kind"] == "plain" else f"mlharness {spec['scenario']}"
    print(f"  threads={spec['threads']} round {spec['round']} {label:22s} {result['tokens_per_second'] or 0:7.2f} tokens/s  "
          f"TTFT p50/p90 {ms(result.get('ttft_p50_ns'))}/{ms(result.get('ttft_p90_ns'))} ms  "
          f"TPOT p50/p90 {ms(result.get('tpot_p50_ns'))}/{ms(result.get('tpot_p90_ns'))} ms"
          f"  load={result['load_average']:.1f}", flush=True)
    return result


def _better(held: dict[str, Any] | None, run: dict[str, Any], key: str, higher: bool) -> dict[str, Any]:
    if held is None or run.get(key) is None:
        return held or run
    return run if (run[key] > held[key] if higher else run[key] < held[key]) else held


def llamacpp_figures(threads: int = 1, prompts: int = 20, seconds: float = 30.0, repeats: int = 2,
                     runs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The llama.cpp engine's figures at `threads`: mlharness Offline tokens/s and SingleStream TTFT/TPOT over
    the plain loop's, on the first `prompts` prompts, each the best of `repeats` interleaved rounds."""
    runs = runs if runs is not None else []
    base = {"threads": threads, "prompts": prompts}
    best: dict[str, dict[str, Any]] = {}
    for round_number in range(repeats):
        plain = measure({**base, "kind": "plain", "seconds": seconds, "round": round_number}, runs)
        # LoadGen sizes its queries from the expected rate: the plain loop's, so each test lasts about `seconds`.
        queries = max(prompts, int(plain["samples_per_second"] * seconds))
        offline = measure({**base, "kind": "harness", "scenario": "Offline", "round": round_number, "overrides": [
            f"target_qps={plain['samples_per_second']:.4f}", f"min_query_count={queries}",
            f"min_duration={int(seconds * 1000)}"]}, runs)
        # SingleStream: LoadGen generates min_duration / target_latency queries (twice) and fails a run that runs
        # out of them; a quarter of the plain loop's TTFT leaves room for a quieter moment of the machine.
        single = measure({**base, "kind": "harness", "scenario": "SingleStream", "round": round_number, "overrides": [
            f"target_latency={plain['ttft_p50_ns'] / 4e6:.3f}", f"min_query_count={queries}",
            f"min_duration={int(seconds * 1000)}"]}, runs)
        best["plain_tokens"] = _better(best.get("plain_tokens"), plain, "tokens_per_second", True)
        best["plain_latency"] = _better(best.get("plain_latency"), plain, "ttft_p90_ns", False)
        best["offline"] = _better(best.get("offline"), offline, "tokens_per_second", True)
        best["singlestream"] = _better(best.get("singlestream"), single, "ttft_p90_ns", False)
    plain_tokens, plain_latency, offline, single = (best[k] for k in ("plain_tokens", "plain_latency", "offline",
                                                                      "singlestream"))

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 4) if a and b else None

    return {
        "threads": threads, "prompts": prompts,
        "offline_tokens_ratio": ratio(offline["tokens_per_second"], plain_tokens["tokens_per_second"]),
        "singlestream_ttft_p50_ratio": ratio(single["ttft_p50_ns"], plain_latency["ttft_p50_ns"]),
        "singlestream_ttft_p90_ratio": ratio(single["ttft_p90_ns"], plain_latency["ttft_p90_ns"]),
        "singlestream_tpot_p50_ratio": ratio(single["tpot_p50_ns"], plain_latency["tpot_p50_ns"]),
        "singlestream_tpot_p90_ratio": ratio(single["tpot_p90_ns"], plain_latency["tpot_p90_ns"]),
        "mlharness_offline_tokens_per_second": offline["tokens_per_second"], "mlharness_offline_valid": offline["valid"],
        "plain_tokens_per_second": plain_tokens["tokens_per_second"],
        "mlharness_singlestream": {k: single[k] for k in ("ttft_p50_ns", "ttft_p90_ns", "tpot_p50_ns", "tpot_p90_ns")},
        "plain_singlestream": {k: plain_latency[k] for k in ("ttft_p50_ns", "ttft_p90_ns", "tpot_p50_ns", "tpot_p90_ns")},
        "engine": offline.get("backend"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="llama.cpp threads (each measured)")
    parser.add_argument("--prompts", type=int, default=20, help="the first N prompts of the dataset")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each loop or LoadGen test")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds; each figure is its best round")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    sys.path.insert(0, str(ROOT))
    from mlharness.running.system import cpu_model

    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} (cpus: {os.cpu_count()}, {cpu_model()})")
    runs: list[dict[str, Any]] = []
    by_threads = {str(t): llamacpp_figures(t, args.prompts, args.seconds, args.repeats, runs) for t in args.threads}
    figures = {
        "engine": BACKEND, "model": MODEL, "by_threads": by_threads,
        "targets": {f"offline_tokens_ratio_ge_0.95@{t}": (f["offline_tokens_ratio"] or 0) >= 0.95
                    for t, f in by_threads.items()},
        "machine": {"cpus": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "settings": {"prompts": args.prompts, "seconds": args.seconds, "repeats": args.repeats,
                     "warmup_prompts": WARMUP_PROMPTS, "figures": "best of the repeats per configuration"},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    for threads, f in by_threads.items():
        m, p = f["mlharness_singlestream"], f["plain_singlestream"]
        print(f"\nthreads={threads}: Offline {f['mlharness_offline_tokens_per_second']:.2f} tokens/s vs plain "
              f"{f['plain_tokens_per_second']:.2f} (ratio {f['offline_tokens_ratio']}); SingleStream TTFT p50/p90 "
              f"{ms(m['ttft_p50_ns'])}/{ms(m['ttft_p90_ns'])} ms vs plain {ms(p['ttft_p50_ns'])}/{ms(p['ttft_p90_ns'])} "
              f"(ratios {f['singlestream_ttft_p50_ratio']}/{f['singlestream_ttft_p90_ratio']}), TPOT p50/p90 "
              f"{ms(m['tpot_p50_ns'])}/{ms(m['tpot_p90_ns'])} ms vs plain {ms(p['tpot_p50_ns'])}/{ms(p['tpot_p90_ns'])} "
              f"(ratios {f['singlestream_tpot_p50_ratio']}/{f['singlestream_tpot_p90_ratio']})")
    print(f"targets: {json.dumps(figures['targets'])}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
