"""Run RunRequests as Ray tasks, behind the same Launcher interface as harness.running.launcher.

On the node, the task hands the request to a `LocalLauncher(store=False)`: the cell runs in a fresh
process of its own, as on one machine (one LoadGen test per process, the request's timeout, signals,
a crash becoming a failed record), with a scratch results folder of the node's. The task returns
data: the Outcome envelope, the run's folder and its system description as bytes, and the tail of
the run's output. Only the driver (`RayLauncher.finish`) writes: the files go into the driver's
results tree (the paths in the record are moved from the node's scratch folder to it), the view of the
scenario folder is rebuilt, and the record is stored in the driver's database.

Ray is imported only here and only when a cluster is used (`require_ray`)."""
from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlharness.atomic_io import write_json, write_text
from mlharness.cluster.address import DEFAULT_CONNECT_TIMEOUT_S, parse_cluster_address, probe
from mlharness.errors import UserError, require
from mlharness.running.outcome import Outcome
from mlharness.running.run_folders import store_record
from mlharness.running.request import RunRequest

EXTRA = "cluster"
OUTPUT_KEPT_CHARS = 8000  # the tail of the run's output sent back (what the sweep keeps of a failed cell)
_TASK: Any = None


def require_ray() -> Any:
    """The ray module, or a one-line error naming the extra."""
    return require("ray", EXTRA, "--cluster and mlharness node (sweeps on a Ray cluster)")


# ---- on the node -----------------------------------------------------------------------------------

def run_on_node(request_json: str) -> dict[str, Any]:
    """The Ray task's body, on the node: run the request in a fresh local process (LocalLauncher,
    not stored here) under a scratch results folder; return the outcome and the run's files as data."""
    from mlharness.running.launcher import LocalLauncher

    scratch = Path(tempfile.mkdtemp(prefix="mlharness-node-cell-"))
    try:
        results_dir = scratch / "results"
        request = replace(RunRequest.from_json(request_json), results_dir=results_dir)
        output = scratch / "output"
        outcome = LocalLauncher(store=False, output=output).submit(request)
        text = output.read_text(errors="replace")[-OUTPUT_KEPT_CHARS:] if output.is_file() else ""
        traceback_text = None
        if outcome.traceback_path and Path(outcome.traceback_path).is_file():
            traceback_text = Path(outcome.traceback_path).read_text(errors="replace")
        return {"outcome": outcome.to_dict(), "results_dir": str(results_dir),
                "files": _run_files(results_dir, outcome), "output": text, "traceback": traceback_text,
                "hostname": socket.gethostname(), "node_id": _node_id()}
    finally:
        remove_scratch(scratch)


def remove_scratch(scratch: Path) -> None:
    """Remove the task's scratch folder whole, also when the sweep's Ctrl-C cancels the task during the
    removal: Ray raises the cancel as a KeyboardInterrupt in this thread, which would stop the removal
    half-way and leave the folder on the node. The removal finishes, then the interrupt goes on."""
    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            shutil.rmtree(scratch, ignore_errors=True)
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _node_id() -> str | None:
    """The Ray node this task runs on; None on a direct call outside Ray (asking Ray's runtime context
    there would start a local Ray instance of its own)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _run_files(results_dir: Path, outcome: Outcome) -> dict[str, bytes]:
    """The run's own folder (runs/<id>/ or failed-<id>/) and its system description, by path relative
    to the results folder; nothing when the run left no record."""
    record = outcome.record
    if record is None or not record.results_path:
        return {}
    files: dict[str, bytes] = {}
    folder = Path(record.results_path)
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                files[str(path.relative_to(results_dir))] = path.read_bytes()
    system_json = results_dir / f"{record.system_name}.json"
    if record.system_name and system_json.is_file():
        files[system_json.name] = system_json.read_bytes()
    return files


# ---- on the driver ---------------------------------------------------------------------------------

def _moved(value: Any, old: str, new: str) -> Any:
    """`value` with every string path under `old` moved under `new` (recursively)."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + os.sep) else value
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    return value


def node_info(payload: dict[str, Any], name: str | None) -> dict[str, Any]:
    """What a record keeps of the cluster node that ran it (beside the system it detected there)."""
    return {"name": name or payload.get("hostname"), "hostname": payload.get("hostname"),
            "ray_node_id": payload.get("node_id")}


def finish(request: RunRequest, payload: dict[str, Any], node: dict[str, Any] | None = None,
           store: bool = True, db_path: Path | None = None) -> tuple[Outcome, str]:
    """Install what a node sent back into the driver's results tree and database: the run's files
    (moved from the node's scratch folder into `request.results_dir`, run.json's paths with them),
    the scenario's rebuilt view and the stored record. Returns the Outcome (paths moved) and the run's
    output."""
    from mlharness.records.results import RUNS_FOLDER, rebuild_view
    from mlharness.records.run_record import RunRecord

    results_dir = Path(request.results_dir).resolve()
    node_root = payload["results_dir"]
    data = _moved(payload["outcome"], node_root, str(results_dir))
    if payload.get("traceback"):
        path = Path(tempfile.gettempdir()) / Path(data["traceback_path"] or "mlharness-traceback.txt").name
        write_text(path, payload["traceback"])
        data["traceback_path"] = str(path)
    if isinstance(data.get("error"), str):
        data["error"] = data["error"].replace(node_root, str(results_dir))
    if data.get("record") is not None and node is not None:
        data["record"]["system"] = dict(data["record"].get("system") or {}) | {"cluster_node": node}
    outcome = Outcome.from_dict(data, "the outcome sent back by the node")
    record = outcome.record
    if record is not None and payload.get("files"):
        folder = Path(record.results_path)
        incoming = folder.parent / f".incoming-{record.run_id}"
        shutil.rmtree(incoming, ignore_errors=True)
        prefix = str(folder.relative_to(results_dir)) + os.sep
        for rel, content in payload["files"].items():
            if rel.startswith(prefix):
                target = incoming / rel[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            elif os.sep not in rel:  # the system description, <system>.json at the results root
                results_dir.mkdir(parents=True, exist_ok=True)
                (results_dir / rel).write_bytes(content)
        if (incoming / "run.json").is_file():  # the record as the node wrote it, its paths moved here
            written = RunRecord.from_dict(_moved(RunRecord.load(incoming / "run.json").to_dict(), node_root,
                                                 str(results_dir)))
            if node is not None:
                written = replace(written, system=dict(written.system or {}) | {"cluster_node": node})
            write_json(incoming / "run.json", written.to_dict())
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(incoming, folder)
        if folder.parent.name == RUNS_FOLDER:
            rebuild_view(folder.parent.parent)
    if record is not None and store:
        store_record(RunRecord.from_dict(record.to_dict()), db_path)
    return outcome, payload.get("output") or ""


class RayLauncher:
    """The Launcher interface on a Ray cluster: `submit(request)` runs it as a Ray task on a node
    with the resources it needs (`mlharness.cluster.resources.cell_needs`) and installs the result here.
    `start` and `finish` split it for a scheduler that keeps many tasks in flight."""

    def __init__(self, store: bool = True, db_path: Path | None = None):
        self.store = store
        self.db_path = db_path

    def start(self, request: RunRequest, needs: dict[str, float] | None = None, node_id: str | None = None) -> Any:
        ray = require_ray()
        options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0, "resources": {}}
        for key, amount in (needs or {}).items():
            if key == "GPU":
                options["num_gpus"] = amount
            else:
                options["resources"][key] = amount
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        return _task(ray).options(**options).remote(request.to_json())

    def finish(self, request: RunRequest, payload: dict[str, Any], node: dict[str, Any] | None = None) -> tuple[Outcome, str]:
        return finish(request, payload, node, self.store, self.db_path)

    def submit(self, request: RunRequest) -> Outcome:
        from mlharness.cluster.resources import cell_needs

        ray = require_ray()
        payload = ray.get(self.start(request, cell_needs(request)))
        return self.finish(request, payload, node_info(payload, None))[0]


def _task(ray: Any) -> Any:
    global _TASK
    if _TASK is None:
        _TASK = ray.remote(run_on_node)
    return _TASK


# ---- connecting ------------------------------------------------------------------------------------

def connect(address: str, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> str:
    """Connect this process to a Ray cluster: `ray` joins the local cluster (RAY_ADDRESS, or one
    started on this machine by `ray start`/`mlharness node`) or starts one here advertising this
    machine; `ray://HOST:PORT` (Ray Client) or `HOST:PORT` (a cluster this machine is a node of)
    connects to that one. The address's form is checked and its port probed (within `timeout_s`)
    before Ray is touched. Returns a description of the cluster for the sweep's first line."""
    target = parse_cluster_address(address)
    ray = require_ray()
    environment = os.environ.get("RAY_ADDRESS", "").strip()
    if target.local and environment not in ("", "auto", "local"):
        probe(parse_cluster_address(environment, "RAY_ADDRESS (for --cluster ray)"), timeout_s, "RAY_ADDRESS")
    probe(target, timeout_s)
    if ray.is_initialized():
        return "the connected Ray cluster"
    quiet = {"logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}
    try:
        if target.local:
            try:
                ray.init(address="auto", **quiet)
                return "the local Ray cluster"
            except ConnectionError:
                from mlharness.cluster.resources import node_resources
                from mlharness.running.system import detect_system

                ray.init(resources=node_resources(detect_system(), socket.gethostname()), include_dashboard=False,
                         **quiet)
                return "a Ray cluster started here (this machine its one node)"
        ray.init(address=target.text, **quiet)
        return f"the Ray cluster at {target.text}"
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, grpc errors: one line each
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--cluster {target.text}: cannot connect to the Ray cluster: {first}") from None


def disconnect() -> None:
    ray = require_ray()
    if ray.is_initialized():
        ray.shutdown()
