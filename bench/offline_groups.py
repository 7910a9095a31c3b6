"""What Offline's postprocess groups (mlharness.sut.output_groups) buy, measured in one process where the
machine's speed can be bracketed: the plain loop (`session.run` on views of the staged batches, the
runtime's own session) alternates with mlharness's SystemUnderTest under a real LoadGen Offline test
on the same session and staged samples, with groups (`postprocess_group_rows`, default 64) and
without (0). Each SUT window is compared with the mean of the plain windows just before and after
it; a pair whose two plain windows differ by more than --max-drift saw the machine change speed
(docs/tuning.md: this machine's two-thread speed moves between levels 20% or more apart) and is
kept in the record but left out of the median.

This is the in-process comparison behind docs/tuning.md's "Offline's postprocess groups": the same
worker, queue, handoff and LoadGen as a run, without the run's separate process, warm-up and records.

    .venv/bin/python bench/offline_groups.py [--model mobilenet-v2] [--batch 4] [--threads 2]
        [--seconds 1.5] [--rounds 30] [--max-drift 0.03]

Printed, and written to bench/out/offline_groups.json."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "offline_groups.json"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def plain_window(session: Any, outputs: list[str], feeds: list[dict[str, Any]], batch: int) -> Callable[[float], float]:
    def window(seconds: float) -> float:
        count, i = 0, 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            session.run(outputs, feeds[i % len(feeds)])
            count += batch
            i += 1
        return count / (time.perf_counter() - started)
    return window


def sut_window(runtime: Any, batch: int, group_rows: int, expected_qps: Callable[[], float]) -> Callable[[float], float]:
    """One LoadGen Offline performance test over a fresh SystemUnderTest, as the runner builds it
    (one worker, the Python queue Offline uses, the real handoff); its samples/s as LoadGen reports."""
    import mlperf_loadgen as lg

    from mlharness.sut.handoff import load_handoff
    from mlharness.sut.loadgen_handles import loadgen_handles
    from mlharness.sut.system_under_test import SystemUnderTest

    def window(seconds: float) -> float:
        sut = SystemUnderTest(backend=runtime.backend, staged=runtime.staged, handoff=load_handoff(), scenario="Offline",
                              postprocess=runtime.postprocess, ctx=runtime.ctx, max_batch_size=batch, workers=1,
                              result_spec=runtime.model.result or runtime.model.outputs[0],
                              postprocess_group_rows=group_rows)
        settings = lg.TestSettings()
        settings.scenario = lg.TestScenario.Offline
        settings.mode = lg.TestMode.PerformanceOnly
        settings.offline_expected_qps = expected_qps()
        settings.min_duration_ms = int(seconds * 1000)
        settings.min_query_count = 1
        total = len(runtime.staged)
        with tempfile.TemporaryDirectory(prefix="mlharness-groups-") as logdir:
            log = lg.LogSettings()
            log.log_output.outdir = logdir
            log.log_output.copy_summary_to_stdout = False
            with loadgen_handles(sut, total, total, runtime.staged.load_samples, runtime.staged.unload_samples) as (lg_sut, qsl):
                lg.StartTestWithLogSettings(lg_sut, qsl, settings, log, os.path.join(logdir, "no-audit.config"))
            if sut.failure is not None:
                raise RuntimeError(f"the SUT failed: {sut.failure}")
            summary = Path(logdir, "mlperf_log_summary.txt").read_text()
        line = next(text for text in summary.splitlines() if text.startswith("Samples per second"))
        return float(line.split(":")[1])
    return window


def median_or_none(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenet-v2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (0: ONNX Runtime chooses)")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of each window")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--group-rows", type=int, default=64, help="postprocess_group_rows of the grouped SUT")
    parser.add_argument("--max-drift", type=float, default=0.03,
                        help="a pair whose plain windows differ by more than this share is left out of the median")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import model_efficiency  # bench/model_efficiency.py: the same runtime as its plain loop

    from mlharness.running.system import cpu_model

    runtime = model_efficiency._runtime(args.model, args.batch, args.threads, "onnxruntime")
    staged = runtime.staged
    staged.load_samples(list(range(len(staged))))
    arrays = staged.arrays
    feeds = [{name: array[start:start + args.batch] for name, array in arrays.items()}
             for start in range(0, len(staged) - args.batch + 1, args.batch)]
    session, outputs = runtime.backend.session, runtime.backend.output_names
    for feed in feeds * 2:  # warm
        session.run(outputs, feed)
    plain = plain_window(session, outputs, feeds, args.batch)
    rate = [plain(args.seconds)]
    variants = {"groups": sut_window(runtime, args.batch, args.group_rows, lambda: rate[0]),
                "no_groups": sut_window(runtime, args.batch, 0, lambda: rate[0])}
    load_before = os.getloadavg()[0]
    print(f"{args.model} batch {args.batch}, {args.threads or 'ORT'} threads, {args.rounds} rounds of "
          f"{args.seconds:g} s windows; load average {load_before:.2f}; {cpu_model()}")
    pairs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    before = rate[0]
    for round_number in range(args.rounds):
        order = list(variants) if round_number % 2 == 0 else list(variants)[::-1]
        for name in order:
            sut_rate = variants[name](args.seconds)
            after = plain(args.seconds)
            rate[0] = after
            drift = abs(after - before) / min(after, before)
            pair = {"ratio": round(sut_rate / ((before + after) / 2), 4), "drift": round(drift, 4),
                    "sut_sps": round(sut_rate, 2), "plain_before_sps": round(before, 2), "plain_after_sps": round(after, 2)}
            pairs[name].append(pair)
            print(f"  round {round_number + 1:2d} {name:9s} {sut_rate:8.2f} samples/s  ratio {pair['ratio']:.3f}  "
                  f"drift {drift:.1%}{'' if drift <= args.max_drift else '  (left out)'}", flush=True)
            before = after
    figures: dict[str, Any] = {"model": args.model, "batch": args.batch, "threads": args.threads,
                               "seconds": args.seconds, "rounds": args.rounds, "group_rows": args.group_rows,
                               "max_drift": args.max_drift, "cpu": cpu_model(), "load_before": round(load_before, 2),
                               "load_after": round(os.getloadavg()[0], 2), "pairs": pairs}
    for name, measured in pairs.items():
        kept = [pair["ratio"] for pair in measured if pair["drift"] <= args.max_drift]
        figures[f"{name}_kept"] = len(kept)
        figures[f"{name}_vs_plain"] = median_or_none(kept)
        print(f"{name}: median {figures[f'{name}_vs_plain']} of the plain loop ({len(kept)} of {len(measured)} pairs kept)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
