"""Counters from `perf stat` attached to this process for the test. Each counter is reported with
its value or with why it is unavailable (no perf binary, no permission, <not supported> by the
kernel or hypervisor); nothing is estimated."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Any

SOFTWARE_EVENTS = ("task-clock", "context-switches", "cpu-migrations", "page-faults")
HARDWARE_EVENTS = ("cycles", "instructions", "cache-misses", "branch-misses")


def unavailable() -> str | None:
    if shutil.which("perf") is None:
        return "perf is not installed (no `perf` on PATH)"
    return None


class PerfStat:
    def __init__(self, pid: int | None = None, events: tuple[str, ...] = SOFTWARE_EVENTS + HARDWARE_EVENTS):
        self.pid = pid or os.getpid()
        self.events = events
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", ",".join(self.events), "-p", str(self.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict[str, Any]:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            _, err = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        return parse(err, self.events, self.process.returncode)


def parse(stderr: str, events: tuple[str, ...], returncode: int | None = 0) -> dict[str, Any]:
    """`perf stat -x ,` lines: value,unit,event,run time,percentage[,metric,unit]."""
    counters: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for line in stderr.splitlines():
        fields = line.split(",")
        if len(fields) < 3 or fields[2] not in events:
            continue
        value, unit, event = fields[0], fields[1], fields[2]
        if value.startswith("<"):
            unavailable[event] = f"perf stat reports {value} (no access to this counter here)"
            continue
        try:
            number = float(value)
        except ValueError:
            unavailable[event] = f"perf stat printed {value!r}"
            continue
        counters[event] = {"value": int(number) if number.is_integer() else number, **({"unit": unit} if unit else {})}
    missing = [e for e in events if e not in counters and e not in unavailable]
    if missing:
        first = next((l.strip() for l in stderr.splitlines() if l.strip() and "," not in l), "")
        reason = f"perf stat exited {returncode}" + (f": {first}" if first else "")
        unavailable.update({e: reason for e in missing})
    if "instructions" in counters and "cycles" in counters and counters["cycles"]["value"]:
        counters["ipc"] = {"value": round(counters["instructions"]["value"] / counters["cycles"]["value"], 3)}
    return {"counters": counters, "unavailable": unavailable}
