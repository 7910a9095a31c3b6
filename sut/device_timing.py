"""CUDA events around predict, for the harness profiling level: what the device took for each batch,
measured by the GPU's own clock (a host clock around predict includes launch and wait). Off unless
the level is on, so runs without --profile record no events at all."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class DeviceTiming:
    """One predict: the OS thread, the host stamp (perf_counter_ns) when its start event was recorded,
    the device time between its two events, and the batch's rows."""

    tid: int
    host_start_ns: int
    device_ns: int
    rows: int


class DeviceTimings:
    """What a GPU backend keeps while timing is on (list.append is safe across SUT workers)."""

    def __init__(self) -> None:
        self.records: list[DeviceTiming] | None = None

    def start(self) -> None:
        self.records = []

    def stop(self) -> list[DeviceTiming]:
        records, self.records = self.records or [], None
        return records

    def timed(self, record_start: Callable[[], Any], record_end: Callable[[], Any],
              elapsed_ms: Callable[[Any, Any], float], work: Callable[[], Any], rows: int) -> Any:
        """Run `work` between two recorded events and keep their elapsed time (when timing is on)."""
        records = self.records
        if records is None:
            return work()
        start = record_start()
        host_start = time.perf_counter_ns()
        result = work()
        end = record_end()
        records.append(DeviceTiming(threading.get_native_id(), host_start, int(elapsed_ms(start, end) * 1e6), rows))
        return result


class DeviceTimed:
    """A GPU backend's switch for its DeviceTimings (`self._device_timings`): CUDA events around each
    predict between start and end (the harness profiling level)."""

    _device_timings: DeviceTimings

    def start_device_timing(self) -> None:
        """CUDA events around each predict from now on (the harness profiling level)."""
        self._device_timings.start()

    def end_device_timing(self) -> list[Any]:
        return self._device_timings.stop()
