"""Whether two runs can be compared: the same machine and the same framework versions.

As pyperf refuses to merge runs from different CPUs or Pythons, a gate refuses to compare runs
whose hardware or framework stack differ, unless told to."""
from __future__ import annotations

from typing import Any

from mlharness.records.run_record import RunRecord

# Fields of the detected system that change performance; hostname and memory size do not count.
SYSTEM_FIELDS = ("cpu_model", "logical_cpus", "cpus_available", "machine", "gpus")


def fingerprint(record: RunRecord) -> dict[str, Any]:
    """System fields, the device, and the versions of the packages the run's software manifest declares."""
    system = record.system_description
    versions = record.software_versions
    found: dict[str, Any] = {f"system.{k}": system.get(k) for k in SYSTEM_FIELDS}
    found["hardware.device"] = record.device
    for dist, version in sorted(record.software_checked.items()):
        found[f"software.{dist}"] = version
    if "mlcommons-loadgen" in versions:
        found["software.mlcommons-loadgen"] = versions["mlcommons-loadgen"]
    return found


def differences(first: RunRecord, second: RunRecord) -> list[str]:
    """Human-readable differences between two records' fingerprints, empty when comparable."""
    a, b = fingerprint(first), fingerprint(second)
    return [f"{key}: {a.get(key)!r} vs {b.get(key)!r}" for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)]
