"""A sweep's cells on a Ray cluster: placement, faults, progress (docs/cluster.md).

The driver places each cell itself, on an alive mlharness node whose advertised resources satisfy the
cell's needs (mlharness.cluster.resources) and that has a free slot, and pins the Ray task there (node
affinity) while the task still asks for the resources: so the driver knows which cell runs where
(progress, retries), and Ray refuses to run two cells on one slot even beside another sweep.

- A cell no alive node can satisfy is recorded `unschedulable` at once, with what it needs.
- A node lost mid-cell (its worker killed, its raylet gone, the connection lost): the cell is recorded
  failed with the cause at once, then run again, once, on another matching node (the same node only
  when no other matches); the retry's row replaces the failed one and keeps the first cause in `error`.
- Ctrl-C: the cells in flight are cancelled (their runs stopped on their nodes, nothing of them
  recorded); what finished is recorded; the same command resumes with the cells not done.
- Only this process writes the results tree and the database (mlharness.cluster.ray_launcher.finish),
  through the same recording as a local sweep (mlharness.sweeps.sweep.cell_result, record_cell_run)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from mlharness.cluster import resources as res
from mlharness.cluster.ray_launcher import RayLauncher, node_info, require_ray
from mlharness.errors import RunInterrupted, UserError
from mlharness.records.run_record import utc_now
from mlharness.running.progress import Snapshot, Steps, clock
from mlharness.running.resolve import resolved_for_run
from mlharness.sweeps.sweep import SweepResult, cell_result, record_cell_run

NODES_REFRESH_S = 1.0  # how often the alive nodes are read from the cluster
WAIT_S = 0.25  # one ray.wait
DRIVER_GRACE_S = 60.0  # past the cell's timeout, the driver cancels a task its node did not stop
CANCEL_WAIT_S = 5.0  # after Ctrl-C, how long cancelled cells get to stop on their nodes


@dataclass
class Node:
    node_id: str
    name: str
    resources: dict[str, float]
    load: float = 0.0  # slot fractions of the cells placed here

    def free_for(self, need: float) -> bool:
        return self.load + need <= self.resources.get(res.SLOT, 0.0) + 1e-6


@dataclass
class Job:
    cell: Any
    repeat_index: int
    label: str
    request: Any
    needs: dict[str, float]
    attempt: int = 0
    avoid: set[str] = field(default_factory=set)
    first_cause: str | None = None
    node: Node | None = None
    started_at: str = ""
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


def run_cells(todo: list, repeat: int, sweep_id: str, plan: list, options: Any, timeout_s: float,
              stream: TextIO, grid: Any) -> SweepResult:
    """mlharness.sweeps.sweep.run_sweep's cells_runner on the connected Ray cluster."""
    ray = require_ray()
    per_node = grid.cells_per_node
    jobs: deque[Job] = deque()
    for cell, repeat_index in todo:
        # Resolved here, on the driver: the node gets user.conf's text, not a path that may not exist there.
        request = replace(cell.request_for(Path(options.results_dir).resolve(), timeout_s), quiet=True)
        request = resolved_for_run(request)
        label = cell.label() + (f" #{repeat_index + 1}" if repeat > 1 else "")
        jobs.append(Job(cell, repeat_index, label, request, res.cell_needs(request, per_node)))
    nodes = alive_nodes(ray)
    if jobs and not nodes:
        raise UserError("no node of the Ray cluster advertises mlharness resources; start each node with "
                        "`mlharness node` (docs/cluster.md)")
    print(f"cluster: {len(nodes)} node(s): " + ", ".join(sorted(n.name for n in nodes.values())), file=stream)
    progress = ClusterSteps(len(jobs), stream, options.quiet)
    for node in nodes.values():
        progress.node_seen(node.name)
    state = _Sweep(ray, sweep_id, options, nodes, progress, timeout_s)
    with state.progress:
        state.run(jobs)
    return SweepResult(sweep_id, len(plan), len(plan) - len(todo), state.outcomes)


class _Sweep:
    def __init__(self, ray: Any, sweep_id: str, options: Any, nodes: dict[str, Node], progress: ClusterSteps,
                 timeout_s: float):
        self.ray, self.sweep_id, self.options, self.nodes = ray, sweep_id, options, nodes
        self.progress, self.timeout_s = progress, timeout_s
        self.launcher = RayLauncher(db_path=Path(options.db_path).resolve())
        self.running: dict[Any, Job] = {}
        self.outcomes: list = []
        self.lost: set[str] = set()  # nodes a cell was lost on: never placed on again (Ray gives a rejoining node a new id)
        self.refreshed = time.monotonic()

    # ---- the loop
    def run(self, jobs: deque[Job]) -> None:
        try:
            while jobs or self.running:
                self._refresh()
                self._place(jobs)
                if not self.running:
                    if jobs:
                        time.sleep(WAIT_S)  # matching nodes exist, none free (another sweep's cells)
                    continue
                ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    self._collect(self.running.pop(ref), ref, jobs)
                self._overdue()
        except KeyboardInterrupt:
            self._interrupted()

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

    def _place(self, jobs: deque[Job]) -> None:
        waiting: deque[Job] = deque()
        while jobs:
            job = jobs.popleft()
            matching = [n for n in self.nodes.values() if res.satisfies(n.resources, job.needs)]
            if not matching:
                self._unplaceable(job)
                continue
            others = [n for n in matching if n.node_id not in job.avoid]
            candidates = others or matching  # a retry goes elsewhere when anywhere else matches
            free = [n for n in candidates if n.free_for(job.needs[res.SLOT])]
            if not free:
                waiting.append(job)
                continue
            node = min(free, key=lambda n: (n.load, n.name))
            self._start(job, node)
        jobs.extend(waiting)

    def _start(self, job: Job, node: Node) -> None:
        job.node, job.started_at, job.start = node, utc_now(), time.monotonic()
        node.load += job.needs[res.SLOT]
        job.ref = self.launcher.start(job.request, job.needs, node.node_id)
        self.running[job.ref] = job
        self.progress.node_started(node.name, job.label)

    def _release(self, job: Job) -> float:
        assert job.node is not None
        node = self.nodes.get(job.node.node_id, job.node)
        node.load = max(0.0, node.load - job.needs[res.SLOT])
        self.progress.node_done(job.node.name, job.label)
        return time.monotonic() - job.start

    # ---- results
    def _collect(self, job: Job, ref: Any, jobs: deque[Job]) -> None:
        exceptions = self.ray.exceptions
        try:
            payload = self.ray.get(ref)
        except exceptions.RayError if job.overdue else ():
            self._release(job)
            self._record(job, {"status": "failed", "run_id": None, "stderr": "",
                               "error": f"cancelled on node {job.node.name} after {self.timeout_s:g} s "
                                        f"(the cell's timeout; its node did not stop it)"}, 0.0)
            return
        except exceptions.RayTaskError as exc:  # our task raised on the node: a failed cell, not a lost node
            self._release(job)
            self._record(job, {"status": "failed", "run_id": None, "stderr": str(exc)[-8000:],
                               "error": f"on node {job.node.name}: {_first_line(exc)}"}, 0.0)
            return
        except exceptions.TaskUnschedulableError:  # its node went away before the cell started: place it again
            self._release(job)
            self._forget(job.node)
            job.node, job.ref = None, None
            jobs.appendleft(job)
            return
        except exceptions.RayError as exc:  # the worker or the node died, or the connection to it was lost
            seconds = self._release(job)
            self._forget(job.node)
            self._lost(job, exc, seconds, jobs)
            return
        seconds = self._release(job)
        outcome, output = self.launcher.finish(job.request, payload, node_info(payload, job.node.name))
        result = cell_result(outcome, output)
        if job.first_cause:
            result["error"] = f"{job.first_cause}; retried on node {job.node.name}" + \
                (f": {result['error']}" if result.get("error") else "")
        self._record(job, result, seconds)

    def _forget(self, node: Node | None) -> None:
        """A node a cell was lost on takes no more cells (the cluster may still list it as alive for a while)."""
        if node is not None:
            self.lost.add(node.node_id)
            if self.nodes.pop(node.node_id, None) is not None:
                self.progress.node_gone(node.name)

    def _lost(self, job: Job, exc: Exception, seconds: float, jobs: deque[Job]) -> None:
        cause = f"node {job.node.name} lost while running the cell ({type(exc).__name__}: {_first_line(exc)})"
        if job.attempt == 0:
            # Recorded at once (a driver that dies now leaves a failed cell, not a missing one), then retried.
            record_cell_run(self.options.db_path, self.sweep_id, job.cell, job.repeat_index,
                            {"status": "failed", "run_id": None, "error": cause + "; retrying on another node",
                             "stderr": ""}, job.started_at, seconds)
            self.progress.say(f"{job.label}: {cause}; retrying on another matching node")
            job.attempt, job.first_cause = 1, cause
            job.avoid.add(job.node.node_id)
            job.node, job.ref = None, None
            jobs.appendleft(job)
            return
        self._record(job, {"status": "failed", "run_id": None, "stderr": "",
                           "error": f"{job.first_cause}; the retry: {cause}"}, seconds)

    def _unplaceable(self, job: Job) -> None:
        wants = res.describe_needs(job.needs)
        have = "; ".join(f"{n.name}: " + ", ".join(sorted(k for k in n.resources if k.startswith("mlharness_")
                                                            and k != res.SLOT))
                         for n in sorted(self.nodes.values(), key=lambda n: n.name))
        if job.first_cause:
            result = {"status": "failed", "error": f"{job.first_cause}; no other node has {wants} to retry it on"}
        else:
            result = {"status": "unschedulable", "error": f"no node of the cluster has {wants} (nodes: {have})"}
        job.started_at = job.started_at or utc_now()
        self._record(job, result | {"run_id": None, "stderr": ""}, 0.0)

    def _record(self, job: Job, result: dict[str, Any], seconds: float) -> None:
        self.outcomes.append(record_cell_run(self.options.db_path, self.sweep_id, job.cell, job.repeat_index, result,
                                             job.started_at or utc_now(), seconds))
        if result["status"] != "ok":
            self.progress.failed += 1
        where = f" on {job.node.name}" if job.node is not None else ""
        status = result["status"] if result["status"] == "ok" else f"{result['status'].upper()}: {result.get('error')}"
        self.progress.finished(job.label + where, status, seconds)

    def _overdue(self) -> None:
        limit = self.timeout_s + DRIVER_GRACE_S
        for ref, job in list(self.running.items()):
            if time.monotonic() - job.start > limit and not job.overdue:
                job.overdue = True
                self.ray.cancel(ref, force=True)

    def _interrupted(self) -> None:
        """Ctrl-C: cancel what is in flight, record what already finished, stop with 130."""
        in_flight = list(self.running)
        done, _ = self.ray.wait(in_flight, num_returns=len(in_flight), timeout=0) if in_flight else ([], [])
        for ref in done:
            job = self.running.pop(ref)
            try:
                self._collect(job, ref, deque())
            except Exception:  # noqa: BLE001 - stopping anyway; the cell stays to do
                pass
        cancelled = list(self.running)
        for ref in cancelled:
            self.ray.cancel(ref, force=False)
        if cancelled:
            self.ray.wait(cancelled, num_returns=len(cancelled), timeout=CANCEL_WAIT_S)
        raise RunInterrupted(f"sweep {self.sweep_id} interrupted; {len(self.outcomes)} cell run(s) recorded, "
                             f"{len(cancelled)} cancelled on their nodes; resume with the same command", 130)


def _first_line(exc: BaseException) -> str:
    """The first sentence of an error (Ray's go on for lines)."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    return line.split(". ")[0].rstrip(".")[:200]
