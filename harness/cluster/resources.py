"""What a node advertises and what a cell needs, as Ray custom resources. No Ray here: plain data.

A node (`mlharness node`) advertises:
- `mlharness_slot: 1` — cells share a node only by fractions of it: a cell asks for 1/N of a slot, N
  the grid's `cluster: {cells_per_node: N}` (default 1: a benchmark never shares its host);
- `mlharness_node:<name>: 1` — its name (default the host name), shown in progress and kept in each
  record's `system.cluster_node`;
- `mlharness_system:<system name>: 1` — the detected system as `mlharness.running.system.system_name`
  names it (CPU model and core count, e.g. `Intel_Xeon_Platinum_8370C_16c`), once per device it has
  (`..._cuda0` for its first GPU), plus any alias given with `mlharness node --system NAME`;
- `mlharness_gpu:<GPU name>: count` per GPU model, and Ray's own `GPU` count (Ray detects it).

A cell asks for its slot fraction; a hardware manifest with `device: cuda:N` adds `GPU: N+1`, and one
with `system: NAME` adds a token amount of `mlharness_system:NAME` (a label, not a quantity)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from mlharness.errors import UserError

SLOT = "mlharness_slot"
NODE_PREFIX = "mlharness_node:"
SYSTEM_PREFIX = "mlharness_system:"
GPU_PREFIX = "mlharness_gpu:"
LABEL_AMOUNT = 0.001  # what a cell asks of a label resource (each node has 1 of it)
_EPSILON = 1e-6


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unknown"


def node_resources(system: Mapping[str, Any], name: str, aliases: tuple[str, ...] = ()) -> dict[str, float]:
    """The custom resources a node with this detected system (mlharness.running.system.detect_system)
    advertises under `name`."""
    from mlharness.running.system import system_name

    found: dict[str, float] = {SLOT: 1.0, NODE_PREFIX + _safe(name): 1.0,
                               SYSTEM_PREFIX + system_name(dict(system)): 1.0}
    gpus = list(system.get("gpus") or [])
    for index in range(len(gpus)):
        found[SYSTEM_PREFIX + system_name(dict(system), f"cuda:{index}")] = 1.0
    for gpu in gpus:
        key = GPU_PREFIX + _safe(str(gpu))
        found[key] = found.get(key, 0.0) + 1.0
    for alias in aliases:
        if not alias.strip():
            raise UserError("--system: expected a system name, got an empty one")
        found[SYSTEM_PREFIX + alias.strip()] = 1.0
    return found


def node_name(resources: Mapping[str, float], fallback: str) -> str:
    """A node's mlharness name, from its advertised resources."""
    names = sorted(k[len(NODE_PREFIX):] for k in resources if k.startswith(NODE_PREFIX))
    return names[0] if names else fallback


def cell_needs(request: Any, per_node: int = 1) -> dict[str, float]:
    """The Ray resources a cell's RunRequest needs, from its hardware manifest."""
    from mlharness.specs.index import SpecIndex, default_index

    index = SpecIndex(request.specs_root) if request.specs_root else default_index()
    hardware = index.find("hardware", request.hardware)
    needs = {SLOT: round(1.0 / per_node, 4)}
    kind, _, number = hardware.device.partition(":")
    if kind == "cuda":
        needs["GPU"] = float(int(number or 0) + 1)
    system = hardware.doc.get("system") if isinstance(hardware.doc, dict) else None
    if system is not None:
        if not isinstance(system, str) or not system.strip():
            raise UserError(f"{Path(hardware.path)}: system: expected a system name "
                            f"(as `mlharness node --dry-run` lists them), got {system!r}")
        needs[SYSTEM_PREFIX + system.strip()] = LABEL_AMOUNT
    return needs


def satisfies(resources: Mapping[str, float], needs: Mapping[str, float]) -> bool:
    """A node with these total resources can run a cell with these needs (when idle)."""
    return all(resources.get(key, 0.0) + _EPSILON >= amount for key, amount in needs.items())


def describe_needs(needs: Mapping[str, float]) -> str:
    parts = []
    for key, amount in sorted(needs.items()):
        if key == SLOT:
            continue
        parts.append(key if amount == LABEL_AMOUNT else f"{key}={amount:g}")
    return ", ".join(parts) or "an mlharness node"
