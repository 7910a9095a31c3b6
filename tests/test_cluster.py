"""Sweeps on a real Ray cluster on loopback (docs/cluster.md): a head and a second node started by
`mlharness node` as processes of their own, drivers run as processes of their own (`mlharness sweep
--cluster`), the null model's short cells. Placement is read from the records; a node is killed
mid-sweep; a driver gets SIGINT and the sweep resumes; the same grid without --cluster gives the same
records. Every Ray process started here is killed at teardown (by its session: `ray start --block`
and its workers share one)."""
from __future__ import annotations

import json
import os
import secrets
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import REPO, run_cli, wait_for

ray = pytest.importorskip("ray", reason="the cluster extra (pip install 'mlharness[cluster]') is not installed")

B_SYSTEM = "loopback-b"  # the second node answers to this system name too (mlharness node --system)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="mlh-ray-", dir="/tmp"))  # short: Ray's socket paths
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        # One token for this cluster's processes and the driver (this test process): Ray 2.60 turns token
        # authentication on for local clusters, and a token left in ~/.ray by another cluster must not
        # decide whether these nodes can join.
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(root), **self.auth,
                        # a lost node is noticed within seconds, not Ray's default 15 to 30; not faster
                        # than that, or a busy machine's healthy node is declared dead too
                        RAY_health_check_period_ms="1000", RAY_health_check_timeout_ms="2000",
                        RAY_health_check_failure_threshold="4")

    def start(self, name: str, *args: str) -> None:
        where = ["--head", "--port", str(self.port)] if not self.nodes else ["--address", self.address]
        ray_args = ["--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1"]
        if not self.nodes:
            ray_args += ["--temp-dir", str(self.ray_tmp), "--include-dashboard", "false",
                         "--ray-client-server-port", str(_free_port())]
        log = open(self.root / f"node-{name}.log", "wb")
        self.nodes[name] = subprocess.Popen(
            [sys.executable, "-m", "mlharness.cli", "node", *where, "--name", name, *args, "--", *ray_args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root)
        log.close()
        deadline = time.monotonic() + 60
        while b"Ray runtime started" not in (self.root / f"node-{name}.log").read_bytes():
            assert self.nodes[name].poll() is None, (self.root / f"node-{name}.log").read_text()
            assert time.monotonic() < deadline, f"node {name} did not start"
            time.sleep(0.2)

    def session_pids(self, name: str) -> list[int]:
        sid = self.nodes[name].pid  # start_new_session: the node's session id is its pid
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getsid(int(entry)) == sid:
                        found.append(int(entry))
                except OSError:
                    pass
        return found

    def kill(self, name: str) -> None:
        for pid in self.session_pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.nodes[name].wait()

    def stop(self) -> None:
        for name in reversed(list(self.nodes)):
            self.kill(name)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = time.monotonic()
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    saved = {name: os.environ.get(name) for name in cluster.auth}
    os.environ.update(cluster.auth)  # the sweep's driver runs in this process
    try:
        cluster.start("head")
        cluster.start("n2", "--system", B_SYSTEM)
        print(f"cluster of 2 nodes started in {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        cluster.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def hardware(folder: Path, name: str, system: str | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(f"kind: hardware\nname: {name}\nversion: 1.0.0\ndevice: cpu\n"
                    + (f"system: {system}\n" if system else ""))
    return path


def write_grid(path: Path, name: str, hardware_axis: list[str], scenarios: str = "[Offline, SingleStream]",
               batch_sizes: str = "[4, 8]", min_duration: int = 200, target_qps: int | None = None) -> Path:
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        quick: true
        timeout: 120
        models: ["null"]
        scenarios: {scenarios}
        hardware: [{", ".join(hardware_axis)}]
        batch_sizes: {batch_sizes}
        set: {{min_duration: {min_duration}{f", target_qps: {target_qps}" if target_qps else ""}}}
        """))
    return path


def driver(cluster: Cluster, cwd: Path, *args: str, progress: bool = False) -> subprocess.Popen:
    env = dict(cluster.env, TMPDIR=str(cwd))
    if progress:
        env |= {"MLHARNESS_PROGRESS": "on", "MLHARNESS_PROGRESS_INTERVAL": "0.3"}
    # SIGINT as a terminal's user has it: started from a background job (nohup, `&` in a script) the
    # child inherits it ignored, Python then never raises KeyboardInterrupt, and Ctrl-C does nothing.
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from mlharness.cli import main\nsys.exit(main(sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", code, "sweep", *args, "--cluster", cluster.address],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sweep(cluster: Cluster, cwd: Path, *args: str) -> tuple[int, str, str]:
    process = driver(cluster, cwd, *args)
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def cells(db: Path, sweep_id: str) -> list[dict]:
    with ResultStore(db) as store:
        rows = [dict(row) for row in store.sweep_cells(sweep_id)]
        for row in rows:
            row["params"] = json.loads(row["params_json"])
            row["record"] = store.get_record(row["run_id"]).to_dict() if row["run_id"] else None
    return rows


def test_a_grid_runs_on_two_nodes_placed_by_hardware_and_matches_a_local_sweep(cluster: Cluster, tmp_path: Path) -> None:
    any_cpu = hardware(tmp_path / "hw", "any-cpu", None)
    on_b = hardware(tmp_path / "hw", "on-b", B_SYSTEM)
    grid = write_grid(tmp_path / "grid.yaml", "two-nodes", [str(any_cpu), str(on_b)], batch_sizes="[4, 8]")
    results = tmp_path / "results"
    started = time.monotonic()
    code, out, err = sweep(cluster, tmp_path, str(grid), "--results-dir", str(results))
    print(f"8 cells on the cluster in {time.monotonic() - started:.1f} s")
    assert code == 0, err
    assert "cluster: 2 node(s): head, n2" in err
    assert "sweep two-nodes: 8 ran now, 0 skipped as finished, 0 failed" in out
    rows = cells(results / "mlharness.sqlite", "two-nodes")
    assert len(rows) == 8 and all(row["status"] == "ok" for row in rows)
    for row in rows:
        record = row["record"]
        node = record["system"]["cluster_node"]
        # Placement: a cell whose hardware names the system loopback-b ran on the node answering to it.
        assert node["name"] in ("head", "n2")
        if row["params"]["hardware"] == str(on_b):
            assert node["name"] == "n2", row["params"]
        # The record is the node's (its detected system), its files are in the driver's tree.
        assert record["system"]["hostname"] == socket.gethostname() and record["system_name"]
        folder = Path(record["results_path"])
        assert folder.parent.name == "runs" and folder.is_relative_to(results.resolve()), folder
        written = json.loads((folder / "run.json").read_text())
        assert written["results_path"] == str(folder) and written["system"]["cluster_node"] == node
        assert (folder / "performance" / "run_1" / "mlperf_log_summary.txt").is_file()
        assert (results / f"{record['system_name']}.json").is_file()
    for scenario in ("Offline", "SingleStream"):  # the MLPerf-shaped view, rebuilt by the driver
        (view,) = results.glob(f"*/null/{scenario}/run.json")
        assert json.loads(view.read_text())["status"] == "ok"

    # The same grid on this machine alone: the same records, modulo timings, ids and paths.
    local = tmp_path / "local"
    assert run_cli("sweep", grid, "--results-dir", local) == 0
    local_rows = cells(local / "mlharness.sqlite", "two-nodes")
    by_key = {(row["cell_key"], row["repeat_index"]): comparable(row["record"]) for row in local_rows}
    assert set(by_key) == {(row["cell_key"], row["repeat_index"]) for row in rows}
    for row in rows:
        theirs = by_key[(row["cell_key"], row["repeat_index"])]
        assert comparable(row["record"]) == theirs, differences(comparable(row["record"]), theirs)


TIMING_KEYS = {"run_id", "started_at", "finished_at", "results_path", "performance", "cold_start"}


def differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in differences(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def comparable(record: dict) -> dict:
    """A record without what differs from run to run: ids, times, paths, measured figures, and the
    cluster node (the one thing a cluster run adds)."""
    kept = {k: v for k, v in record.items() if k not in TIMING_KEYS}
    kept["system"] = {k: v for k, v in record["system"].items() if k != "cluster_node"}
    settings = json.loads(json.dumps(record["settings"]))
    # SingleStream's expected latency is the manifest's or, when this run's warm-up beat it by half, the
    # warm-up's (layer `measured`): which one is a matter of timing, so neither is compared.
    if settings.get("origin", {}).get("target_latency") in ("measured", "model"):
        for part in ("loadgen", "origin"):
            settings.get(part, {}).pop("target_latency", None)
        settings["layers"] = [layer for layer in settings.get("layers", []) if layer != "measured"]
    kept["settings"] = settings
    # LoadGen's warnings are about timing too ("Logging allocation detected: tid: ...", "CAS failed").
    kept["loadgen"] = {mode: {k: v for k, v in logged.items() if k != "warnings"}
                       for mode, logged in record["loadgen"].items()}
    return kept


def test_a_cell_no_node_can_run_is_unschedulable_at_once(cluster: Cluster, tmp_path: Path) -> None:
    nowhere = hardware(tmp_path / "hw", "nowhere", "no-such-system")
    grid = write_grid(tmp_path / "grid.yaml", "nowhere", ["cpu", str(nowhere)], scenarios="[Offline]",
                      batch_sizes="[4]")
    results = tmp_path / "results"
    code, out, err = sweep(cluster, tmp_path, str(grid), "--results-dir", str(results))
    assert code == 0, err
    rows = {row["params"].get("hardware", "cpu"): row for row in cells(results / "mlharness.sqlite", "nowhere")}
    assert rows["cpu"]["status"] == "ok"
    stuck = rows[str(nowhere)]
    assert stuck["status"] == "unschedulable" and stuck["run_id"] is None and stuck["seconds"] == 0
    assert "no node of the cluster has mlharness_system:no-such-system" in stuck["error"]
    assert "(nodes: head: mlharness_node:head, " in stuck["error"]  # what each node has, for the user to compare
    assert "; n2: mlharness_node:n2, " in stuck["error"] and stuck["error"].endswith(f"mlharness_system:{B_SYSTEM})")
    assert "UNSCHEDULABLE" in err


def launcher_children(cluster: Cluster, name: str) -> list[int]:
    """The cell processes (mlharness.running.run_child processes) started by a node's Ray workers."""
    import psutil

    workers = set(cluster.session_pids(name))
    found = []
    for process in psutil.process_iter(["cmdline", "ppid"]):
        cmdline = process.info["cmdline"] or []
        if "mlharness.running.run_child" in cmdline and process.info["ppid"] in workers:
            found.append(process.pid)
    return found


def test_a_node_killed_mid_cell_loses_no_cell(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start("n3", "--system", B_SYSTEM)  # a node of its own to kill
    try:
        on_b = hardware(tmp_path / "hw", "on-b", B_SYSTEM)
        grid = write_grid(tmp_path / "grid.yaml", "killed", [str(on_b)], scenarios="[Offline]",
                          batch_sizes="[4, 8, 16]", min_duration=1200)
        results = tmp_path / "results"
        started = time.monotonic()
        process = driver(cluster, tmp_path, str(grid), "--results-dir", str(results))
        deadline = time.monotonic() + 60
        while not launcher_children(cluster, "n3"):  # a cell is running on n3
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        cluster.kill("n3")
        out, err = process.communicate(timeout=120)
        print(f"3 cells, one node killed, in {time.monotonic() - started:.1f} s")
    finally:
        cluster.kill("n3")
    assert process.returncode == 0, err
    assert re.search(r"node n3 lost while running the cell \(\w+", err), err
    rows = cells(results / "mlharness.sqlite", "killed")
    assert len(rows) == 3 and all(row["status"] == "ok" for row in rows), [(r["status"], r["error"]) for r in rows]
    retried = [row for row in rows if row["error"]]
    assert len(retried) == 1 and retried[0]["error"].startswith("node n3 lost while running the cell")
    assert "; retried on node n2" in retried[0]["error"]
    # Every cell ran to its end on the node left that matches its hardware (head does not).
    assert {row["record"]["system"]["cluster_node"]["name"] for row in rows} == {"n2"}
    with ResultStore(results / "mlharness.sqlite") as store:
        assert len(store.list_runs()) == 3  # the lost attempt left nothing here (its node kept its folder)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_cancels_what_runs_keeps_what_finished_and_resume_runs_the_rest(cluster: Cluster, tmp_path: Path,
                                                                                stop: signal.Signals) -> None:
    """Ctrl-C, or SIGTERM (which Ray's driver would turn into a bare exit), stops the sweep the same way."""
    # Cells of 3 s or more: the interrupt must land while cells still run, after the first has been
    # recorded (with 1.2 s cells a CI run once saw all five finish before it landed). Server runs at
    # 100 QPS last their 3 s by LoadGen's clock on a few hundred queries; Offline cells of the null
    # model were made that long by 3.3 M samples of CPU each.
    grid = write_grid(tmp_path / "grid.yaml", "stopped", ["cpu"], scenarios="[Server]",
                      batch_sizes="[2, 4, 8, 16, 32]", min_duration=3000, target_qps=100)
    results = tmp_path / "results"
    db = results / "mlharness.sqlite"
    scratch_before = set(cluster.root.glob("mlharness-node-cell-*"))  # the nodes' TMPDIR
    process = driver(cluster, tmp_path, str(grid), "--results-dir", str(results))
    # Waits on the event (a cell recorded), not the clock: under load a 3 s cell took 71 s, past the 90 s
    # deadline this loop had. pytest-timeout bounds the test if no cell is ever recorded.
    while not db.exists() or not cells(db, "stopped"):  # a cell finished
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    process.send_signal(stop)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + stop, err
    assert re.search(r"sweep stopped interrupted; (\d) cell run\(s\) recorded, (\d) cancelled on their nodes", err), err
    finished = {row["cell_key"] for row in cells(db, "stopped")}
    assert 1 <= len(finished) < 5 and all(row["status"] == "ok" for row in cells(db, "stopped"))
    # The cancelled cells end on their nodes after the driver has gone: wait for that (not a fixed second),
    # then nothing of theirs is left there, neither a run process nor a scratch folder.
    def left() -> list[str]:
        """What the cancelled cells left on the nodes: run processes, scratch folders."""
        import psutil

        pids = launcher_children(cluster, "head") + launcher_children(cluster, "n2")
        orphans = [p.pid for p in psutil.process_iter(["cmdline"])  # the nodes' TMPDIR holds their work folders
                   if "mlharness.running.run_child" in (p.info["cmdline"] or [])
                   and any(arg.startswith(str(cluster.root)) for arg in p.info["cmdline"])]
        folders = set(cluster.root.glob("mlharness-node-cell-*")) - scratch_before
        return ([f"run process {pid}" for pid in pids] + [f"run process {pid}, its Ray worker gone" for pid in orphans if pid not in pids]
                + [f"scratch {f.name}: {sorted(str(x.relative_to(f)) for x in f.rglob('*'))[:8]}" for f in folders])

    try:
        wait_for(lambda: not left(), "the cancelled cells' processes and scratch folders gone from the nodes")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; left: {left()}; the driver said: {err[-2000:]}") from None
    if stop != signal.SIGINT:
        return  # what a resume does after the stop is the same whichever signal stopped it: run once, for SIGINT

    code, out, err = sweep(cluster, tmp_path, str(grid), "--results-dir", str(results))
    assert code == 0, err
    assert f"5 cell run(s), {len(finished)} already finished, {5 - len(finished)} to run" in err
    rows = cells(db, "stopped")
    assert len(rows) == 5 and all(row["status"] == "ok" for row in rows)
    with ResultStore(db) as store:
        assert len(store.list_runs()) == 5  # no finished cell ran again


def test_without_ray_cluster_is_a_one_line_error_naming_the_extra(tmp_path: Path) -> None:
    grid = write_grid(tmp_path / "grid.yaml", "noray", ["cpu"], scenarios="[Offline]", batch_sizes="[4]")
    code = ("import sys; sys.modules['ray'] = None\n"  # `import ray` fails as where it is not installed
            "from mlharness.cli import main\n"
            f"sys.exit(main(['sweep', {str(grid)!r}, '--cluster', 'ray']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 1
    assert done.stderr == ("mlharness: error: ray is not installed (needed for --cluster and mlharness node "
                           "(sweeps on a Ray cluster)); pip install 'mlharness[cluster]'\n")
    assert not (tmp_path / "results").exists()


def test_a_cluster_none_of_whose_nodes_mlharness_started_is_a_one_line_error(tmp_path: Path) -> None:
    """A Ray cluster of plain Ray nodes (here one that the driver's own process starts, on loopback, as a
    notebook's `ray.init()` would): no node advertises mlharness resources, so the sweep is refused before
    any cell runs, naming what to start."""
    grid = write_grid(tmp_path / "grid.yaml", "plainray", ["cpu"], scenarios="[Offline]", batch_sizes="[4]")
    code = ("import sys, ray\n"
            "ray.init(num_cpus=1, include_dashboard=False, logging_level='ERROR', log_to_driver=False, "
            "_node_ip_address='127.0.0.1')\n"
            "from mlharness.cli import main\n"
            f"sys.exit(main(['sweep', {str(grid)!r}, '--cluster', 'ray']))")
    # A token of its own: a local Ray started without one writes ~/.ray/auth_token, which test_mutants_cluster's
    # drivers read for its own local Ray.
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **auth))
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == ("mlharness: error: no node of the Ray cluster advertises mlharness "
                                            "resources; start each node with `mlharness node` (docs/cluster.md)")
    assert not list((tmp_path / "results").rglob("run.json"))


def test_a_cancel_during_the_scratch_removal_still_removes_it_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray raises a cell's cancel (the sweep's Ctrl-C) as a KeyboardInterrupt in the task's thread. One
    that lands while the task removes its scratch folder must not leave the rest of the folder on the
    node. Stood in for here: the interrupt comes from the third file removal (a real cancel cannot be
    aimed at that moment)."""
    from mlharness.cluster.ray_launcher import remove_scratch

    scratch = tmp_path / "mlharness-node-cell-x"
    for i in range(6):
        (scratch / "results" / f"run{i}").mkdir(parents=True)
        (scratch / "results" / f"run{i}" / "README.md").write_text("x")
    real_unlink, calls = os.unlink, []

    def unlink(*args: object, **kwargs: object) -> None:
        calls.append(args)
        real_unlink(*args, **kwargs)
        if len(calls) == 3:
            raise KeyboardInterrupt()

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(KeyboardInterrupt):  # the cancel goes on once the folder is gone
        remove_scratch(scratch)
    assert not scratch.exists()
