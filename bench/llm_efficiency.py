"""How much of an LLM engine's speed mlharness keeps, and what continuous batching buys (issue 19 item 7):
smollm2-135m through mlharness against the engine's own plain generation loop, on the same prompt ids,
at the same batch and threads.

For the transformers engine:
- offline_tokens_ratio: mlharness Offline output tokens/s (LoadGen's figure; continuous batching of
  --batch) over transformers' own `generate_batch` (its continuous-batching offline call, the same
  cache and batch configuration) on the same --offline-samples prompts (the first --prompts, cycled):
  output tokens over its wall time.
- singlestream_ttft_p50_ratio, _p90_ratio and singlestream_tpot_...: mlharness SingleStream TTFT and
  TPOT (LoadGen's) over transformers' plain `model.generate` (greedy, batch 1, a streamer stamping each
  token) on the same prompts; `..._ratio_vs_engine_loop`: over the engine's own decode loop
  (`engine.generate`, what SingleStream calls) run without LoadGen, which isolates the harness's cost.
- server: the highest VALID QPS under the model's Server TTFT/TPOT limits with continuous and with
  static batching (llm_batching), by a short search of --server-steps tests (bench/qps_search.py): start
  at --server-start QPS, multiply by 1.5 while VALID (halve while a failing start fails), then bisect
  between the last VALID and the first INVALID rate. Each point is a Server
  test of --server-queries queries (LoadGen's TTFT/TPOT early stopping at p99 needs about 460).

Each measurement runs in a fresh process (the model loaded as a run loads it). The machine is shared:
compare figures within one run of this script (ratios), not across runs. Printed, and written to
bench/out/llm_efficiency.json.

Other engines: ENGINES maps an engine name to a function (threads, prompts, seconds, repeats, runs) ->
figures. The llama.cpp engine's figures come from bench/llm_llamacpp_efficiency.py's `llamacpp_figures`
when that file is there (`--engines transformers llama_cpp`); another engine adds its own entry.

    .venv/bin/python bench/llm_efficiency.py [--engines transformers] [--threads 2] [--batch 8] [--prompts 40]
        [--offline-samples 240] [--seconds 30] [--repeats 1] [--server-start 3] [--server-queries 480]
        [--server-steps 3] [--no-server]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

# Beside this script in bench/: how a measurement runs in its own process, and the LLM engines' helpers.
from child_process import hermetic, measured, report
from llm_engines import harness_run_record, load_engine, ms, prompt_ids
from qps_search import highest_passing_rate

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "llm_efficiency.json"
MODEL = "smollm2-135m"
WARMUP_PROMPTS = 3


# ------------------------------------------------------------------------------ children

def _engine(backend: str, threads: int, dataset: str | None) -> Any:
    return load_engine(MODEL, backend, threads, dataset)


def transformers_plain_offline(threads: int, prompts: int, batch: int, samples: int,
                               dataset: str | None = None) -> dict[str, Any]:
    """transformers' own generate_batch over `samples` prompts (the first `prompts`, cycled), at `batch`."""
    engine = _engine("transformers", threads, dataset)
    ids = prompt_ids(engine, prompts, dataset)
    longest = max(len(p) for p in ids) + engine.max_new_tokens
    generation, batching = engine.batch_configs(batch, longest)
    lm = engine.lm
    lm.generate_batch(ids[:WARMUP_PROMPTS], generation_config=generation, continuous_batching_config=batching)
    inputs = [ids[i % len(ids)] for i in range(samples)]
    started = time.perf_counter()
    outputs = lm.generate_batch(inputs, generation_config=generation, continuous_batching_config=batching)
    elapsed = time.perf_counter() - started
    tokens = sum(len(out.generated_tokens) for out in outputs.values())
    engine.close()
    return {"tokens_per_second": tokens / elapsed, "samples_per_second": len(outputs) / elapsed,
            "samples": len(outputs), "tokens": tokens, "seconds": elapsed}


def transformers_plain_single(threads: int, prompts: int, seconds: float, loop: str = "generate",
                              dataset: str | None = None) -> dict[str, Any]:
    """A plain loop at batch 1, one prompt after another for `seconds`: the time to each prompt's first token
    and the time per output token after it. `loop`: "generate", transformers' `model.generate` (greedy, a
    streamer stamping each token); "engine", the engine's own decode loop (`engine.generate`, what mlharness
    SingleStream calls) without LoadGen, which isolates the harness's own cost."""
    import numpy as np
    import torch
    from transformers.generation.streamers import BaseStreamer

    engine = _engine("transformers", threads, dataset)
    ids = prompt_ids(engine, prompts, dataset)
    lm = engine.lm
    stamps: list[int] = []

    class Stamps(BaseStreamer):
        def put(self, value):  # the prompt first, then each new token
            stamps.append(time.perf_counter_ns())

        def end(self):
            pass

    def engine_one(prompt: list[int]) -> tuple[int, int, int]:
        stamps.clear()
        started = time.perf_counter_ns()
        out = engine.generate(np.asarray(prompt, dtype=np.int64), lambda token, position: stamps.append(
            time.perf_counter_ns()))
        return stamps[0] - started, stamps[-1] - started, int(out.size)

    def generate_one(prompt: list[int]) -> tuple[int, int, int]:
        stamps.clear()
        started = time.perf_counter_ns()
        out = lm.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=engine.max_new_tokens, do_sample=False,
                          eos_token_id=sorted(engine.stop_ids), pad_token_id=sorted(engine.stop_ids)[0],
                          streamer=Stamps())
        count = int(out.shape[1]) - len(prompt)
        return stamps[1] - started, stamps[-1] - started, count

    one = engine_one if loop == "engine" else generate_one
    for prompt in ids[:WARMUP_PROMPTS]:
        one(prompt)
    ttft, tpot, done, tokens = [], [], 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or done < len(ids):
        first, last, count = one(ids[done % len(ids)])
        ttft.append(first)
        if count > 1:
            tpot.append((last - first) / (count - 1))
        tokens += count
        done += 1
    elapsed = time.perf_counter() - started
    engine.close()
    return {"tokens_per_second": tokens / elapsed, "samples_per_second": done / elapsed, "samples": done,
            "ttft_p50_ns": int(np.percentile(ttft, 50)), "ttft_p90_ns": int(np.percentile(ttft, 90)),
            "tpot_p50_ns": int(np.percentile(tpot, 50)) if tpot else None,
            "tpot_p90_ns": int(np.percentile(tpot, 90)) if tpot else None}


def harness_run(backend: str, scenario: str, threads: int, prompts: int, overrides: list[str],
                dataset: str | None = None) -> dict[str, Any]:
    record = harness_run_record(MODEL, backend, scenario, threads, prompts, WARMUP_PROMPTS, overrides,
                                "bench/llm_efficiency.py", dataset)
    perf = record.performance
    keys = ("valid", "result", "tokens_per_second", "completed_tokens_per_second", "samples_per_second",
            "completed_samples_per_second", "ttft_p50_ns", "ttft_p90_ns", "ttft_p99_ns", "tpot_p50_ns",
            "tpot_p90_ns", "tpot_p99_ns", "itl_p50_ns", "itl_p99_ns", "goodput_fraction", "p90_latency_ns")
    raw = perf.get("raw") or {}  # LoadGen's summary lines: why a test is INVALID
    checks = ("Performance constraints satisfied", "Min duration satisfied", "Min queries satisfied",
              "Early stopping satisfied")
    return {**{key: perf.get(key) for key in keys}, "sut": record.loadgen.get("performance", {}).get("sut"),
            "settings": record.settings.get("loadgen"), "loadgen_checks": {key: raw.get(key) for key in checks}}


def child(spec: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT))
    started = time.perf_counter()
    kind = spec["kind"]
    if kind == "plain-offline":
        result = transformers_plain_offline(spec["threads"], spec["prompts"], spec["batch"], spec["samples"],
                                            spec.get("dataset"))
    elif kind == "plain-single":
        result = transformers_plain_single(spec["threads"], spec["prompts"], spec["seconds"], spec["loop"],
                                           spec.get("dataset"))
    else:
        result = harness_run(spec["backend"], spec["scenario"], spec["threads"], spec["prompts"], spec["overrides"],
                             spec.get("dataset"))
    result["wall_seconds"] = round(time.perf_counter() - started, 3)
    report(result)


# ------------------------------------------------------------------------------ parent

def measure(spec: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    result = {**spec, **measured(__file__, spec, hermetic()), "load_average": os.getloadavg()[0]}
    runs.append(result)
    label = f"{spec['kind']} {spec.get('loop', '')}" if spec["kind"].startswith("plain") else \
        f"mlharness {spec['scenario']}"
    extra = f" {spec.get('batching', '')} QPS {spec['qps']}: {result.get('result')}" if "qps" in spec else ""
    print(f"  {label:22s}{extra} {_tokens(result):7.2f} tokens/s  TTFT p50/p90 {ms(result.get('ttft_p50_ns'))}/"
          f"{ms(result.get('ttft_p90_ns'))} ms  TPOT p50/p90 {ms(result.get('tpot_p50_ns'))}/"
          f"{ms(result.get('tpot_p90_ns'))} ms  load={result['load_average']:.1f}", flush=True)
    return result


def _tokens(result: dict[str, Any]) -> float:
    return result.get("tokens_per_second") or result.get("completed_tokens_per_second") or 0.0


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def transformers_figures(threads: int, prompts: int, seconds: float, repeats: int, runs: list[dict[str, Any]],
                         batch: int = 8, offline_samples: int = 240, dataset: str | None = None) -> dict[str, Any]:
    """Offline tokens/s at `batch` and SingleStream TTFT/TPOT against transformers' own loops, the best of
    `repeats` interleaved rounds each (on a shared machine other work only slows a run down)."""
    base = {"backend": "transformers", "threads": threads, "prompts": prompts, "dataset": dataset}
    best: dict[str, dict[str, Any]] = {}

    def keep(name: str, run: dict[str, Any], key: str, higher: bool) -> None:
        held = best.get(name)
        if held is None or (run.get(key) is not None and (run[key] > held[key] if higher else run[key] < held[key])):
            best[name] = run

    for round_number in range(repeats):
        single_plain = measure({**base, "kind": "plain-single", "loop": "generate", "seconds": seconds,
                                "round": round_number}, runs)
        single_engine = measure({**base, "kind": "plain-single", "loop": "engine", "seconds": seconds,
                                 "round": round_number}, runs)
        queries = max(prompts, int(single_plain["samples_per_second"] * seconds))
        single = measure({**base, "kind": "harness", "scenario": "SingleStream", "round": round_number, "overrides": [
            f"target_latency={single_engine['ttft_p50_ns'] / 4e6:.3f}", f"min_query_count={queries}",
            f"min_duration={int(seconds * 1000)}"]}, runs)
        # The same samples on both sides: LoadGen's Offline query holds exactly min_query_count samples when
        # min_duration (1 s) at target_qps asks for fewer.
        samples = offline_samples
        offline = measure({**base, "kind": "harness", "scenario": "Offline", "round": round_number, "overrides": [
            f"max_batch_size={batch}", "llm_batching=continuous", f"min_query_count={samples}",
            f"target_qps={samples / 2:.4f}", "min_duration=1000"]}, runs)
        offline_plain = measure({**base, "kind": "plain-offline", "batch": batch, "round": round_number,
                                 "samples": samples}, runs)
        keep("single_plain", single_plain, "ttft_p90_ns", False)
        keep("single_engine", single_engine, "ttft_p90_ns", False)
        keep("single", single, "ttft_p90_ns", False)
        keep("offline", offline, "tokens_per_second", True)
        keep("offline_plain", offline_plain, "tokens_per_second", True)
    sp, se, s, o, op = (best[k] for k in ("single_plain", "single_engine", "single", "offline", "offline_plain"))
    stats = ("ttft_p50_ns", "ttft_p90_ns", "tpot_p50_ns", "tpot_p90_ns")
    return {
        "threads": threads, "prompts": prompts, "batch": batch,
        "offline_tokens_ratio": _ratio(o["tokens_per_second"], op["tokens_per_second"]),
        "mlharness_offline_tokens_per_second": o["tokens_per_second"], "mlharness_offline_valid": o["valid"],
        "plain_offline_tokens_per_second": op["tokens_per_second"],
        **{f"singlestream_{k[:-3]}_ratio": _ratio(s[k], sp[k]) for k in stats},
        **{f"singlestream_{k[:-3]}_ratio_vs_engine_loop": _ratio(s[k], se[k]) for k in stats},
        "mlharness_singlestream": {k: s[k] for k in stats}, "plain_singlestream": {k: sp[k] for k in stats},
        "engine_loop_singlestream": {k: se[k] for k in stats},
    }


def server_search(backend: str, threads: int, prompts: int, batch: int, batching: str, start: float, queries: int,
                  runs: list[dict[str, Any]], steps: int = 4, dataset: str | None = None,
                  percentile: float = 99.0) -> dict[str, Any]:
    """The highest VALID Server QPS found in at most `steps` tests (see the module's doc), with the TTFT/TPOT
    limits at `percentile` (MLPerf's 99 by default)."""
    tried: list[dict[str, Any]] = []

    def passes(qps: float) -> bool:
        run = measure({"backend": backend, "threads": threads, "prompts": prompts, "kind": "harness",
                       "scenario": "Server", "batching": batching, "qps": round(qps, 3), "dataset": dataset,
                       "overrides": [
                           f"max_batch_size={batch}", f"llm_batching={batching}", f"target_qps={qps:.3f}",
                           f"min_query_count={queries}", "min_duration=10000",
                           f"target_latency_percentile={percentile:g}"]}, runs)
        ok = run.get("valid") is True or run.get("result") == "VALID"
        tried.append({"qps": round(qps, 3), "valid": ok, "loadgen_checks": run.get("loadgen_checks"),
                      "ttft_p90_ns": run.get("ttft_p90_ns"), "tpot_p90_ns": run.get("tpot_p90_ns"),
                      "ttft_p99_ns": run.get("ttft_p99_ns"),
                      "tpot_p99_ns": run.get("tpot_p99_ns"), "goodput_fraction": run.get("goodput_fraction"),
                      "completed_samples_per_second": run.get("completed_samples_per_second")})
        return ok

    # x1.5 while VALID; a failing start halves until a rate passes; then bisections, `steps` tests in all
    valid, invalid = highest_passing_rate(passes, start, factor=1.5, lower=tuple(start / 2 ** k for k in range(1, steps)),
                                          bisections=steps, budget=steps)
    return {"batching": batching, "highest_valid_qps": round(valid, 3) if valid else None,
            "lowest_invalid_qps": round(invalid, 3) if invalid else None, "tried": tried}


def _llamacpp(threads: int, prompts: int, seconds: float, repeats: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The llama.cpp engine's figures, from bench/llm_llamacpp_efficiency.py (its own plain loop)."""
    path = ROOT / "bench" / "llm_llamacpp_efficiency.py"
    spec = importlib.util.spec_from_file_location("llm_llamacpp_efficiency", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.llamacpp_figures(threads, prompts, seconds, repeats, runs)


# engine name -> (threads, prompts, seconds, repeats, runs, **batch options) -> figures. Add an engine here;
# one in BATCHED also gets batch= and offline_samples= and the Server search.
ENGINES: dict[str, Callable[..., dict[str, Any]]] = {"transformers": transformers_figures, "llama_cpp": _llamacpp}
# engines with a batched path (open_batch): the Server search compares continuous and static batching there.
BATCHED = ("transformers",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--engines", nargs="+", default=["transformers"], choices=sorted(ENGINES))
    parser.add_argument("--threads", type=int, default=2, help="torch / engine threads")
    parser.add_argument("--batch", type=int, default=8, help="sequences in a batch (Offline, Server)")
    parser.add_argument("--prompts", type=int, default=40, help="the first N prompts of the dataset")
    parser.add_argument("--offline-samples", type=int, default=240, help="samples in each Offline measurement")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each loop or LoadGen test")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds; each figure is its best round")
    parser.add_argument("--server-start", type=float, default=3.0, help="the Server search's first QPS")
    parser.add_argument("--server-queries", type=int, default=480, help="queries in each Server test")
    parser.add_argument("--server-steps", type=int, default=3, help="Server tests per batching")
    parser.add_argument("--no-server", action="store_true", help="skip the Server search")
    parser.add_argument("--server-only", action="store_true", help="only the Server search (no Offline/SingleStream)")
    parser.add_argument("--server-percentile", type=float, default=99.0,
                        help="the percentile the Server TTFT/TPOT limits apply at (MLPerf: 99; early stopping needs "
                             "about 460 queries at 99, 44 at 90)")
    parser.add_argument("--dataset", help="a prompt dataset (default: the model's); transformers engine only, e.g. "
                                          "lee-summaries (48-token summaries)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if args.dataset and set(args.engines) - set(BATCHED):
        parser.error(f"--dataset applies to the engines {', '.join(BATCHED)} only")
    if args.server_only and args.no_server:
        parser.error("--server-only and --no-server leave nothing to measure")
    sys.path.insert(0, str(ROOT))
    from mlharness.running.system import cpu_model

    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} (cpus: {os.cpu_count()}, {cpu_model()})")
    runs: list[dict[str, Any]] = []
    engines: dict[str, Any] = {}
    for name in args.engines:
        extra = {"batch": args.batch, "offline_samples": args.offline_samples, "dataset": args.dataset} \
            if name in BATCHED else {}
        figures = {} if args.server_only else ENGINES[name](args.threads, args.prompts, args.seconds, args.repeats,
                                                            runs, **extra)
        if name in BATCHED and not args.no_server:
            figures["server"] = {mode: server_search(name, args.threads, args.prompts, args.batch, mode,
                                                     args.server_start, args.server_queries, runs, args.server_steps,
                                                     args.dataset, args.server_percentile)
                                 for mode in ("continuous", "static")}
            c, s = (figures["server"][m]["highest_valid_qps"] for m in ("continuous", "static"))
            figures["server_continuous_over_static"] = _ratio(c, s)
        engines[name] = figures
    result = {
        "model": MODEL, "engines": engines,
        "machine": {"cpus": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "settings": {k: getattr(args, k) for k in ("threads", "batch", "prompts", "offline_samples", "seconds", "repeats",
                                                   "server_start", "server_queries", "server_steps", "no_server",
                                                   "server_only", "server_percentile", "dataset")},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for name, f in engines.items():
        print(f"\n{name}:" if args.server_only else "", end="")
        if not args.server_only:
            _print_loops(name, f)
        for mode, search in (f.get("server") or {}).items():
            print(f"  Server {mode}: highest VALID QPS {search['highest_valid_qps']} "
                  f"(lowest INVALID {search['lowest_invalid_qps']}); tried {[(t['qps'], t['valid']) for t in search['tried']]}")
        if "server_continuous_over_static" in f:
            print(f"  continuous / static VALID QPS: {f['server_continuous_over_static']}")
    print(f"written: {args.out}")


def _print_loops(name: str, f: dict[str, Any]) -> None:
    m, p = f["mlharness_singlestream"], f["plain_singlestream"]
    print(f"\n{name}: Offline {f['mlharness_offline_tokens_per_second']:.2f} tokens/s vs plain "
          f"{f.get('plain_offline_tokens_per_second') or f.get('plain_tokens_per_second'):.2f} "
          f"(ratio {f['offline_tokens_ratio']}); SingleStream TTFT p50/p90 {ms(m['ttft_p50_ns'])}/"
          f"{ms(m['ttft_p90_ns'])} ms vs plain {ms(p['ttft_p50_ns'])}/{ms(p['ttft_p90_ns'])} (ratios "
          f"{f['singlestream_ttft_p50_ratio']}/{f['singlestream_ttft_p90_ratio']}), TPOT p50/p90 "
          f"{ms(m['tpot_p50_ns'])}/{ms(m['tpot_p90_ns'])} ms vs plain {ms(p['tpot_p50_ns'])}/"
          f"{ms(p['tpot_p90_ns'])} (ratios {f['singlestream_tpot_p50_ratio']}/{f['singlestream_tpot_p90_ratio']})")
    if "engine_loop_singlestream" in f:
        e = f["engine_loop_singlestream"]
        print(f"  vs the engine's own loop without LoadGen: TTFT p50/p90 {ms(e['ttft_p50_ns'])}/{ms(e['ttft_p90_ns'])} "
              f"ms (ratios {f['singlestream_ttft_p50_ratio_vs_engine_loop']}/"
              f"{f['singlestream_ttft_p90_ratio_vs_engine_loop']}), TPOT p50/p90 {ms(e['tpot_p50_ns'])}/"
              f"{ms(e['tpot_p90_ns'])} ms (ratios {f['singlestream_tpot_p50_ratio_vs_engine_loop']}/"
              f"{f['singlestream_tpot_p90_ratio_vs_engine_loop']})")


if __name__ == "__main__":
    main()
