"""What machine and software a run is on: detected, recorded beside the hardware manifest, and
checked against the software manifest."""
from __future__ import annotations

import os
import platform
import re
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

from mlharness.errors import UserError
from mlharness.specs.manifests import SoftwareManifest

RECORDED_PACKAGES = ("mlcommons-loadgen", "numpy", "onnxruntime", "onnx", "torch", "transformers", "mlharness")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_names() -> list[str]:
    """GPUs seen through NVML when the library is there; none otherwise (never guessed)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            return [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                    for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver, or no GPU: all mean "no GPU here"
        return []


def package_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def detect_system() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count() or 1,
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "gpus": gpu_names(),
    }


def software_versions() -> dict[str, str]:
    return {dist: v for dist in RECORDED_PACKAGES if (v := package_version(dist))}


def system_name(system: dict[str, Any], device: str = "cpu") -> str:
    """A stable folder name for this machine and device: CPU model and core count, filesystem-safe,
    and the device when it is not the CPU (a CUDA run and a CPU run of one host are two systems)."""
    cpu = re.sub(r"\(R\)|\(TM\)|CPU|@.*$", "", system["cpu_model"]).strip()
    cpu = re.sub(r"[^A-Za-z0-9]+", "_", cpu).strip("_") or "cpu"
    name = f"{cpu}_{system['logical_cpus']}c"
    return name if device == "cpu" else f"{name}_{re.sub(r'[^A-Za-z0-9]+', '', device)}"


# Packages `make setup` leaves out (slow to build) and how to get them.
INSTALL_HINTS = {"llama-cpp-python": "`make setup-test` builds it (about 5 minutes on 2 cores, portable flags; docs/llm.md)"}


def check_software(manifest: SoftwareManifest) -> dict[str, str]:
    """Installed versions of the manifest's packages; a missing package or a mismatch is a UserError."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    installed: dict[str, str] = {}
    for dist, constraint in manifest.packages.items():
        version = package_version(dist)
        if version is None:
            hint = f"; {INSTALL_HINTS[dist]}" if dist in INSTALL_HINTS else ""
            raise UserError(f"{manifest.path}: packages.{dist}: expected {dist}{constraint} installed, it is not{hint}")
        if constraint and Version(version) not in SpecifierSet(constraint, prereleases=True):
            raise UserError(f"{manifest.path}: packages.{dist}: expected {dist}{constraint}, installed {version}")
        installed[dist] = version
    return installed
