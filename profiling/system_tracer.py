"""The `system` level: CPU use per core, this process's CPU, RSS and context switches sampled on a
background thread; hardware and software counters from `perf stat`; GPU utilisation and memory
through NVML (utilisation, memory, power and clocks). Parts that cannot run here are listed under `unavailable` with the reason."""
from __future__ import annotations

import threading
from typing import Any

from mlharness.profiling import nvml, perf_stat
from mlharness.profiling.clock import now_ns
from mlharness.profiling.tracer import CounterSample, LevelResult, Tracer

INTERVAL_S = 0.05


class SystemTracer(Tracer):
    level = "system"

    def start(self) -> None:
        import psutil

        self.unavailable_parts: dict[str, str] = {}
        self.samples: list[tuple[int, dict[str, float]]] = []
        self._process = psutil.Process()
        self._psutil = psutil
        self._nvml, self._gpus, reason = nvml.open_devices()
        if reason:
            self.unavailable_parts["nvml"] = reason
        reason = perf_stat.unavailable()
        self._perf = None
        if reason:
            self.unavailable_parts["perf"] = reason
        else:
            self._perf = perf_stat.PerfStat()
            self._perf.start()
        psutil.cpu_percent(percpu=True)  # primes the per-core counters
        self._last = (now_ns(), self._process.cpu_times(), self._process.num_ctx_switches())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mlharness-system-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample()

    def _sample(self) -> None:
        stamp = now_ns()
        cpu, switches = self._process.cpu_times(), self._process.num_ctx_switches()
        last_stamp, last_cpu, last_switches = self._last
        seconds = max(1e-9, (stamp - last_stamp) / 1e9)
        values = {f"cpu{i}_pct": pct for i, pct in enumerate(self._psutil.cpu_percent(percpu=True))}
        values["process_cpu_pct"] = round(100 * ((cpu.user + cpu.system) - (last_cpu.user + last_cpu.system)) / seconds, 1)
        values["rss_mib"] = round(self._process.memory_info().rss / 2**20, 1)
        values["voluntary_switches_per_s"] = round((switches.voluntary - last_switches.voluntary) / seconds, 1)
        values["involuntary_switches_per_s"] = round((switches.involuntary - last_switches.involuntary) / seconds, 1)
        if self._nvml is not None:
            values.update(nvml.sample(self._nvml, self._gpus))
        self._last = (stamp, cpu, switches)
        self.samples.append((stamp, values))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.perf = self._perf.stop() if self._perf is not None else {"counters": {}, "unavailable": {}}
        nvml.close(self._nvml)

    def collect(self, window: tuple[int, int]) -> LevelResult:
        counters = []
        groups = {"cpu per core (%)": lambda k: k.startswith("cpu") and k.endswith("_pct"),
                  "process cpu (%)": lambda k: k == "process_cpu_pct",
                  "rss (MiB)": lambda k: k == "rss_mib",
                  "context switches (/s)": lambda k: k.endswith("_switches_per_s"),
                  # NVML's readings, one counter track per unit (mlharness.profiling.nvml.sample)
                  "gpu utilisation (%)": lambda k: k.startswith("gpu") and k.endswith("_pct"),
                  "gpu memory (MiB)": lambda k: k.startswith("gpu") and k.endswith("_mib"),
                  "gpu power (W)": lambda k: k.startswith("gpu") and k.endswith("_power_w"),
                  "gpu clocks (MHz)": lambda k: k.startswith("gpu") and k.endswith("_clock_mhz")}
        for stamp, values in self.samples:
            for name, member in groups.items():
                chosen = {k: v for k, v in values.items() if member(k)}
                if chosen:
                    counters.append(CounterSample(name, stamp, chosen))
        keys = sorted({k for _, values in self.samples for k in values})
        series = {k: [v[k] for _, v in self.samples if k in v] for k in keys}
        summary: dict[str, Any] = {
            "interval_ms": INTERVAL_S * 1e3, "samples": len(self.samples),
            "series": {k: {"mean": round(sum(v) / len(v), 2), "max": max(v)} for k, v in series.items() if v},
            "perf_stat": self.perf["counters"],
            "unavailable": {**self.unavailable_parts, **{f"perf:{k}": v for k, v in self.perf["unavailable"].items()}},
        }
        return LevelResult(self.level, "ok", counters=counters, summary=summary)
