"""The hardware manifest's threads and CPU affinity, and the software manifest's environment, reach
the frameworks inside the run's own process.

What the framework got is observed where it runs, not read from recorded settings: the runs use
test-local backends (the onnxruntime and torch backends plus observations) installed the way a
third-party backend is — a distribution with `mlharness.backends` entry points on the run's
PYTHONPATH. Each writes, when the run closes it, what it saw to $MLH_PROBE_LOG:
- ONNX Runtime: the session's own SessionOptions, and the threads the session started while loading
  (its intra-op pool has intra_op_threads - 1 threads; the calling thread is the last one) with
  the CPUs each may run on;
- torch: get_num_threads / get_num_interop_threads inside the thread that runs predict (a SUT
  worker, not the thread that set them);
- both: the CPUs the predicting threads may run on, and the environment variables asked for."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import REPO, read_run, run_cli, write_manifest

PROBES = '''
import json
import os
import threading

from mlharness.sut.backends.onnxruntime_backend import OnnxRuntimeBackend
from mlharness.sut.backends.torch_backend import TorchBackend


def _tasks():
    return set(os.listdir("/proc/self/task"))


def _cpus_of(tid):
    """The CPUs thread `tid` of this process may run on (its Cpus_allowed_list)."""
    for line in open(f"/proc/self/task/{tid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return None


class _Observing:
    def load(self):
        before = _tasks()
        super().load()
        self._load_threads = sorted(_tasks() - before)
        self._load_thread_cpus = {tid: _cpus_of(tid) for tid in self._load_threads}
        self._predicting = {}
        self._lock = threading.Lock()
        wanted = [v for v in os.environ.get("MLH_PROBE_ENV_VARS", "").split(",") if v]
        self._env = {var: os.environ.get(var) for var in wanted}

    def predict(self, inputs):
        outputs = super().predict(inputs)
        name = threading.current_thread().name
        if name not in self._predicting:
            seen = {"cpus": sorted(os.sched_getaffinity(0)), **self._in_thread()}
            with self._lock:
                self._predicting.setdefault(name, seen)
        return outputs

    def _in_thread(self):
        return {}

    def _loaded(self):
        return {}

    def close(self):
        report = {"load_threads": self._load_threads, "load_thread_cpus": self._load_thread_cpus,
                  "predicting": self._predicting, "env": self._env, **self._loaded()}
        with open(os.environ["MLH_PROBE_LOG"], "w") as out:
            json.dump(report, out)
        super().close()


class OrtProbe(_Observing, OnnxRuntimeBackend):
    name = "ort-probe"

    def _loaded(self):
        options = self.session.get_session_options()
        return {"session": {"intra_op_num_threads": options.intra_op_num_threads,
                            "inter_op_num_threads": options.inter_op_num_threads}}


class TorchProbe(_Observing, TorchBackend):
    name = "torch-probe"

    def _in_thread(self):
        return {"num_threads": self._torch.get_num_threads(),
                "num_interop_threads": self._torch.get_num_interop_threads()}
'''

ENTRY_POINTS = """\
[mlharness.backends]
ort-probe = mlh_thread_probe:OrtProbe
torch-probe = mlh_thread_probe:TorchProbe
"""

TINY_TORCH = """\
kind: model
name: tiny-torch-threads
version: 1.0.0
framework: {name: torch}
dataset: null-samples
inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
outputs: [{name: y, type: scores, element_type: float32, shape: [batch, 3]}]
sources:
  module:
    factory: |
      import torch
      def factory(ctx):
          return torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
preprocess: |
  import numpy as np
  def preprocess(sample, ctx):
      return np.array([sample % 2], dtype=np.float32)
attributes:
  max_batch_size: 16
  settings: {Offline: {target_qps: 5000}}
accuracy: {metric: topk, k: [1]}
"""


@pytest.fixture(scope="module")
def probe_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed distribution `mlh-thread-probe` (backends ort-probe, torch-probe)."""
    root = tmp_path_factory.mktemp("thread-probe-site")
    (root / "mlh_thread_probe.py").write_text(PROBES)
    dist = root / "mlh_thread_probe-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlh-thread-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


@pytest.fixture(scope="module")
def pinned_cpu() -> int:
    """A CPU to pin the run to that is not all the CPUs this process may use (else pinning shows nothing)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        pytest.skip(f"pinning is only observable with two or more usable CPUs (have {cpus or 'unknown'})")
    return cpus[-1]


def _hardware(folder: Path, intra: int, inter: int, cpu: int) -> Path:
    return write_manifest(folder, "cpu-pinned.yaml", f"""\
        kind: hardware
        name: cpu-pinned
        version: 1.0.0
        device: cpu
        intra_op_threads: {intra}
        inter_op_threads: {inter}
        cpu_affinity: [{cpu}]
        """)


def _software(folder: Path, framework: str, environment: dict[str, str]) -> Path:
    env = "".join(f"  {var}: \"{value}\"\n" for var, value in environment.items())
    return write_manifest(folder, f"{framework}-env.yaml", (
        f"kind: software\nname: {framework}-env\nversion: 1.0.0\n"
        f"packages:\n  {framework}: \">=0\"\n  mlcommons-loadgen: \">=5.0\"\n"
        f"environment:\n{env}"))


def _probed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: Path, model: Path, backend: str,
                hardware: Path, software: Path, *sets: str, env_vars: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """A short Offline run on a probe backend with two workers; its record and what the probe saw."""
    log = tmp_path / "probe.json"
    # Added in front: what the caller had on PYTHONPATH (a mutation run's hooks, say) stays.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MLH_PROBE_LOG", str(log))
    monkeypatch.setenv("MLH_PROBE_ENV_VARS", ",".join(env_vars))
    results = tmp_path / "results"
    overrides = [arg for key_value in ("workers=2", "dataset_limit=32", *sets) for arg in ("--set", key_value)]
    code = run_cli("run", model, "--backend", backend, "--hardware", hardware, "--software", software,
                   "--scenario", "Offline", "--mode", "accuracy", "--timeout", "120", "--results-dir", results,
                   *overrides)
    record = read_run(results, _model_name(model), "Offline")
    assert code == 0 and record["status"] == "ok", record.get("error")
    assert record["backend"] == backend
    return record, json.loads(log.read_text())


def _model_name(model: Path) -> str:
    from mlharness.specs.manifests import load_manifest

    return load_manifest(model).name


def _worker_views(seen: dict) -> dict:
    workers = {name: view for name, view in seen["predicting"].items() if name.startswith("mlharness-worker-")}
    assert workers, f"no SUT worker ran predict: {sorted(seen['predicting'])}"
    return workers


RESNET = REPO / "specs" / "models" / "resnet50-light.yaml"


def test_hardware_threads_and_affinity_reach_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         probe_site: Path, pinned_cpu: int) -> None:
    pytest.importorskip("onnxruntime")
    hardware = _hardware(tmp_path, intra=3, inter=2, cpu=pinned_cpu)
    record, seen = _probed_run(tmp_path, monkeypatch, probe_site, RESNET, "ort-probe", hardware,
                               REPO / "specs" / "software" / "onnxruntime.yaml")
    assert seen["session"] == {"intra_op_num_threads": 3, "inter_op_num_threads": 2}
    # ORT's intra-op pool: 3 threads including the caller, so the session started 2, all pinned.
    assert len(seen["load_threads"]) == 2, seen["load_threads"]
    assert set(seen["load_thread_cpus"].values()) == {str(pinned_cpu)}
    for view in _worker_views(seen).values():
        assert view["cpus"] == [pinned_cpu]
    assert record["backend_info"]["intra_op_threads"] == 3 and record["backend_info"]["inter_op_threads"] == 2
    # The record says the run was pinned: the system is detected after pinning.
    assert record["hardware"]["cpu_affinity"] == [pinned_cpu]
    assert record["system"]["cpus_available"] == 1


def test_set_intra_op_threads_overrides_the_hardware_manifest_in_onnxruntime(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_site: Path, pinned_cpu: int) -> None:
    pytest.importorskip("onnxruntime")
    hardware = _hardware(tmp_path, intra=3, inter=2, cpu=pinned_cpu)
    _, seen = _probed_run(tmp_path, monkeypatch, probe_site, RESNET, "ort-probe", hardware,
                          REPO / "specs" / "software" / "onnxruntime.yaml", "intra_op_threads=1")
    assert seen["session"]["intra_op_num_threads"] == 1
    assert seen["load_threads"] == [], "intra_op_threads=1: ORT runs on the calling thread, no pool"


def test_hardware_threads_affinity_and_environment_reach_torch_in_the_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_site: Path, pinned_cpu: int) -> None:
    """torch's thread settings are per process but read in the thread that computes: the SUT's
    workers must see them, not only the thread that set them. The software manifest's environment
    is set in the run's process (and not in the caller's)."""
    pytest.importorskip("torch")
    model = write_manifest(tmp_path, "tiny-torch-threads.yaml", TINY_TORCH)
    hardware = _hardware(tmp_path, intra=3, inter=5, cpu=pinned_cpu)
    software = _software(tmp_path, "torch", {"MLH_THREADS_TEST_VAR": "from the manifest", "HF_HUB_OFFLINE": "1"})
    monkeypatch.delenv("MLH_THREADS_TEST_VAR", raising=False)
    record, seen = _probed_run(tmp_path, monkeypatch, probe_site, model, "torch-probe", hardware, software,
                               env_vars=("MLH_THREADS_TEST_VAR", "HF_HUB_OFFLINE"))
    for view in _worker_views(seen).values():
        assert view == {"cpus": [pinned_cpu], "num_threads": 3, "num_interop_threads": 5}
    assert seen["env"] == {"MLH_THREADS_TEST_VAR": "from the manifest", "HF_HUB_OFFLINE": "1"}
    assert "MLH_THREADS_TEST_VAR" not in os.environ, "the environment is the run's, not the caller's"
    assert record["software"]["manifest"]["name"] == "torch-env"


def test_one_torch_worker_on_the_cpu_is_the_runs_own_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             probe_site: Path, pinned_cpu: int) -> None:
    """torch's OpenMP runtime slows parallel regions on a second live thread once the first has run
    some, so with one worker on the CPU the run's own thread (which loaded and warmed the module)
    serves, while LoadGen's test runs beside it; the record says so. ONNX Runtime keeps its worker."""
    pytest.importorskip("torch")
    model = write_manifest(tmp_path / "torch", "tiny-torch-threads.yaml", TINY_TORCH)
    hardware = _hardware(tmp_path, intra=1, inter=1, cpu=pinned_cpu)
    software = _software(tmp_path, "torch", {})
    record, seen = _probed_run(tmp_path / "torch", monkeypatch, probe_site, model, "torch-probe", hardware, software,
                               "workers=1")
    assert sorted(seen["predicting"]) == ["MainThread"], seen["predicting"]
    assert record["loadgen"]["accuracy"]["sut"]["served_on"] == "caller"

    record, seen = _probed_run(tmp_path / "ort", monkeypatch, probe_site, RESNET, "ort-probe", hardware,
                               REPO / "specs" / "software" / "onnxruntime.yaml", "workers=1")
    assert "mlharness-worker-0" in seen["predicting"], seen["predicting"]  # the warm-up ran on the main thread
    assert record["loadgen"]["accuracy"]["sut"]["served_on"] == "workers"


def test_the_callers_environment_wins_over_the_software_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_site: Path, pinned_cpu: int) -> None:
    """The manifest's environment is a default: a variable the caller set stays as set."""
    pytest.importorskip("onnxruntime")
    hardware = _hardware(tmp_path, intra=1, inter=1, cpu=pinned_cpu)
    software = _software(tmp_path, "onnxruntime", {"MLH_THREADS_TEST_VAR": "from the manifest",
                                                   "MLH_THREADS_OTHER_VAR": "also from the manifest"})
    monkeypatch.setenv("MLH_THREADS_TEST_VAR", "from the caller")
    _, seen = _probed_run(tmp_path, monkeypatch, probe_site, RESNET, "ort-probe", hardware, software,
                          env_vars=("MLH_THREADS_TEST_VAR", "MLH_THREADS_OTHER_VAR"))
    assert seen["env"] == {"MLH_THREADS_TEST_VAR": "from the caller", "MLH_THREADS_OTHER_VAR": "also from the manifest"}


def test_cpus_this_process_may_not_use_are_a_one_line_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    hardware = _hardware(tmp_path, intra=1, inter=1, cpu=4095)
    code = run_cli("run", "null", "--hardware", hardware, "--scenario", "Offline", "--quick",
                   "--results-dir", tmp_path / "results")
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"mlharness: error: {hardware}: cpu_affinity: expected CPUs this process may use [")
    assert err[-1].endswith("got [4095]")
