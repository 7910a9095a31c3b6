"""A sweep's cells on a Ray cluster: placement, faults, progress (docs/cluster.md).

The driver places each cell itself, on an alive mlharness node whose advertised resources satisfy the
cell's needs (mlharness.cluster.resources) and that has a free slot, and pins the Ray task there (node
affinity) while the task still asks for the resources: so the driver knows which cell runs where
(progress, retries), and Ray refuses to run two cells on one slot even beside another sweep.

- A cell no alive node can satisfy is recorded `unschedulable` at once, with what it needs.
- A node lost mid-cell (its worker killed, its raylet gone, the connection lost): the cell is recorded
  failed with the cause at once, then run again, once, on another matching node (the same node only
  when no other matches); the retry's row replaces the failed one and keeps the first cause in `error`.
- Ctrl-C or SIGTERM: the cells in flight are cancelled (their runs stopped on their nodes, nothing of them
  recorded); what finished is recorded; the same command resumes with the cells not done.
- Only this process writes the results tree and the database (mlharness.cluster.ray_launcher.finish).
  The cells run in the local sweep's own loop (mlharness.sweeps.cell_loop.run_cells), which records
  each and stops the sweep; this module is the loop's slots (`NodeSlots`) and its progress display."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mlharness.cluster import resources as res
from mlharness.cluster.ray_launcher import RayLauncher, node_info, require_ray
from mlharness.errors import UserError
from mlharness.records.run_record import utc_now
from mlharness.running.progress import Snapshot, Steps, clock
from mlharness.running.request import RunRequest
from mlharness.running.resolve import resolved_for_run
from mlharness.sweeps.cell_loop import STDERR_KEPT_CHARS, CellEvent, CellJob, cell_result

NODES_REFRESH_S = 1.0  # how often the alive nodes are read from the cluster
WAIT_S = 0.25  # one ray.wait
DRIVER_GRACE_S = 60.0  # past the cell's timeout, the driver cancels a task its node did not stop
# After Ctrl-C, how long the driver waits for the cancelled cells to stop on their nodes. It leaves as
# soon as they have; leaving before makes Ray kill their workers, which cuts short the node's cleanup
# (a CI run's driver waited 5 s under load and left a scratch folder behind).
CANCEL_WAIT_S = 30.0


@dataclass
class Node:
    node_id: str
    name: str
    resources: dict[str, float]
    load: float = 0.0  # slot fractions of the cells placed here

    def free_for(self, need: float) -> bool:
        return self.load + need <= self.resources.get(res.SLOT, 0.0) + 1e-6


@dataclass
class Placement:
    """Where a cell run is, for the cluster: its resolved request, what it needs, the node it runs on."""
    request: RunRequest
    needs: dict[str, float]
    attempt: int = 0
    avoid: set[str] = field(default_factory=set)
    first_cause: str | None = None
    node: Node | None = None
    start: float = 0.0
    ref: Any = None
    overdue: bool = False  # cancelled by the driver past its timeout


class ClusterSteps(Steps):
    """The sweep's progress (mlharness.running.progress.Steps): done, failed and left with an ETA from
    the cells' mean time over the cells running at once, and one line per node with its cells."""

    def __init__(self, total: int, stream: TextIO | None, quiet: bool):
        super().__init__(total, stream, quiet=quiet, unit="cells")
        self.failed = 0
        self.nodes: dict[str, list[tuple[str, float]]] = {}  # node name -> (label, started)

    def finished(self, label: str, status: str, seconds: float) -> None:
        if status != "ok":
            with self._lock:
                self.failed += 1
        super().finished(label, status, seconds)

    def node_seen(self, node: str) -> None:
        with self._lock:
            self.nodes.setdefault(node, [])

    def node_started(self, node: str, label: str) -> None:
        with self._lock:
            self.nodes.setdefault(node, []).append((label, time.monotonic()))

    def node_done(self, node: str, label: str) -> None:
        with self._lock:
            if node in self.nodes:
                self.nodes[node] = [item for item in self.nodes[node] if item[0] != label]

    def node_gone(self, node: str) -> None:
        with self._lock:
            self.nodes.pop(node, None)

    def eta(self) -> float | None:
        if not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        at_once = max(1, sum(len(cells) for cells in self.nodes.values()))
        return mean * (self.total - self.done) / at_once

    def _read(self) -> Snapshot:
        with self._lock:
            now = time.monotonic()
            lines = [f"{self.failed} failed, {self.total - self.done} left"]
            for node in sorted(self.nodes):
                cells = self.nodes[node]
                doing = "; ".join(f"{label} for {clock(now - started)}" for label, started in cells) or "idle"
                lines.append(f"  node {node}: {doing}")
            return Snapshot(self.done, self.total, self.eta(), "\n".join(lines))


def alive_nodes(ray: Any) -> dict[str, Node]:
    """The cluster's alive nodes that advertise mlharness resources (started by `mlharness node`)."""
    found = {}
    for entry in ray.nodes():
        resources = {k: float(v) for k, v in (entry.get("Resources") or {}).items()}
        if entry.get("Alive") and res.SLOT in resources:
            node_id = entry["NodeID"]
            found[node_id] = Node(node_id, res.node_name(resources, entry.get("NodeManagerHostname") or node_id[:8]),
                                  resources)
    return found


def node_slots(jobs: list[CellJob], options: Any, grid: Any, stream: TextIO) -> NodeSlots:
    """mlharness.sweeps.sweep.run_sweep's slots on the connected Ray cluster: a slot per free share of
    each alive mlharness node (`cluster: {cells_per_node: N}` in the grid)."""
    ray = require_ray()
    placements = {}
    for job in jobs:
        # Resolved here, on the driver: the node gets user.conf's text, not a path that may not exist there.
        request = resolved_for_run(job.request)
        placements[job] = Placement(request, res.cell_needs(request, grid.cells_per_node))
    nodes = alive_nodes(ray)
    if jobs and not nodes:
        raise UserError("no node of the Ray cluster advertises mlharness resources; start each node with "
                        "`mlharness node` (docs/cluster.md)")
    print(f"cluster: {len(nodes)} node(s): " + ", ".join(sorted(n.name for n in nodes.values())), file=stream)
    progress = ClusterSteps(len(jobs), stream, options.quiet)
    for node in nodes.values():
        progress.node_seen(node.name)
    return NodeSlots(ray, placements, nodes, progress, RayLauncher(db_path=Path(options.db_path).resolve()))


class NodeSlots:
    """The cluster's slots (mlharness.sweeps.cell_loop.CellSlots): placement on the nodes, a lost
    node's cell given back to run again, a cell its node did not stop cancelled past its timeout."""
    runs_elsewhere = True

    def __init__(self, ray: Any, placements: dict[CellJob, Placement], nodes: dict[str, Node],
                 progress: ClusterSteps, launcher: RayLauncher):
        self.ray, self.placements, self.nodes, self.progress = ray, placements, nodes, progress
        self.launcher = launcher
        self.running: dict[Any, CellJob] = {}
        self.lost: set[str] = set()  # nodes a cell was lost on: never placed on again (Ray gives a rejoining node a new id)
        self.refreshed = time.monotonic()

    def busy(self) -> bool:
        return bool(self.running)

    def place(self, waiting: deque[CellJob]) -> list[CellEvent]:
        self._refresh()
        events, kept = [], deque()
        while waiting:
            job = waiting.popleft()
            at = self.placements[job]
            matching = [n for n in self.nodes.values() if res.satisfies(n.resources, at.needs)]
            if not matching:
                events.append(self._unplaceable(job))
                continue
            others = [n for n in matching if n.node_id not in at.avoid]
            candidates = others or matching  # a retry goes elsewhere when anywhere else matches
            free = [n for n in candidates if n.free_for(at.needs[res.SLOT])]
            if not free:
                kept.append(job)
                continue
            self._start(job, min(free, key=lambda n: (n.load, n.name)))
        waiting.extend(kept)
        return events

    def next_done(self) -> list[CellEvent]:
        if not self.running:
            time.sleep(WAIT_S)  # matching nodes exist, none free (another sweep's cells)
            return []
        ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=WAIT_S)
        events = [self._collect(self.running.pop(ref), ref) for ref in ready]
        self._overdue()
        return events

    def stop(self) -> tuple[list[CellEvent], int | None]:
        """Ctrl-C or SIGTERM: collect what already ended, cancel what is in flight (its run stopped on its node)."""
        in_flight = list(self.running)
        done, _ = self.ray.wait(in_flight, num_returns=len(in_flight), timeout=0) if in_flight else ([], [])
        events = []
        for ref in done:
            job = self.running.pop(ref)
            try:
                events.append(self._collect(job, ref))
            except Exception:  # noqa: BLE001 - stopping anyway; the cell stays to do
                pass
        cancelled = list(self.running)
        for ref in cancelled:
            self.ray.cancel(ref, force=False)
        if cancelled:
            _, still = self.ray.wait(cancelled, num_returns=len(cancelled), timeout=CANCEL_WAIT_S)
            if still:
                self.progress.say(f"{len(still)} cancelled cell(s) still running on their nodes after "
                                  f"{CANCEL_WAIT_S:g} s; leaving them (their scratch folders may stay in "
                                  "the nodes' temp folder)")
        return events, len(cancelled)

    def _refresh(self) -> None:
        if time.monotonic() - self.refreshed < NODES_REFRESH_S:
            return
        self.refreshed = time.monotonic()
        fresh = {k: n for k, n in alive_nodes(self.ray).items() if k not in self.lost}
        for node_id, node in fresh.items():
            if node_id in self.nodes:
                node.load = self.nodes[node_id].load
        for node_id, node in self.nodes.items():
            if node_id not in fresh:
                self.progress.node_gone(node.name)
        for node_id, node in fresh.items():
            if node_id not in self.nodes:
                self.progress.node_seen(node.name)
        self.nodes = fresh

    def _start(self, job: CellJob, node: Node) -> None:
        at = self.placements[job]
        at.node, job.started_at, at.start = node, utc_now(), time.monotonic()
        node.load += at.needs[res.SLOT]
        at.ref = self.launcher.start(at.request, at.needs, node.node_id)
        self.running[at.ref] = job
        self.progress.node_started(node.name, job.label)

    def _release(self, job: CellJob) -> float:
        at = self.placements[job]
        assert at.node is not None
        node = self.nodes.get(at.node.node_id, at.node)
        node.load = max(0.0, node.load - at.needs[res.SLOT])
        self.progress.node_done(at.node.name, job.label)
        return time.monotonic() - at.start

    def _forget(self, node: Node | None) -> None:
        """A node a cell was lost on takes no more cells (the cluster may still list it as alive for a while)."""
        if node is not None:
            self.lost.add(node.node_id)
            if self.nodes.pop(node.node_id, None) is not None:
                self.progress.node_gone(node.name)

    # ---- results
    def _collect(self, job: CellJob, ref: Any) -> CellEvent:
        at, exceptions = self.placements[job], self.ray.exceptions
        try:
            payload = self.ray.get(ref)
        except exceptions.RayError if at.overdue else ():
            self._release(job)
            return self._event(job, {"status": "failed", "run_id": None, "stderr": "",
                                     "error": f"cancelled on node {at.node.name} after {at.request.timeout:g} s "
                                              f"(the cell's timeout; its node did not stop it)"}, 0.0)
        except exceptions.RayTaskError as exc:  # our task raised on the node: a failed cell, not a lost node
            self._release(job)
            return self._event(job, {"status": "failed", "run_id": None, "stderr": str(exc)[-STDERR_KEPT_CHARS:],
                                     "error": f"on node {at.node.name}: {_task_error(exc)}"}, 0.0)
        except exceptions.TaskUnschedulableError:  # its node went away before the cell started: place it again
            self._release(job)
            self._forget(at.node)
            at.node, at.ref = None, None
            return CellEvent(job, None)
        except exceptions.RayError as exc:  # the worker or the node died, or the connection to it was lost
            seconds = self._release(job)
            self._forget(at.node)
            return self._lost(job, exc, seconds)
        seconds = self._release(job)
        outcome, output = self.launcher.finish(at.request, payload, node_info(payload, at.node.name))
        result = cell_result(outcome, output)
        if at.first_cause:
            result["error"] = f"{at.first_cause}; retried on node {at.node.name}" + \
                (f": {result['error']}" if result.get("error") else "")
        return self._event(job, result, seconds)

    def _event(self, job: CellJob, result: dict[str, Any], seconds: float) -> CellEvent:
        node = self.placements[job].node
        return CellEvent(job, result, seconds, where=f" on {node.name}" if node is not None else "")

    def _lost(self, job: CellJob, exc: Exception, seconds: float) -> CellEvent:
        at = self.placements[job]
        cause = f"node {at.node.name} lost while running the cell ({type(exc).__name__}: {_first_line(exc)})"
        if at.attempt == 0:
            # Recorded failed by the loop, then run again.
            at.attempt, at.first_cause = 1, cause
            at.avoid.add(at.node.node_id)
            at.node, at.ref = None, None
            return CellEvent(job, {"status": "failed", "run_id": None, "error": cause + "; retrying on another node",
                                   "stderr": ""}, seconds,
                             again=f"{job.label}: {cause}; retrying on another matching node")
        return self._event(job, {"status": "failed", "run_id": None, "stderr": "",
                                 "error": f"{at.first_cause}; the retry: {cause}"}, seconds)

    def _unplaceable(self, job: CellJob) -> CellEvent:
        at = self.placements[job]
        wants = res.describe_needs(at.needs)
        have = "; ".join(f"{n.name}: " + ", ".join(sorted(k for k in n.resources if k.startswith("mlharness_")
                                                            and k != res.SLOT))
                         for n in sorted(self.nodes.values(), key=lambda n: n.name))
        if at.first_cause:
            result = {"status": "failed", "error": f"{at.first_cause}; no other node has {wants} to retry it on"}
        else:
            result = {"status": "unschedulable", "error": f"no node of the cluster has {wants} (nodes: {have})"}
        job.started_at = job.started_at or utc_now()
        return self._event(job, result | {"run_id": None, "stderr": ""}, 0.0)

    def _overdue(self) -> None:
        for ref, job in list(self.running.items()):
            at = self.placements[job]
            if time.monotonic() - at.start > at.request.timeout + DRIVER_GRACE_S and not at.overdue:
                at.overdue = True
                self.ray.cancel(ref, force=True)


def _task_error(exc: BaseException) -> str:
    """What a task that raised on a node said: its own exception's first line, a user error's alone and a
    bug's with its type (Ray's RayTaskError leads with a coloured `ray::task() (pid=..., ip=...)` line
    that says nothing of it; the whole is kept in the cell's stderr)."""
    cause = getattr(exc, "cause", None)
    if not isinstance(cause, BaseException):
        return _first_line(exc)
    return _first_line(cause) if isinstance(cause, UserError) else f"{type(cause).__name__}: {_first_line(cause)}"


def _first_line(exc: BaseException) -> str:
    """The first sentence of an error (Ray's go on for lines)."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    return line.split(". ")[0].rstrip(".")[:200]
