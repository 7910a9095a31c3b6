"""systems/<system>.json: the checker's 35 fields, from what a run detected (CPU, memory, GPUs,
OS, package versions) plus what cannot be detected, given as fields (--system-field KEY=VALUE or
a JSON file). Counts are written as strings ("0", not 0): the checker wants them non-empty."""
from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any, Iterable

from mlharness.errors import UserError
from mlharness.submission.rules import SYSTEM_FIELDS

UNDETECTED = "undetected"


def _cpuinfo_first(key: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip().lower() == key:
                return value.strip()
    except OSError:
        pass
    return None


def _sockets() -> int:
    try:
        ids = {line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.lower().startswith("physical id")}
        return max(1, len(ids))
    except OSError:
        return 1


def _physical_cores(logical: int) -> int:
    try:
        import psutil

        return int(psutil.cpu_count(logical=False) or logical)
    except ImportError:
        cores = _cpuinfo_first("cpu cores")
        return int(cores) * _sockets() if cores and cores.isdigit() else logical


def _network_cards() -> int:
    net = Path("/sys/class/net")
    if not net.is_dir():
        return 1
    # Physical interfaces have a device link; virtual ones (lo, ifb, bridges) do not.
    return max(1, sum(1 for iface in net.iterdir() if (iface / "device").exists()))


def _os_name(detected_os: str) -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))} ({detected_os})"
    except OSError:
        pass
    return detected_os or platform.platform()


def _gib(count: float) -> str:
    return f"{count / 2**30:.0f} GB"


def describe(*, division: str, submitter: str, system_name: str, detected: dict[str, Any],
             software: dict[str, str], backends: Iterable[str], hardware_refs: Iterable[str],
             fields: dict[str, str] | None = None) -> dict[str, str]:
    """The system description; `fields` (from flags or a file) win over what was detected."""
    logical = int(detected.get("logical_cpus") or os.cpu_count() or 1)
    gpus = list(detected.get("gpus") or [])
    mhz = _cpuinfo_first("cpu mhz")
    cache = _cpuinfo_first("cache size")
    frameworks = ", ".join(f"{b} {software.get(b, '')}".strip() for b in sorted(set(backends))) or UNDETECTED
    other = ", ".join(f"{name} {version}" for name, version in sorted(software.items())
                      if name not in set(backends))
    try:
        storage = _gib(shutil.disk_usage("/").total)
    except OSError:
        storage = UNDETECTED
    na = "N/A"
    desc = {
        "division": division, "submitter": submitter, "status": "available", "system_name": system_name,
        "system_type": "edge", "system_type_detail": UNDETECTED, "number_of_nodes": "1",
        "host_processor_model_name": str(detected.get("cpu_model") or UNDETECTED),
        "host_processors_per_node": str(_sockets()), "host_processor_core_count": str(_physical_cores(logical)),
        "host_processor_frequency": f"{float(mhz):.0f} MHz" if mhz else UNDETECTED,
        "host_processor_caches": f"{cache} (cache size in /proc/cpuinfo)" if cache else UNDETECTED,
        "host_processor_interconnect": na,
        "host_memory_capacity": _gib(float(detected.get("memory_bytes") or 0)) if detected.get("memory_bytes")
        else UNDETECTED,
        "host_memory_configuration": UNDETECTED, "host_storage_capacity": storage,
        "host_storage_type": UNDETECTED, "host_networking": na, "host_networking_topology": na,
        "host_network_card_count": str(_network_cards()),
        "accelerators_per_node": str(len(gpus)), "accelerator_model_name": gpus[0] if gpus else na,
        "accelerator_memory_capacity": na, "accelerator_memory_configuration": na,
        "accelerator_host_interconnect": na, "accelerator_interconnect": na,
        "accelerator_interconnect_topology": na, "accelerator_frequency": na, "accelerator_on-chip_memories": na,
        "cooling": UNDETECTED, "framework": frameworks,
        "operating_system": _os_name(str(detected.get("os") or "")),
        "other_software_stack": f"Python {detected.get('python', platform.python_version())}"
                                + (f", {other}" if other else ""),
        "hw_notes": f"Detected by mlharness; {logical} logical CPUs available; hardware manifest(s): "
                    f"{', '.join(sorted(set(hardware_refs))) or 'none'}",
        "sw_notes": "Run with mlharness (LoadGen via mlcommons-loadgen); manifests and code in src/",
    }
    for key, value in (fields or {}).items():
        if key not in SYSTEM_FIELDS:
            raise UserError(f"--system-field {key}: not a system description field "
                            f"(known: {', '.join(SYSTEM_FIELDS)})")
        desc[key] = str(value)
    desc["division"], desc["submitter"] = division, submitter  # must match the folders
    return {key: desc[key] for key in SYSTEM_FIELDS}


def undetected(desc: dict[str, str]) -> list[str]:
    return [key for key, value in desc.items() if value == UNDETECTED]


def parse_fields(items: Iterable[str], files: Iterable[str]) -> dict[str, str]:
    """--system-file FILE (a JSON object) entries, then --system-field KEY=VALUE flags."""
    fields: dict[str, str] = {}
    for name in files:
        path = Path(name)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{path}: expected a JSON object of system description fields: {exc}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a JSON object of system description fields")
        fields.update({str(k): str(v) for k, v in data.items()})
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--system-field {item!r}: expected KEY=VALUE")
        fields[key.strip()] = value.strip()
    return fields
