"""The Ray cluster's launcher and scheduler (mlharness.cluster.ray_launcher, mlharness.cluster.scheduler), each
function alone, as mutation testing of the sweeps module needs them.

Without a cluster: the task's body (`run_on_node`, called here with `import ray` failing, as outside a Ray
worker: real null-model runs in a scratch folder it removes, their payloads), the files it sends back
(`_run_files`), the driver's side (`finish`: the files moved into the driver's results tree, run.json's paths
with them, the node kept in the record, the view rebuilt, the record stored), `_moved`, `node_info`,
`remove_scratch`, `require_ray`, `connect`'s checks before Ray; the scheduler's nodes (`Node.free_for`), its
progress (`ClusterSteps` on a StringIO), the first line of an error, and the slots' bookkeeping that touches no
task (an unplaceable cell, a lost node's cell given back, a released slot, a forgotten node).

With a cluster (the last section): one Ray started in this process by `ray.init` for the module, a node
advertising mlharness resources; cells run as real Ray tasks (a node's real `run_on_node`) through
`RayLauncher` and `NodeSlots`, synchronised on `ray.wait`; the faults are real ones (a cell's Ray worker killed
by the pid its model writes, a cell's start moved back past its timeout, nodes the cluster does not have); the
Ray is shut down at the module's end."""
from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from mlharness.cluster.ray_launcher import (RayLauncher, _moved, _run_files, connect, finish, node_info,
                                            remove_scratch, require_ray, run_on_node)
from mlharness.cluster.resources import SLOT
from mlharness.cluster import scheduler
from mlharness.cluster.scheduler import (NODES_REFRESH_S, ClusterSteps, Node, NodeSlots, Placement, _first_line,
                                         _task_error, alive_nodes, node_slots)
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord
from mlharness.running.outcome import Outcome
from mlharness.running.progress import Snapshot
from mlharness.running.request import RunRequest
from mlharness.store.result_store import ResultStore
from mlharness.sweeps.cell_loop import CellEvent, CellJob
from mlharness.sweeps.sweep_grid import Cell, load_grid
from tests.support import (HOUR_LONG_SETTINGS, REPO, ended, hour_long_null, null_model_with, unanswered_port,
                           wait_for)

ray = pytest.importorskip("ray", reason="the cluster extra (pip install 'mlharness[cluster]') is not installed")

QUICK = ("min_duration=100",)
# Bytes that are not UTF-8 come first (cut from the tail sent back, but read on the node), then 9000 characters.
FAILING_POSTPROCESS = ('import sys\n\ndef postprocess(outputs, ctx):\n    sys.stdout.flush()\n'
                       '    sys.stdout.buffer.write(b"\\xff\\xfe\\n")\n    print("e" * 9000)\n'
                       '    raise RuntimeError("postprocess blew up")\n')


def null_request(**fields: Any) -> RunRequest:
    return RunRequest(**({"model": "null", "scenario": "Offline", "quick": True, "overrides": QUICK,
                          "timeout": 120.0} | fields))


def on_the_node(request: RunRequest) -> dict[str, Any]:
    """run_on_node as called outside a Ray worker: `import ray` fails there, so no node id (and no Ray)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)
        return run_on_node(request.to_json())


@pytest.fixture(scope="module")
def payloads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What nodes send back for an ok null run, a failed run (with 9000 characters of output) and a request
    that names no model: real run_on_node payloads. $MLHARNESS_DB names a database the node must not write
    (only the driver stores)."""
    models = tmp_path_factory.mktemp("models")
    failing = null_model_with(models, postprocess=FAILING_POSTPROCESS)
    node_db = models / "node-db.sqlite"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLHARNESS_DB", str(node_db))
        return {"ok": on_the_node(null_request()), "failed": on_the_node(null_request(model=str(failing))),
                "nothing": on_the_node(null_request(model="no-such-model")), "node_db": node_db}


def copy_of(payload: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in payload.items() if k != "files"})) | {"files": dict(payload["files"])}


# ---- run_on_node: the task's body -------------------------------------------------------------------

def test_run_on_node_sends_back_the_outcome_the_files_and_the_output_and_leaves_no_scratch(payloads: dict) -> None:
    ok = payloads["ok"]
    assert sorted(ok) == ["files", "hostname", "node_id", "outcome", "output", "results_dir", "traceback"]
    scratch = Path(ok["results_dir"]).parent
    assert ok["results_dir"] == str(scratch / "results") and scratch.parent == Path(tempfile.gettempdir())
    assert scratch.name.startswith("mlharness-node-cell-") and not scratch.exists()
    assert (ok["hostname"], ok["node_id"], ok["traceback"]) == (socket.gethostname(), None, None)
    outcome = Outcome.from_dict(ok["outcome"], "payload")
    record = outcome.record
    assert (outcome.kind, outcome.error, outcome.exit_status, record.status) == ("result", None, 0, "ok")
    folder = f"{record.system_name}/null/Offline/runs/{record.run_id}"
    assert record.results_path == f"{ok['results_dir']}/{folder}"
    assert sorted(ok["files"]) == sorted([f"{record.system_name}.json"] + [f"{folder}/{name}" for name in (
        "README.md", "measurements.json", "performance/run_1/mlperf_log_detail.txt",
        "performance/run_1/mlperf_log_summary.txt", "run.json", "user.conf")])
    assert RunRecord.from_dict(json.loads(ok["files"][f"{folder}/run.json"])).to_dict() == record.to_dict()
    assert json.loads(ok["files"][f"{record.system_name}.json"])["system_name"] == record.system_name
    assert ok["output"] == ""  # the run printed nothing (no progress under the tests)
    assert not payloads["node_db"].exists()  # the node stores nothing

    failed = payloads["failed"]
    outcome = Outcome.from_dict(failed["outcome"], "payload")
    folder = f"{outcome.record.system_name}/null/Offline/failed-{outcome.record.run_id}"
    assert sorted(failed["files"]) == [f"{folder}/run.json", f"{folder}/traceback.txt"]
    assert outcome.error == (f"run failed: sample 0: postprocess raised RuntimeError: postprocess blew up (logs kept in "
                             f"{failed['results_dir']}/{folder}); traceback in {failed['results_dir']}/{folder}/traceback.txt")
    # The output's tail only: the 9000 e's printed before the error are cut to the last 8000 characters.
    assert len(failed["output"]) == 8000 and failed["output"].count("e" * 100) == 79
    assert failed["traceback"] is None and failed["node_id"] is None

    nothing = payloads["nothing"]
    assert (nothing["files"], nothing["output"], nothing["outcome"]["record"]) == ({}, "", None)
    assert nothing["outcome"]["error"].startswith("no model manifest named 'no-such-model' under ")


def test_run_on_node_called_outside_ray_names_no_node_and_starts_no_ray() -> None:
    """Ray importable but not started (a direct call, in a fresh process): asking Ray's runtime context
    would start a local Ray instance just to name its node."""
    probe = ("import ray; from mlharness.cluster.ray_launcher import _node_id; "
             "print(_node_id(), ray.is_initialized())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=checkout_first())
    assert (done.returncode, done.stdout) == (0, "None False\n"), done.stderr[-2000:]


def checkout_first(**environment: str) -> dict[str, str]:
    """This environment with this checkout's mlharness first on PYTHONPATH, whatever the working folder (in a
    mutation run's copy, the mutated one), and these variables changed (an empty value removes one)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {k: v for k, v in (os.environ | {"PYTHONPATH": path} | environment).items() if v}


# ---- _run_files, _moved, node_info, remove_scratch, require_ray ------------------------------------------

def node_tree(payload: dict[str, Any], root: Path) -> Outcome:
    """The node's results folder rebuilt under `root` from what it sent; its outcome with paths there."""
    for rel, content in payload["files"].items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    return Outcome.from_dict(_moved(payload["outcome"], payload["results_dir"], str(root)), "payload")


def test_run_files_are_the_runs_folder_and_the_system_description(payloads: dict, tmp_path: Path) -> None:
    root = tmp_path / "results"
    outcome = node_tree(payloads["ok"], root)
    folder = Path(outcome.record.results_path)
    (root / "other.txt").write_text("not the run's")  # beside the run: not sent
    (folder / "linked.txt").symlink_to(root / "other.txt")  # a link in the run's folder: not sent
    assert _run_files(root, outcome) == payloads["ok"]["files"]
    (root / f"{outcome.record.system_name}.json").unlink()
    assert _run_files(root, outcome) == {k: v for k, v in payloads["ok"]["files"].items() if "/" in k}
    (root / ".json").write_text("{}")  # what a record with no system name would name
    nameless = replace(outcome, record=replace(outcome.record, system_name=""))
    assert _run_files(root, nameless) == {k: v for k, v in payloads["ok"]["files"].items() if "/" in k}
    (root / f"{outcome.record.system_name}.json").write_text("{}")
    gone = replace(outcome, record=replace(outcome.record, results_path=str(root / "gone")))
    assert _run_files(root, gone) == {f"{outcome.record.system_name}.json": b"{}"}
    assert _run_files(root, replace(outcome, record=replace(outcome.record, results_path=""))) == {}
    assert _run_files(root, replace(outcome, record=None)) == {}


def test_moved_moves_each_path_under_the_old_root_and_nothing_else() -> None:
    value = {"a": "/n/r", "b": ["/n/r/x", "/n/rx", ("/n/r/t",)], "c": {"d": "/n/r/y/z", "e": 3, "f": None},
             "g": "n/r/x", "h": "/m/n/r/x"}
    assert _moved(value, "/n/r", "/d/res") == {"a": "/d/res", "b": ["/d/res/x", "/n/rx", ("/n/r/t",)],
                                               "c": {"d": "/d/res/y/z", "e": 3, "f": None}, "g": "n/r/x",
                                               "h": "/m/n/r/x"}
    assert _moved("/n/r", "/n/r", "") == "" and _moved(["/n/r"], "/n/r", "/b") == ["/b"]


def test_node_info_is_the_name_given_else_the_hostname_and_the_ray_node_id() -> None:
    payload = {"hostname": "h1", "node_id": "abc"}
    assert node_info(payload, "alpha") == {"name": "alpha", "hostname": "h1", "ray_node_id": "abc"}
    assert node_info(payload, None) == {"name": "h1", "hostname": "h1", "ray_node_id": "abc"}
    assert node_info({}, None) == {"name": None, "hostname": None, "ray_node_id": None}


def test_remove_scratch_removes_the_folder_whole_and_a_missing_one_quietly(tmp_path: Path) -> None:
    scratch = tmp_path / "mlharness-node-cell-x"
    (scratch / "results" / "a").mkdir(parents=True)
    (scratch / "results" / "a" / "f.txt").write_text("x")
    assert remove_scratch(scratch) is None and not scratch.exists()
    assert remove_scratch(scratch) is None


def test_a_cancel_during_the_removal_is_raised_once_the_folder_is_gone(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel stood in for by a KeyboardInterrupt from the second and third file removals (os.unlink)."""
    scratch = tmp_path / "scratch"
    for i in range(5):
        (scratch / f"run{i}").mkdir(parents=True)
        (scratch / f"run{i}" / "f.txt").write_text("x")
    real_unlink, calls = os.unlink, []

    def unlink(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        real_unlink(*args, **kwargs)
        if len(calls) in (2, 3):
            raise KeyboardInterrupt(f"cancel {len(calls)}")

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(KeyboardInterrupt) as caught:
        remove_scratch(scratch)
    assert str(caught.value) == "cancel 3" and not scratch.exists()


def test_require_ray_is_the_module_or_a_one_line_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert require_ray() is ray
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UserError) as caught:
        require_ray()
    assert str(caught.value) == ("ray is not installed (needed for --cluster and mlharness node (sweeps on a Ray "
                                 "cluster)); pip install 'mlharness[cluster]'")


def test_connect_checks_ray_address_for_the_local_cluster_before_touching_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f" 127.0.0.1:{port} ")
    with pytest.raises(UserError) as caught:
        connect("ray", timeout_s=5)
    assert str(caught.value) == (f"RAY_ADDRESS 127.0.0.1:{port}: cannot connect to 127.0.0.1 port {port}: "
                                 "Connection refused; is the Ray head started there (mlharness node --head)?")
    monkeypatch.setenv("RAY_ADDRESS", "nowhere")
    with pytest.raises(UserError) as caught:
        connect("ray")
    assert str(caught.value) == ("RAY_ADDRESS (for --cluster ray): expected ray, ray://HOST:PORT or HOST:PORT; "
                                 "'nowhere' names no port")
    with pytest.raises(UserError) as caught:  # the address given is checked, the environment's only for `ray`
        connect(f"127.0.0.1:{port}", timeout_s=5)
    assert str(caught.value) == (f"--cluster 127.0.0.1:{port}: cannot connect to 127.0.0.1 port {port}: "
                                 "Connection refused; is the Ray head started there (mlharness node --head)?")


def test_connect_probes_the_address_and_ray_address_within_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster address, or for `ray` the RAY_ADDRESS, that never answers (dropped, not refused) ends at the
    timeout given, before Ray is touched, rather than after TCP's retries (about two minutes)."""
    with unanswered_port() as port:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        with pytest.raises(UserError) as caught:
            connect(f"127.0.0.1:{port}", timeout_s=0.5)
        assert str(caught.value).startswith(f"--cluster 127.0.0.1:{port}: no answer from 127.0.0.1 port {port} "
                                            "within 0.5 s"), caught.value
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        with pytest.raises(UserError) as caught:
            connect("ray", timeout_s=0.5)
        assert str(caught.value).startswith(f"RAY_ADDRESS 127.0.0.1:{port}: no answer from 127.0.0.1 port {port} "
                                            "within 0.5 s"), caught.value


# ---- finish: the driver installs what the node sent ---------------------------------------------------------

NODE = {"name": "alpha", "hostname": "h1", "ray_node_id": "abc"}


def installed(results: Path) -> dict[str, bytes]:
    return {str(p.relative_to(results)): p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file()
            and not p.is_symlink()}


def test_finish_moves_the_run_into_the_results_tree_keeps_the_node_rebuilds_the_view_and_stores(
        payloads: dict, tmp_path: Path) -> None:
    payload = payloads["ok"]
    results, db = tmp_path / "results", tmp_path / "db.sqlite"
    request = null_request(results_dir=tmp_path / "x" / ".." / "results")
    sent = json.loads(json.dumps(payload["outcome"]))
    outcome, output = finish(request, payload, dict(NODE), db_path=db)
    assert output == payload["output"] and payload["outcome"] == sent  # the payload itself is left as it came
    record = outcome.record
    folder = f"{record.system_name}/null/Offline/runs/{record.run_id}"
    expected = RunRecord.from_dict(_moved(sent["record"], payload["results_dir"], str(results)))
    expected = replace(expected, system=expected.system | {"cluster_node": NODE})
    assert record.to_dict() == expected.to_dict() and record.results_path == str(results / folder)
    assert (outcome.kind, outcome.error, outcome.traceback_path, outcome.exit_status) == ("result", None, None, 0)
    files = installed(results)
    for rel, content in payload["files"].items():
        if not rel.endswith("run.json"):
            assert files[rel] == content, rel
    assert json.loads(files[f"{folder}/run.json"]) == expected.to_dict()
    assert sorted(os.listdir(results / folder / "..")) == [record.run_id]  # no .incoming-* left
    view = results / record.system_name / "null" / "Offline"
    assert json.loads((view / "run.json").read_text())["run_id"] == record.run_id
    assert (view / "performance" / "run_1" / "mlperf_log_summary.txt").read_bytes() == \
        payload["files"][f"{folder}/performance/run_1/mlperf_log_summary.txt"]
    with ResultStore(db) as store:
        assert store.get_record(record.run_id).to_dict() == expected.to_dict()


def test_finish_without_a_node_keeps_the_system_as_detected_and_stores_in_the_results_database(
        payloads: dict, tmp_path: Path) -> None:
    payload = payloads["ok"]
    results = tmp_path / "results"
    outcome, _ = finish(null_request(results_dir=results), payload)
    expected = RunRecord.from_dict(_moved(payload["outcome"]["record"], payload["results_dir"], str(results)))
    assert outcome.record.to_dict() == expected.to_dict() and "cluster_node" not in outcome.record.system
    assert json.loads((Path(outcome.record.results_path) / "run.json").read_text()) == expected.to_dict()
    with ResultStore(results / "mlharness.sqlite") as store:
        assert store.get_record(expected.run_id).to_dict() == expected.to_dict()


def test_finish_not_storing_writes_the_files_only_and_replaces_a_stale_incoming_folder(payloads: dict,
                                                                                       tmp_path: Path) -> None:
    payload = payloads["ok"]
    results = tmp_path / "results"
    record = Outcome.from_dict(payload["outcome"], "payload").record
    runs = results / record.system_name / "null" / "Offline" / "runs"
    (runs / f".incoming-{record.run_id}").mkdir(parents=True)
    (runs / f".incoming-{record.run_id}" / "stale.txt").write_text("from a driver that died")
    launcher = RayLauncher(store=False, db_path=tmp_path / "db.sqlite")
    outcome, _ = launcher.finish(null_request(results_dir=results), payload, dict(NODE))
    assert sorted(os.listdir(runs)) == [record.run_id]
    assert sorted(os.listdir(runs / record.run_id)) == ["README.md", "measurements.json", "performance", "run.json",
                                                        "user.conf"]
    assert not (tmp_path / "db.sqlite").exists() and not (results / "mlharness.sqlite").exists()
    assert outcome.record.system["cluster_node"] == NODE
    # RayLauncher.finish passes its database on.
    results = tmp_path / "results2"
    outcome, _ = RayLauncher(db_path=tmp_path / "db.sqlite").finish(null_request(results_dir=results), payload)
    with ResultStore(tmp_path / "db.sqlite") as store:
        assert store.get_record(record.run_id).to_dict() == outcome.record.to_dict()
    assert not (results / "mlharness.sqlite").exists()


def test_finish_keeps_a_failed_run_in_its_failed_folder_with_the_error_moved_and_no_view(payloads: dict,
                                                                                          tmp_path: Path) -> None:
    payload = payloads["failed"]
    results, db = tmp_path / "results", tmp_path / "db.sqlite"
    outcome, output = finish(null_request(results_dir=results), payload, dict(NODE), db_path=db)
    record = outcome.record
    folder = results / record.system_name / "null" / "Offline" / f"failed-{record.run_id}"
    assert output == payload["output"] and len(output) == 8000
    assert outcome.error == (f"run failed: sample 0: postprocess raised RuntimeError: postprocess blew up (logs kept "
                             f"in {folder}); traceback in {folder}/traceback.txt")
    assert (outcome.kind, outcome.exit_status, record.status, record.results_path) == ("error", 1, "failed", str(folder))
    assert sorted(installed(results)) == [str((folder / n).relative_to(results)) for n in ("run.json", "traceback.txt")]
    assert json.loads((folder / "run.json").read_text())["system"]["cluster_node"] == NODE
    with ResultStore(db) as store:
        assert store.get_record(record.run_id).status == "failed"


def test_finish_of_an_error_without_a_record_writes_nothing_and_stores_nothing(payloads: dict, tmp_path: Path) -> None:
    payload = copy_of(payloads["nothing"])
    payload["output"] = None
    payload["outcome"]["error"] = f"cannot read {payload['results_dir']}/x.yaml"
    outcome, output = finish(null_request(results_dir=tmp_path / "results"), payload, dict(NODE),
                             db_path=tmp_path / "db.sqlite")
    assert (outcome.kind, outcome.record, output) == ("error", None, "")
    assert outcome.error == f"cannot read {tmp_path / 'results'}/x.yaml"
    assert not (tmp_path / "results").exists() and not (tmp_path / "db.sqlite").exists()


def test_finish_of_an_outcome_from_a_newer_mlharness_is_refused_naming_it(payloads: dict, tmp_path: Path) -> None:
    payload = copy_of(payloads["ok"])
    payload["outcome"]["schema_version"] = 99
    with pytest.raises(UserError) as caught:
        finish(null_request(results_dir=tmp_path / "results"), payload, db_path=tmp_path / "db.sqlite")
    assert str(caught.value).startswith("the outcome sent back by the node: outcome schema_version 99 is newer than")
    assert not (tmp_path / "results").exists() and not (tmp_path / "db.sqlite").exists()


def test_finish_of_a_record_sent_without_its_files_stores_the_record_and_writes_no_folder(payloads: dict,
                                                                                          tmp_path: Path) -> None:
    payload = copy_of(payloads["ok"])
    payload["files"] = {}
    outcome, _ = finish(null_request(results_dir=tmp_path / "results"), payload, db_path=tmp_path / "db.sqlite")
    assert not (tmp_path / "results").exists()
    with ResultStore(tmp_path / "db.sqlite") as store:
        assert store.get_record(outcome.record.run_id).to_dict() == outcome.record.to_dict()


def test_finish_makes_the_results_folder_whatever_order_the_files_come_in(payloads: dict, tmp_path: Path) -> None:
    """The system description first, into a results folder whose parents do not exist yet."""
    payload = copy_of(payloads["ok"])
    payload["files"] = dict(sorted(payload["files"].items(), key=lambda item: os.sep in item[0]))
    assert os.sep not in next(iter(payload["files"]))
    results = tmp_path / "a" / "b" / "results"
    outcome, _ = finish(null_request(results_dir=results), payload, store=False)
    assert installed(results).keys() >= {rel for rel in payload["files"] if not rel.endswith("run.json")}
    assert (Path(outcome.record.results_path) / "run.json").is_file()


def test_finish_writes_the_nodes_traceback_into_this_machines_temp_folder(payloads: dict, tmp_path: Path) -> None:
    payload = copy_of(payloads["nothing"])
    payload["traceback"] = "Traceback (most recent call last):\n  boom\n"
    payload["outcome"]["traceback_path"] = f"{payload['results_dir']}/mlharness-traceback-{tmp_path.name}.txt"
    outcome, _ = finish(null_request(results_dir=tmp_path / "results"), payload)
    path = Path(tempfile.gettempdir()) / f"mlharness-traceback-{tmp_path.name}.txt"
    try:
        assert outcome.traceback_path == str(path) and path.read_text() == payload["traceback"]
    finally:
        path.unlink(missing_ok=True)
    payload["outcome"]["traceback_path"] = None
    default = Path(tempfile.gettempdir()) / "mlharness-traceback.txt"
    outcome, _ = finish(null_request(results_dir=tmp_path / "results"), payload)
    try:
        assert outcome.traceback_path == str(default) and default.read_text() == payload["traceback"]
    finally:
        default.unlink(missing_ok=True)
    payload["traceback"] = ""  # none sent: the path stays the node's
    payload["outcome"]["traceback_path"] = "/node/tb.txt"
    assert finish(null_request(results_dir=tmp_path / "results"), payload)[0].traceback_path == "/node/tb.txt"


def test_finish_installs_only_the_runs_folder_and_root_files(payloads: dict, tmp_path: Path) -> None:
    payload = copy_of(payloads["ok"])
    record = Outcome.from_dict(payload["outcome"], "payload").record
    payload["files"]["elsewhere/x.txt"] = b"not the run's"  # neither under the run's folder nor at the root
    payload["files"]["notes.txt"] = b"root"
    del payload["files"][next(k for k in payload["files"] if k.endswith("/run.json"))]  # no run.json sent
    results = tmp_path / "results"
    outcome, _ = finish(null_request(results_dir=results), payload, dict(NODE), store=False)
    assert (results / "notes.txt").read_bytes() == b"root" and not (results / "elsewhere").exists()
    assert not (Path(outcome.record.results_path) / "run.json").exists()
    assert sorted(os.listdir(results)) == sorted([record.system_name, f"{record.system_name}.json", "notes.txt"])


# ---- the scheduler's data: Node, ClusterSteps, _first_line ------------------------------------------------------

def test_a_node_is_free_for_a_share_while_its_slot_holds_it() -> None:
    node = Node("id1", "alpha", {SLOT: 1.0}, load=0.5)
    assert node.free_for(0.5) and node.free_for(0.5000009) and not node.free_for(0.5000011)
    assert Node("id2", "beta", {}).free_for(0.0) and not Node("id2", "beta", {}).free_for(0.00001)
    assert Node("id3", "c", {SLOT: 2.0}).load == 0.0


def test_a_placement_starts_as_a_first_attempt_nowhere() -> None:
    at = Placement(null_request(), {SLOT: 1.0})
    assert (at.attempt, at.avoid, at.first_cause, at.node, at.start, at.ref, at.overdue) == (0, set(), None, None,
                                                                                            0.0, None, False)
    assert Placement(null_request(), {}).avoid is not at.avoid


def test_first_line_is_the_first_sentence_of_the_first_line() -> None:
    assert _first_line(ValueError("  The task failed. More here.\nsecond line")) == "The task failed"
    assert _first_line(ValueError("Ends here...")) == "Ends here"
    assert _first_line(ValueError("a.b. c")) == "a.b"
    assert _first_line(ValueError("Worker died of signal X.")) == "Worker died of signal X"  # the dot alone
    assert _first_line(ValueError("x" * 300)) == "x" * 200
    assert _first_line(KeyError()) == "KeyError" and _first_line(ValueError(" \n ")) == "ValueError"



def test_a_task_error_is_said_by_its_own_cause_a_user_errors_alone_and_a_bugs_with_its_type() -> None:
    """Ray's RayTaskError (the real class, as Ray makes it on the driver) leads with its own header line;
    what a reader needs is the task's exception."""
    bug = ray.exceptions.RayTaskError("run_on_node", "Traceback (most recent call last):\nValueError: bad value", ValueError("bad value. More"))
    assert _task_error(bug) == "ValueError: bad value"
    mistake = ray.exceptions.RayTaskError("run_on_node", "Traceback", UserError("grid.yaml: batch_size: expected a whole number"))
    assert _task_error(mistake) == "grid.yaml: batch_size: expected a whole number"
    assert _task_error(RuntimeError("no cause here. More")) == "no cause here"

def test_cluster_steps_count_the_failed_and_share_the_eta_between_the_cells_running_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLHARNESS_PROGRESS", "on")
    stream = io.StringIO()
    steps = ClusterSteps(5, stream, quiet=True)
    assert (steps.total, steps.unit, steps.failed, steps.nodes, steps.ticker.quiet) == (5, "cells", 0, {}, True)
    assert not ClusterSteps(1, stream, quiet=False).ticker.quiet
    assert steps.eta() is None
    steps.finished("a", "ok", 2.0)
    steps.finished("b", "failed", 4.0)
    assert steps.failed == 1 and steps.eta() == 9.0
    steps.node_seen("n2")
    steps.node_started("n1", "c")
    steps.node_started("n1", "d")
    steps.node_started("n3", "e")
    assert steps.eta() == 3.0  # mean 3 s x 3 left / 3 at once
    steps.finished("c", "unschedulable", 0.0)
    assert stream.getvalue() == ("[1/5] a: ok (2.0 s), ETA 0:08\n[2/5] b: failed (4.0 s), ETA 0:09\n"
                                 "[3/5] c: unschedulable (0.0 s), ETA 0:01\n")
    steps.node_done("n1", "c")
    steps.node_done("n4", "c")  # a node not seen: nothing
    steps.nodes["n1"] = [("d", time.monotonic() - 125.2)]
    assert steps._read() == Snapshot(3, 5, 2.0 * 2 / 2, "2 failed, 2 left\n  node n1: d for 2:05\n  node n2: idle\n"
                                     "  node n3: e for 0:00")
    steps.node_gone("n3")
    steps.node_gone("n9")
    steps.node_seen("n1")  # seen again: its cells stay
    assert steps.nodes == {"n1": [("d", steps.nodes["n1"][0][1])], "n2": []}
    assert steps.eta() == 2.0 * 2 / 1
    steps.nodes["n1"] = [("d", time.monotonic() - 125.2), ("f", time.monotonic() - 65.2)]
    assert steps._read().extra.splitlines()[1] == "  node n1: d for 2:05; f for 1:05"  # a node's cells on its line


# ---- NodeSlots' bookkeeping: no task started --------------------------------------------------------------------

def job(label: str, **fields: Any) -> CellJob:
    request = null_request(**fields)
    return CellJob(Cell(request), 0, label, request)


def slots_of(placements: dict[CellJob, Placement], *nodes: Node) -> NodeSlots:
    progress = ClusterSteps(len(placements), io.StringIO(), quiet=True)
    for node in nodes:
        progress.node_seen(node.name)
    slots = NodeSlots(ray, placements, {n.node_id: n for n in nodes}, progress, RayLauncher(store=False))
    slots.refreshed = time.monotonic() + 3600  # these tests read no cluster: the nodes are the ones given
    return slots


def test_a_cell_no_node_matches_is_unschedulable_naming_what_it_needs_and_what_the_nodes_have() -> None:
    alpha = Node("a1", "alpha", {SLOT: 1.0, "mlharness_node:alpha": 1.0, "mlharness_system:s1": 1.0, "CPU": 2.0})
    beta = Node("b1", "beta", {SLOT: 1.0, "mlharness_node:beta": 1.0, "mlharness_gpu:T4": 1.0, "GPU": 1.0})
    stuck, busy1, busy2 = job("stuck"), job("busy1"), job("busy2")
    placements = {stuck: Placement(stuck.request, {SLOT: 1.0, "mlharness_system:s9": 0.001, "GPU": 2.0}),
                  busy1: Placement(busy1.request, {SLOT: 1.0}), busy2: Placement(busy2.request, {SLOT: 0.5})}
    alpha.load = beta.load = 0.6
    slots = slots_of(placements, beta, alpha)
    waiting = deque([busy1, stuck, busy2])
    events = slots.place(waiting)
    assert list(waiting) == [busy1, busy2] and not slots.busy()  # no free slot: both wait, in their order
    assert events == [CellEvent(stuck, {"status": "unschedulable", "run_id": None, "stderr": "",
                                        "error": "no node of the cluster has GPU=2, mlharness_system:s9 (nodes: "
                                                 "alpha: mlharness_node:alpha, mlharness_system:s1; beta: "
                                                 "mlharness_gpu:T4, mlharness_node:beta)"}, 0.0, "")]
    assert stuck.started_at  # recorded as started now
    stuck.started_at = "2026-01-01T00:00:00+00:00"
    placements[stuck].first_cause = "node gamma lost while running the cell (X: y)"
    assert slots.place(deque([stuck]))[0].result == {
        "status": "failed", "run_id": None, "stderr": "",
        "error": "node gamma lost while running the cell (X: y); no other node has GPU=2, mlharness_system:s9 to "
                 "retry it on"}
    assert stuck.started_at == "2026-01-01T00:00:00+00:00"
    assert slots.next_done() == [] and slots.stop() == ([], 0)


def test_a_lost_nodes_cell_is_failed_for_now_then_retried_elsewhere_and_a_second_loss_is_final() -> None:
    alpha = Node("a1", "alpha", {SLOT: 1.0}, load=1.0)
    cell = job("null/Offline")
    at = Placement(cell.request, {SLOT: 1.0}, node=alpha, ref="ref", start=time.monotonic() - 100)
    slots = slots_of({cell: at}, alpha)
    slots.progress.node_started("alpha", "null/Offline")
    seconds = slots._release(cell)
    assert 100 <= seconds < 1000 and alpha.load == 0.0 and slots.progress.nodes == {"alpha": []}
    event = slots._lost(cell, ValueError("Worker died. Details\nmore"), 12.5)
    cause = "node alpha lost while running the cell (ValueError: Worker died)"
    assert event == CellEvent(cell, {"status": "failed", "run_id": None, "error": cause + "; retrying on another node",
                                     "stderr": ""}, 12.5, "", f"null/Offline: {cause}; retrying on another matching node")
    assert (at.attempt, at.first_cause, at.avoid, at.node, at.ref) == (1, cause, {"a1"}, None, None)
    at.node = Node("b1", "beta", {SLOT: 1.0})
    event = slots._lost(cell, RuntimeError(""), 3.0)
    assert event == CellEvent(cell, {"status": "failed", "run_id": None, "stderr": "",
                                     "error": f"{cause}; the retry: node beta lost while running the cell "
                                              f"(RuntimeError: RuntimeError)"}, 3.0, " on beta")
    assert at.attempt == 1 and at.node.name == "beta"


def test_a_released_slot_frees_the_nodes_share_never_below_nothing() -> None:
    alpha = Node("a1", "alpha", {SLOT: 1.0}, load=0.75)
    first, second = job("first"), job("second")
    stale = Node("a1", "alpha", {SLOT: 1.0}, load=0.75)  # the node as it was when the cell started
    placements = {first: Placement(first.request, {SLOT: 0.5}, node=stale, start=time.monotonic()),
                  second: Placement(second.request, {SLOT: 0.5}, node=Node("g1", "gone", {SLOT: 1.0}, load=0.25),
                                    start=time.monotonic())}
    slots = slots_of(placements, alpha)
    slots.progress.node_started("alpha", "first")
    slots.progress.node_started("alpha", "other")
    slots._release(first)
    assert (alpha.load, stale.load, slots.progress.nodes) == (0.25, 0.75, {"alpha": [slots.progress.nodes["alpha"][0]]})
    assert slots.progress.nodes["alpha"][0][0] == "other"
    slots._release(second)  # its node no longer listed: the placement's own node, floored at 0
    assert placements[second].node.load == 0.0


def test_a_forgotten_node_takes_no_more_cells() -> None:
    alpha, beta = Node("a1", "alpha", {SLOT: 1.0}), Node("b1", "beta", {SLOT: 1.0})
    slots = slots_of({}, alpha, beta)
    slots._forget(None)
    assert slots.lost == set() and set(slots.nodes) == {"a1", "b1"}
    slots._forget(alpha)
    assert slots.lost == {"a1"} and set(slots.nodes) == {"b1"} and set(slots.progress.nodes) == {"beta"}
    slots.progress.node_seen("alpha")
    slots._forget(alpha)  # already gone from the nodes: the progress keeps what it shows
    assert slots.lost == {"a1"} and set(slots.progress.nodes) == {"alpha", "beta"}


# ---- with a Ray cluster: one started in this process for the module ---------------------------------------------

RAY_RESOURCES = {SLOT: 1.0, "mlharness_node:alpha": 1.0, "mlharness_system:sys-a": 1.0}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray started here, on loopback: one node advertising the mlharness resources of a node named alpha;
    its node id."""
    started = time.monotonic()
    ray.init(num_cpus=1, resources=RAY_RESOURCES, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        print(f"Ray started in {time.monotonic() - started:.1f} s")
        yield ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()


def test_alive_nodes_are_the_nodes_advertising_mlharness_resources(cluster: str) -> None:
    (entry,) = ray.nodes()
    nodes = alive_nodes(ray)
    assert nodes == {cluster: Node(cluster, "alpha", {k: float(v) for k, v in entry["Resources"].items()})}
    assert {k: nodes[cluster].resources[k] for k in RAY_RESOURCES} == RAY_RESOURCES


def test_connect_to_a_connected_cluster_says_so_after_probing_the_address(cluster: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    gcs = ray.get_runtime_context().gcs_address
    monkeypatch.setenv("RAY_ADDRESS", gcs)
    assert connect("ray") == "the connected Ray cluster"
    for environment in ("", " auto ", "local"):  # the local cluster, whichever Ray finds: not probed
        monkeypatch.setenv("RAY_ADDRESS", environment)
        assert connect("ray") == "the connected Ray cluster"
    monkeypatch.delenv("RAY_ADDRESS")
    assert connect("ray") == "the connected Ray cluster"
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert connect(gcs, timeout_s=5) == "the connected Ray cluster"


CONNECT = ("import sys\nfrom mlharness.cluster.ray_launcher import connect\nfrom mlharness.errors import UserError\n"
           "try:\n    print(connect(sys.argv[1], timeout_s=30))\nexcept UserError as exc:\n    print(f'error: {exc}')\n")


def connected_from_a_driver(address: str, **environment: str) -> str:
    """What `connect(address)` says in a fresh driver process (this one is connected already), with these
    environment variables changed (an empty value removes one). The driver takes ~/.ray/auth_token as this
    module's Ray did (no other test starts a local Ray without a token of its own)."""
    done = subprocess.run([sys.executable, "-c", CONNECT, address], capture_output=True, text=True, timeout=300,
                          env=checkout_first(**environment))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_driver_connects_to_a_cluster_by_its_address_or_as_the_local_one_its_environment_names(
        cluster: str) -> None:
    """This module's Ray, joined from fresh driver processes: by HOST:PORT, and as `ray` where RAY_ADDRESS names
    it (probed, then Ray's own "auto" reads it)."""
    gcs = ray.get_runtime_context().gcs_address
    assert connected_from_a_driver(gcs, RAY_ADDRESS="") == f"the Ray cluster at {gcs}"
    assert connected_from_a_driver("ray", RAY_ADDRESS=gcs) == "the local Ray cluster"


def test_a_driver_the_cluster_refuses_gets_one_line_naming_the_address(cluster: str, tmp_path: Path) -> None:
    """A port that answers as Ray's GCS but refuses this driver (here: a token of token authentication that is
    not the cluster's) is one line naming the address and Ray's first line, not Ray's traceback."""
    gcs = ray.get_runtime_context().gcs_address
    said = connected_from_a_driver(gcs, RAY_ADDRESS="", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
    assert said.startswith(f"error: --cluster {gcs}: cannot connect to the Ray cluster: "), said
    ray_says = said.removeprefix(f"error: --cluster {gcs}: cannot connect to the Ray cluster: ")
    assert gcs in ray_says and "Traceback" not in said  # Ray's own first line (here naming the address)


def test_submit_runs_the_request_on_a_node_and_records_it_here(cluster: str, tmp_path: Path) -> None:
    results, db = tmp_path / "results", tmp_path / "db.sqlite"
    outcome = RayLauncher(db_path=db).submit(null_request(results_dir=results))
    record = outcome.record
    assert (outcome.kind, record.status) == ("result", "ok")
    assert record.system["cluster_node"] == {"name": socket.gethostname(), "hostname": socket.gethostname(),
                                             "ray_node_id": cluster}
    assert Path(record.results_path) == results / record.system_name / "null" / "Offline" / "runs" / record.run_id
    assert json.loads((Path(record.results_path) / "run.json").read_text()) == record.to_dict()
    with ResultStore(db) as store:
        assert store.get_record(record.run_id).to_dict() == record.to_dict()


def test_submit_holds_the_nodes_slot_from_ray_while_its_run_is_under_way(cluster: str, tmp_path: Path) -> None:
    """A single run sent to the cluster asks Ray for what its hardware needs (the whole mlharness slot of a
    node, no CPU): held while the run is under way (its first query waits for the test), free once it ends."""
    model, mark, release = held_model(tmp_path)
    request = null_request(model=str(model), results_dir=tmp_path / "results")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(RayLauncher(store=False).submit, request)
        try:
            wait_for(lambda: mark.exists() or future.done(), "the run under way on the node", timeout=300)
            assert mark.exists(), f"the run ended before its first query: {future.result()!r:.2000}"
            wait_for(lambda: (ray.available_resources().get(SLOT, 0.0), ray.available_resources().get("CPU")) ==
                     (0.0, 1.0), "the run holding the node's whole slot and no CPU")
        finally:
            release.touch()
        outcome = future.result(timeout=300)
    assert outcome.record.status == "ok"
    wait_for(lambda: ray.available_resources().get(SLOT) == 1.0, "the slot free again")


def test_node_slots_place_each_cell_on_a_free_slot_and_collect_it(cluster: str, tmp_path: Path) -> None:
    (tmp_path / "grid.yaml").write_text('models: ["null"]\nscenarios: [Offline]\ncluster: {cells_per_node: 1}\n')
    grid = load_grid(tmp_path / "grid.yaml")
    results = tmp_path / "results"
    jobs = [job("first", results_dir=results), job("second", results_dir=results)]
    stream = io.StringIO()
    slots = node_slots(jobs, SimpleNamespace(quiet=True, db_path=tmp_path / "db.sqlite"), grid, stream)
    assert stream.getvalue() == "cluster: 1 node(s): alpha\n"
    assert slots.progress.nodes == {"alpha": []} and slots.progress.total == 2
    assert slots.placements[jobs[0]].needs == {SLOT: 1.0} and slots.placements[jobs[0]].request.resolved
    waiting = deque(jobs)
    assert slots.place(waiting) == [] and list(waiting) == [jobs[1]]  # one slot: the second waits
    assert slots.busy() and slots.nodes[cluster].load == 1.0 and jobs[0].started_at
    assert [label for label, _ in slots.progress.nodes["alpha"]] == ["first"]
    (event,) = collected(slots, 1)
    assert not slots.busy()
    assert (event.job, event.where, event.result["status"], event.result["error"]) == (jobs[0], " on alpha", "ok", None)
    assert slots.nodes[cluster].load == 0.0 and slots.progress.nodes == {"alpha": []}
    with ResultStore(tmp_path / "db.sqlite") as store:
        stored = store.get_record(event.result["run_id"])
    assert stored.system["cluster_node"] == {"name": "alpha", "hostname": socket.gethostname(), "ray_node_id": cluster}
    assert stored.results_path.startswith(str(results.resolve()) + "/")
    (tmp_path / "grid.yaml").write_text('models: ["null"]\nscenarios: [Offline]\ncluster: {cells_per_node: 2}\n')
    halves = node_slots(jobs, SimpleNamespace(quiet=True, db_path=tmp_path / "db.sqlite"), load_grid(tmp_path / "grid.yaml"),
                        stream)
    assert halves.placements[jobs[0]].needs == {SLOT: 0.5} and halves.progress.stream is stream


def test_a_task_that_raises_on_the_node_is_a_failed_cell_and_a_vanished_node_puts_it_back(cluster: str,
                                                                                          tmp_path: Path) -> None:
    raising = job("raising", user_conf=tmp_path / "gone.conf")  # unresolved: the node fails to read it
    vanished = job("vanished")
    alpha = alive_nodes(ray)[cluster]
    ghost = Node("fe" * 28, "ghost", dict(RAY_RESOURCES))
    placements = {raising: Placement(raising.request, {SLOT: 0.5}), vanished: Placement(vanished.request, {SLOT: 0.5})}
    slots = slots_of(placements, alpha)
    slots._start(raising, alpha)
    slots._start(vanished, ghost)
    events = collected(slots, 2)
    assert not slots.busy()
    by_job = {event.job: event for event in events}
    failed = by_job[raising]
    assert (failed.seconds, failed.where, failed.result["status"], failed.result["run_id"]) == (0.0, " on alpha",
                                                                                                 "failed", None)
    # The task's own error, not Ray's header line; Ray's whole error (the traceback on the node) in stderr.
    assert failed.result["error"] == f"on node alpha: {tmp_path / 'gone.conf'}: cannot read user.conf: No such file or directory"
    stderr = failed.result["stderr"]
    assert re.match(r"(\x1b\[36m)?ray::run_on_node\(\)(\x1b\[39m)? \(pid=\d+, ip=\S+\)\n  File ", stderr), stderr[:300]
    assert stderr.endswith(f"mlharness.errors.UserError: {tmp_path / 'gone.conf'}: cannot read user.conf: No such file "
                           "or directory")
    assert by_job[vanished] == CellEvent(vanished, None)
    assert (placements[vanished].node, placements[vanished].ref) == (None, None)
    assert slots.lost == {"fe" * 28} and alpha.load == 0.0


def test_stop_collects_the_cells_that_ended_and_cancels_those_in_flight_on_their_node(cluster: str,
                                                                                       tmp_path: Path) -> None:
    """Ctrl-C with two cells ended and one an hour long in flight: the ended ones are collected as any other,
    the other cancelled: its run on the node interrupted as Ctrl-C interrupts a local one, its task ended within
    the wait, so nothing is said of cells left running."""
    results = tmp_path / "results"
    model, mark = marking_model(tmp_path)
    ended, also = job("ended", results_dir=results), job("also ended", results_dir=results)
    endless = endless_job("endless", tmp_path, model)
    alpha = alive_nodes(ray)[cluster]
    placements = {ended: Placement(ended.request, {SLOT: 0.25}), also: Placement(also.request, {SLOT: 0.25}),
                  endless: Placement(endless.request, {SLOT: 0.5})}
    slots = slots_of(placements, alpha)
    for each in (ended, also, endless):
        slots._start(each, alpha)
    endless_ref = placements[endless].ref
    done, _ = ray.wait([placements[ended].ref, placements[also].ref], num_returns=2, timeout=300)  # a bound
    assert len(done) == 2  # the quick cells' tasks have ended
    # The cell in flight holds its share of the node's slot from Ray itself, and no CPU (the run's own process
    # is the node's to schedule): what keeps two cells off one slot, beside another sweep too.
    wait_for(lambda: (ray.available_resources().get(SLOT), ray.available_resources().get("CPU")) == (0.5, 1.0),
             "the endless cell holding half the slot and no CPU")
    under_way(mark, endless_ref)  # so the cancel must interrupt the run itself
    events, cancelled = slots.stop()
    assert cancelled == 1 and sorted(event.job.label for event in events) == ["also ended", "ended"]
    assert {(event.result["status"], event.where) for event in events} == {("ok", " on alpha")}
    assert list(slots.running.values()) == [endless]  # cancelled, left for the loop to record as stopped
    assert ray.wait([endless_ref], timeout=0)[0] == [endless_ref]  # ended on its node within the wait
    outcome = ray.get(endless_ref)["outcome"]  # its run interrupted as Ctrl-C interrupts a local one
    assert (outcome["exit_status"], outcome["record"]["status"], outcome["record"]["error"]) == (
        130, "failed", "interrupted by SIGINT"), outcome
    assert "still running" not in slots.progress.stream.getvalue()


def test_stop_says_how_many_cancelled_cells_are_still_running_when_the_wait_for_them_ends(
        cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell whose run does not end on Ctrl-C (its model holds on past the interrupt, until the launcher's grace
    kills it) is still running when the wait for the cancelled ends (made 0 s here): said in one line, left."""
    monkeypatch.setattr(scheduler, "CANCEL_WAIT_S", 0.0)
    model, mark, release = held_model(tmp_path)
    stuck = endless_job("stuck", tmp_path, model)
    alpha = alive_nodes(ray)[cluster]
    at = Placement(stuck.request, {SLOT: 0.5})
    slots = slots_of({stuck: at}, alpha)
    slots._start(stuck, alpha)
    try:
        under_way(mark, at.ref)
        assert slots.stop() == ([], 1)
        assert slots.progress.stream.getvalue() == ("1 cancelled cell(s) still running on their nodes after 0 s; leaving them (their "
                                     "scratch folders may stay in the nodes' temp folder)\n")
    finally:
        release.touch()
        ray.wait([at.ref], timeout=300)  # ended: its grace past, or released


def collected(slots: NodeSlots, count: int, bound_s: float = 300.0) -> list[CellEvent]:
    """`next_done` until `count` cells are collected (the bound only fails a cell that never ends)."""
    events: list[CellEvent] = []
    deadline = time.monotonic() + bound_s
    while len(events) < count:
        assert time.monotonic() < deadline, f"{len(events)} of {count} cells collected within {bound_s:g} s"
        events += slots.next_done()
    return events


def test_place_puts_a_cell_on_the_least_loaded_free_node_and_a_retry_elsewhere_when_anywhere_else_matches(
        cluster: str) -> None:
    """Nodes the cluster does not have (their tasks come back unschedulable: nothing runs), so only the choice
    is seen: the least loaded free node, by name among equals; a retry avoids the node it was lost on unless
    no other node matches."""
    alpha = Node("a1" * 28, "alpha", {SLOT: 1.0}, load=0.5)
    gamma = Node("c1" * 28, "gamma", {SLOT: 1.0, "mlharness_gpu:T4": 1.0})
    beta = Node("b1" * 28, "beta", {SLOT: 1.0})
    first, retry, only_there = job("first"), job("retry"), job("only-there")
    placements = {first: Placement(first.request, {SLOT: 0.5}),
                  retry: Placement(retry.request, {SLOT: 0.5}, attempt=1, avoid={gamma.node_id}),
                  only_there: Placement(only_there.request, {SLOT: 0.5, "mlharness_gpu:T4": 1.0}, attempt=1,
                                        avoid={gamma.node_id})}
    slots = slots_of(placements, alpha, gamma, beta)
    waiting = deque([first, retry, only_there])
    assert slots.place(waiting) == [] and not waiting
    # first: beta and gamma hold nothing, beta by name; retry: not gamma, alpha and beta at half, alpha by name;
    # only-there: gamma alone has the T4.
    assert [placements[j].node.name for j in (first, retry, only_there)] == ["beta", "alpha", "gamma"]
    assert (alpha.load, beta.load, gamma.load) == (1.0, 0.5, 0.5)
    events = collected(slots, 3)
    assert sorted(events, key=lambda e: e.job.label) == [CellEvent(j, None) for j in (first, only_there, retry)]


def test_refresh_reads_the_alive_nodes_once_a_second_keeping_their_loads_and_leaving_out_lost_ones(
        cluster: str) -> None:
    alpha = alive_nodes(ray)[cluster]
    alpha.load = 0.5
    ghost = Node("fe" * 28, "ghost", dict(RAY_RESOURCES))
    slots = slots_of({}, alpha, ghost)  # read "just now" (an hour ahead): not read again
    assert slots.place(deque()) == [] and slots.nodes == {cluster: alpha, ghost.node_id: ghost}
    slots.refreshed = time.monotonic() - NODES_REFRESH_S - 1
    before = time.monotonic()
    slots.place(deque())
    assert list(slots.nodes) == [cluster] and slots.nodes[cluster] is not alpha and slots.refreshed >= before
    assert (slots.nodes[cluster].load, slots.nodes[cluster].resources) == (0.5, alpha.resources)
    assert slots.progress.nodes == {"alpha": []}  # the ghost gone from the display
    slots.nodes, slots.progress.nodes = {}, {}  # a node the slots did not know: new, shown, nothing on it
    slots.refreshed = time.monotonic() - NODES_REFRESH_S - 1
    slots.place(deque())
    assert slots.nodes[cluster].load == 0.0 and slots.progress.nodes == {"alpha": []}
    slots._forget(slots.nodes[cluster])  # a node a cell was lost on stays out while the cluster lists it
    slots.refreshed = time.monotonic() - NODES_REFRESH_S - 1
    slots.place(deque())
    assert slots.nodes == {} and slots.progress.nodes == {} and slots.lost == {cluster}


def endless_job(label: str, tmp_path: Path, model: Path | None = None) -> CellJob:
    return job(label, model=str(model or hour_long_null(tmp_path)), scenario="SingleStream",
               overrides=HOUR_LONG_SETTINGS, timeout=3600.0, results_dir=tmp_path / "results")


def marking_model(folder: Path) -> tuple[Path, Path]:
    """The hour-long null model whose first query writes, to a mark file, the pids of the Ray worker running the
    cell and of the run's own process (the worker's child): the model and the mark."""
    mark = folder / "pids"
    postprocess = ("import os, time\n\ndef postprocess(outputs, ctx):\n"
                   f"    mark = {str(mark)!r}\n"
                   "    if not os.path.exists(mark):\n"
                   "        with open(mark + '.tmp', 'w') as out:\n"
                   "            out.write(f'{os.getppid()} {os.getpid()}')\n"
                   "        os.replace(mark + '.tmp', mark)\n"
                   "    time.sleep(0.02)\n    return outputs['scores']\n")
    return null_model_with(folder / "models", postprocess=postprocess), mark


def held_model(folder: Path) -> tuple[Path, Path, Path]:
    """The null model whose first query writes a mark file, then holds on (through Ctrl-C too) until a release
    file appears: the model, the mark and the release."""
    mark, release = folder / "under-way", folder / "release"
    postprocess = ("import os, time\n\ndef postprocess(outputs, ctx):\n"
                   f"    mark, release = {str(mark)!r}, {str(release)!r}\n"
                   "    if not os.path.exists(mark):\n"
                   "        open(mark, 'w').close()\n"
                   "        deadline = time.monotonic() + 600\n"
                   "        while not os.path.exists(release) and time.monotonic() < deadline:\n"
                   "            try:\n                time.sleep(0.01)\n"
                   "            except KeyboardInterrupt:\n                pass\n"
                   "    return outputs['scores']\n")
    return null_model_with(folder / "models", postprocess=postprocess), mark, release


def under_way(mark: Path, ref: Any) -> None:
    """Wait until the cell's run is under way on the node (its model wrote the mark); a cell whose task (`ref`)
    ended before its run began fails the test at once."""
    wait_for(lambda: mark.exists() or bool(ray.wait([ref], timeout=0)[0]), "the cell's run under way on the node",
             timeout=300)
    assert mark.exists(), f"the cell ended before its run began: {ray.get(ref)!r:.2000}"


@contextlib.contextmanager
def killed_run(mark: Path, ref: Any) -> Iterator[tuple[int, int]]:
    """Once the cell's run is under way (its mark written): the worker's and the run's pids. After, the run must
    end with its worker, and the scratch folder that a worker killed on the node leaves is removed. A cell
    whose task (`ref`) ended before its run began fails the test at once."""
    import psutil

    under_way(mark, ref)
    worker, run = map(int, mark.read_text().split())
    scratch = Path(os.readlink(f"/proc/{run}/fd/1")).parent  # the run's output file, in the task's scratch folder
    assert scratch.name.startswith("mlharness-node-cell-"), scratch
    try:
        yield worker, run
        wait_for(lambda: not psutil.pid_exists(run) or ended(psutil.Process(run)),
                 "the run's process ended with its worker")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_cell_its_node_does_not_stop_is_cancelled_past_its_timeout_and_recorded_failed(
        cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hour-long cells under way whose starts are moved back instead of waited for: one past its timeout and
    the driver's grace is cancelled by force and recorded failed; one past its timeout but within the grace goes
    on. The grace is made an hour so the test's own pace cannot move a cell across it."""
    monkeypatch.setattr(scheduler, "DRIVER_GRACE_S", 3600.0)
    model, mark = marking_model(tmp_path)
    overdue, within = endless_job("overdue", tmp_path, model), endless_job("within", tmp_path)
    alpha = alive_nodes(ray)[cluster]
    placements = {j: Placement(j.request, {SLOT: 0.5}) for j in (overdue, within)}
    slots = slots_of(placements, alpha)
    slots._start(overdue, alpha)
    slots._start(within, alpha)
    with killed_run(mark, placements[overdue].ref):
        placements[overdue].start -= 3600 + 3600 + 1
        placements[within].start -= 3600
        (event,) = collected(slots, 1)
    assert event == CellEvent(overdue, {"status": "failed", "run_id": None, "stderr": "",
                                        "error": "cancelled on node alpha after 3600 s (the cell's timeout; its node "
                                                 "did not stop it)"}, 0.0, " on alpha")
    assert placements[overdue].overdue and not placements[within].overdue
    assert list(slots.running.values()) == [within] and alpha.load == 0.5 and slots.lost == set()
    assert slots.stop() == ([], 1)


def test_a_cell_whose_worker_dies_is_lost_with_its_node_failed_for_now_and_given_back_to_place_elsewhere(
        cluster: str, tmp_path: Path) -> None:
    """The Ray worker running a cell killed mid-run (as when its node goes): the cell is recorded failed with
    the cause and given back for one retry elsewhere, the node takes no more cells, and the run's own process
    ends with its worker."""
    model, mark = marking_model(tmp_path)
    doomed = endless_job("doomed", tmp_path, model)
    alpha = alive_nodes(ray)[cluster]
    at = Placement(doomed.request, {SLOT: 0.5})
    slots = slots_of({doomed: at}, alpha)
    slots._start(doomed, alpha)
    with killed_run(mark, at.ref) as (worker, _):
        os.kill(worker, signal.SIGKILL)
        (event,) = collected(slots, 1)
    cause = event.result["error"].removesuffix("; retrying on another node")
    assert re.fullmatch(r"node alpha lost while running the cell \(\w+Error: [^\n]+\)", cause), cause
    assert event == CellEvent(doomed, {"status": "failed", "run_id": None, "error": cause + "; retrying on another node",
                                       "stderr": ""}, event.seconds, "", f"doomed: {cause}; retrying on another matching node")
    assert event.seconds > 0
    assert (at.attempt, at.first_cause, at.avoid, at.node, at.ref) == (1, cause, {cluster}, None, None)
    assert slots.lost == {cluster} and slots.nodes == {} and slots.progress.nodes == {}


def test_a_retried_cell_keeps_its_first_cause_in_its_error_whether_the_retry_ends_ok_or_failed(
        cluster: str, tmp_path: Path) -> None:
    cause = "node beta lost while running the cell (WorkerCrashedError: gone)"
    ok = job("ok", results_dir=tmp_path / "results")
    failing = job("failing", model=str(null_model_with(tmp_path / "models", postprocess=FAILING_POSTPROCESS)),
                  results_dir=tmp_path / "results")
    alpha = alive_nodes(ray)[cluster]
    placements = {j: Placement(j.request, {SLOT: 0.5}, attempt=1, avoid={"b1" * 28}, first_cause=cause)
                  for j in (ok, failing)}
    slots = slots_of(placements, alpha)
    slots._start(ok, alpha)
    slots._start(failing, alpha)
    by_job = {event.job: event for event in collected(slots, 2)}
    assert (by_job[ok].result["status"], by_job[ok].result["error"]) == ("ok", f"{cause}; retried on node alpha")
    failed = by_job[failing].result
    assert failed["status"] == "failed" and failed["error"].startswith(
        f"{cause}; retried on node alpha: run failed: sample 0: postprocess raised RuntimeError: postprocess blew up")
    assert "e" * 100 in failed["stderr"]  # the run's output, as a local failed cell keeps it
    assert by_job[ok].seconds > 0 and by_job[failing].seconds > 0 and alpha.load == 0.0
