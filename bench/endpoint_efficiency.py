"""What a run against an OpenAI-compatible LLM server costs (issue 36), in one run on this machine:

- llama.cpp's own server (llama-cpp-python's `llama_cpp.server`, `--threads` threads) against the
  llama.cpp engine in this process at the same threads: SingleStream TTFT and TPOT p50 (LoadGen's token
  mode), Offline output tokens/s; `--rounds` alternated rounds, medians.
- The endpoint SUT against a plain asynchronous streaming loop on the same server (aiohttp, one request
  at a time, no LoadGen): TTFT p50 of each, so the harness's own share of a TTFT shows.
- With `--server-ladder RATES`: Server tests of the transformers engine (continuous batching) at each
  rate, in this process and through `mlharness serve smollm2-135m --openai` (the same engine and batch),
  under the manifest's TTFT/TPOT limits judged at p50 (short tests); the highest VALID rate of each.

Printed, and written to bench/out/endpoint_efficiency.json.

    .venv/bin/python bench/endpoint_efficiency.py [--seconds 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "endpoint_efficiency.json"
sys.path.insert(0, str(ROOT))

from tests.llama_server_support import llama_server  # noqa: E402  (the suite's own server starter)

PROMPTS = 40  # the first polarity prompts, cycled


def run(results: Path, scenario: str, *args: str, backend: str = "llama_cpp") -> dict[str, Any] | None:
    """One `mlharness run smollm2-135m --backend BACKEND` in a fresh process; its run.json (None: it failed)."""
    command = [sys.executable, "-m", "mlharness.cli", "run", "smollm2-135m", "--backend", backend,
               "--scenario", scenario, "--results-dir", str(results), "--set", f"dataset_limit={PROMPTS}", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, MLHARNESS_PROGRESS="off"))
    if done.returncode != 0:
        print(f"  failed: {' '.join(command[3:])}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    newest = sorted(results.glob(f"*/smollm2-135m/{scenario}/runs/*/run.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(newest[-1].read_text())


def token_figures(record: dict[str, Any] | None) -> dict[str, Any]:
    if record is None:
        return {}
    perf = record.get("performance") or {}
    keys = ("result", "ttft_p50_ns", "ttft_p90_ns", "tpot_p50_ns", "tpot_p90_ns", "tokens_per_second",
            "samples_per_second", "output_tokens_client", "output_tokens_server")
    return {key: perf[key] for key in keys if key in perf}


def single_stream_and_offline(results: Path, seconds: float, threads: int, *endpoint: str) -> dict[str, Any]:
    common = ("--set", f"intra_op_threads={threads}", "--set", f"min_duration={int(seconds * 1000)}",
              "--set", "min_query_count=1", *endpoint)
    return {"SingleStream": token_figures(run(results, "SingleStream", *common)),
            "Offline": token_figures(run(results, "Offline", *common, "--set", "min_query_count=" + str(PROMPTS)))}


async def plain_loop(url: str, seconds: float) -> dict[str, Any]:
    """TTFT and end-to-end latency of one streamed request at a time (aiohttp, no LoadGen), for `seconds`."""
    import aiohttp

    from mlharness.specs.endpoint import parse_endpoint
    from mlharness.sut.network.sse import Event, SSEDecoder

    prompts = polarity_prompts()
    base = parse_endpoint(url).base_url
    ttft, e2e = [], []
    async with aiohttp.ClientSession() as session:
        stop_at = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < stop_at or i < 2:
            body = {"model": "smollm2-135m", "max_tokens": 4, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}
            sent, first = time.perf_counter_ns(), None
            decoder = SSEDecoder()
            async with session.post(base + "/chat/completions", json=body) as response:
                async for piece in response.content.iter_any():
                    for event in decoder.feed(piece):
                        if first is None and isinstance(event, Event) and event.data != "[DONE]":
                            choices = json.loads(event.data).get("choices") or [{}]
                            if (choices[0].get("delta") or {}).get("content"):
                                first = time.perf_counter_ns()
            if i >= 1 and first is not None:  # the first request warms the server
                ttft.append(first - sent)
                e2e.append(time.perf_counter_ns() - sent)
            i += 1
    return {"requests": len(ttft), "ttft_p50_ns": int(statistics.median(ttft)) if ttft else None,
            "e2e_p50_ns": int(statistics.median(e2e)) if e2e else None}


def polarity_prompts() -> list[str]:
    """The dataset's first PROMPTS prompts, as a run enumerates them (the manifest's own code)."""
    from mlharness.specs.index import default_index
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    index = default_index()
    dataset, model = index.find("dataset", "pang-lee-polarity-prompts"), index.find("model", str(ROOT / "specs" / "models" / "smollm2-135m-llamacpp.yaml"))
    ctx = ProcessingContext(attributes=dict(model.attributes), sources=dict(resolve_sources(dataset)), model=model,
                            dataset=dataset)
    return [prompt for prompt, _ in enumerate_samples(dataset, ctx, PROMPTS)]


def ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def server_ladder(results: Path, rates: list[float], seconds: float, *endpoint: str) -> dict[str, Any]:
    """Server tests of the transformers engine at each rate (lowest first, stopping after the second
    INVALID): each rate's result and TTFT/TPOT p99, and the highest VALID rate."""
    found: dict[str, Any] = {"rates": {}, "highest_valid_qps": None}
    invalid = 0
    for rate in sorted(rates):
        # TTFT/TPOT judged at p50, not p99: LoadGen's early stopping needs about 460 queries to pass a p99
        # bound (minutes a rung here); both sides are judged alike.
        record = run(results, "Server", "--set", f"target_qps={rate}", "--set", f"min_duration={int(seconds * 1000)}",
                     "--set", "min_query_count=1", "--set", "target_latency_percentile=50", *endpoint,
                     backend="transformers")
        perf = (record or {}).get("performance") or {}
        figures = {**token_figures(record), **{key: perf[key] for key in ("ttft_p99_ns", "tpot_p99_ns",
                                                                           "completed_tokens_per_second") if key in perf}}
        found["rates"][str(rate)] = figures
        print(f"  Server {rate} QPS{' (endpoint)' if endpoint else ''}: {figures.get('result')}")
        if figures.get("result") == "VALID":
            found["highest_valid_qps"] = rate
        else:
            invalid += 1
            if invalid >= 2:
                break
    return found


def _median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def llama_figures(figures: dict[str, Any], results: Path, seconds: float, threads: int, rounds: int) -> None:
    """The llama.cpp engine here against llama.cpp's server, and the endpoint SUT against a plain loop on
    that server: `rounds` rounds, each running the three one after another (a shared machine's load
    drifts; alternating puts each comparison's two sides close in time), medians across rounds."""
    sides: dict[str, list[dict[str, Any]]] = {"here_ss": [], "there_ss": [], "loop": [], "here_off": [], "there_off": []}
    with llama_server(threads=threads) as server:  # idle (no CPU) while the engine here runs
        for number in range(rounds):
            print(f"round {number + 1} of {rounds}: in process, through {server.url}, plain loop")
            here = single_stream_and_offline(results / f"here-{number}", seconds, threads)
            there = single_stream_and_offline(results / f"there-{number}", seconds, threads, "--endpoint", server.url)
            sides["here_ss"].append(here["SingleStream"])
            sides["there_ss"].append(there["SingleStream"])
            sides["here_off"].append(here["Offline"])
            sides["there_off"].append(there["Offline"])
            sides["loop"].append(asyncio.run(plain_loop(server.url, seconds)))
    figures["llama_rounds"] = sides
    medians = {name: {key: _median_of(values, key) for key in ("ttft_p50_ns", "tpot_p50_ns", "tokens_per_second")}
               for name, values in sides.items()}
    figures["llama_medians"] = medians
    figures["ratios"].update({
        "single_stream_ttft_p50_endpoint_over_in_process": ratio(medians["there_ss"]["ttft_p50_ns"],
                                                                 medians["here_ss"]["ttft_p50_ns"]),
        "single_stream_tpot_p50_endpoint_over_in_process": ratio(medians["there_ss"]["tpot_p50_ns"],
                                                                 medians["here_ss"]["tpot_p50_ns"]),
        "offline_tokens_per_second_endpoint_over_in_process": ratio(medians["there_off"]["tokens_per_second"],
                                                                    medians["here_off"]["tokens_per_second"]),
        "single_stream_ttft_p50_endpoint_over_plain_loop": ratio(medians["there_ss"]["ttft_p50_ns"],
                                                                 medians["loop"]["ttft_p50_ns"]),
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="min_duration of each LoadGen test")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads, here and in the server")
    parser.add_argument("--server-ladder", default="", metavar="RATES",
                        help="comma-separated Server rates for the transformers engine here and behind serve --openai")
    parser.add_argument("--skip-llama", action="store_true", help="only the Server ladder")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of the llama.cpp comparison")
    args = parser.parse_args()
    figures: dict[str, Any] = {"seconds": args.seconds, "threads": args.threads, "cpus": os.cpu_count(), "ratios": {}}
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        if not args.skip_llama:
            llama_figures(figures, results, args.seconds, args.threads, args.rounds)
        if args.server_ladder:
            from tests.openai_support import openai_serve

            rates = [float(rate) for rate in args.server_ladder.split(",")]
            print("Server ladder, transformers engine in process")
            figures["ladder_in_process"] = server_ladder(results / "ladder-here", rates, args.seconds)
            with openai_serve("smollm2-135m", "--backend", "transformers") as served:
                print(f"Server ladder through mlharness serve --openai at {served.url}")
                figures["ladder_serve_openai"] = server_ladder(results / "ladder-there", rates, args.seconds,
                                                               "--endpoint", "openai+" + served.url)
            figures["ratios"]["server_highest_valid_qps_endpoint_over_in_process"] = ratio(
                figures["ladder_serve_openai"]["highest_valid_qps"], figures["ladder_in_process"]["highest_valid_qps"])
    print(json.dumps(figures, indent=2))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
