"""Every response reaches its own sample, through every scenario, with batching and several workers.

The null-routed model answers each sample one-hot at its own index and its dataset labels each
sample with its index, so top-1 is exactly 1.0 only when every response is routed right; a
misrouted, dropped or swapped response lowers it (or, never completed, stops the run).

What the backend really received is measured by the backend itself, not read from recorded
settings: the runs use `routing-probe`, a test-local backend (the null backend in routing mode,
plus a log of every batch: the thread that sent it and the sample indices in it) installed the way
a third-party backend is — a distribution with an `mlharness.backends` entry point on the run's
PYTHONPATH. The SUT's merge and overflow paths are also driven directly, with the queue filled
before the worker starts, so their batches are known exactly."""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlharness.running.settings import SCENARIOS
from mlharness.specs.manifests import load_manifest
from tests.support import REPO, read_run, run_cli, write_manifest

MODEL = REPO / "specs" / "models" / "null-routed.yaml"
SAMPLES = 1024  # null-routed-samples: sample i has label i, and null-routed answers one-hot at i

PROBE = '''
import json
import os
import threading
import time

import numpy as np

from mlharness.sut.backends.null_backend import NullBackend


class RoutingProbe(NullBackend):
    """The null backend in routing mode, logging each batch it receives: (thread name, sample
    indices read from the routed input). Written to $MLH_PROBE_LOG when the backend is closed."""

    name = "routing-probe"

    def load(self):
        super().load()
        routed = self.predict
        if getattr(routed, "__name__", "") != "_predict_routed":
            raise RuntimeError("routing-probe needs a model with attributes.route_from_input")
        self._routed = routed
        self._sleep = float(os.environ.get("MLH_PROBE_SLEEP_S", "0"))
        self._batches = []
        self._lock = threading.Lock()
        self.predict = self._probe

    def _probe(self, inputs):
        keys = [int(k) for k in np.rint(inputs[self._route].reshape(len(inputs[self._route]), -1)[:, 0])]
        with self._lock:
            self._batches.append((threading.current_thread().name, keys))
        if self._sleep:
            time.sleep(self._sleep)  # a slower model, so Server's queue holds several queries to merge
        return self._routed(inputs)

    def close(self):
        with open(os.environ["MLH_PROBE_LOG"], "w") as out:
            json.dump(self._batches, out)
'''


@pytest.fixture(scope="module")
def probe_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed distribution `mlh-routing-probe` (backend `routing-probe`)."""
    root = tmp_path_factory.mktemp("probe-site")
    (root / "mlh_routing_probe.py").write_text(PROBE)
    dist = root / "mlh_routing_probe-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlh-routing-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mlharness.backends]\nrouting-probe = mlh_routing_probe:RoutingProbe\n")
    return root


def _routed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: Path, scenario: str, *sets: str,
                sleep: float = 0.0) -> tuple[dict, list[tuple[str, list[int]]]]:
    """An accuracy run of null-routed on the probe; its record, and the batches the LoadGen test
    sent the backend (warm-up is off; the first inference, before LoadGen, is left out)."""
    log = tmp_path / "batches.json"
    # Added in front: what the caller had on PYTHONPATH (a mutation run's hooks, say) stays.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MLH_PROBE_LOG", str(log))
    monkeypatch.setenv("MLH_PROBE_SLEEP_S", str(sleep))
    results = tmp_path / "results"
    overrides = [arg for key_value in ("warmup_queries=0", *sets) for arg in ("--set", key_value)]
    code = run_cli("run", MODEL, "--backend", "routing-probe", "--software", "null", "--scenario", scenario,
                   "--mode", "accuracy", "--quick", "--timeout", "60", "--results-dir", results, *overrides)
    record = read_run(results, "null-routed", scenario)
    assert code == 0 and record["status"] == "ok", record.get("error")
    assert record["backend"] == "routing-probe"
    (first_thread, first_keys), *batches = [(thread, keys) for thread, keys in json.loads(log.read_text())]
    assert (first_thread, first_keys) == ("MainThread", [0]), "the first inference: sample 0, before LoadGen"
    assert batches, "the LoadGen test sent the backend nothing"
    return record, batches


def _assert_every_sample_routed_once(record: dict, batches: list[tuple[str, list[int]]]) -> None:
    accuracy = record["accuracy"]
    assert accuracy["metric"] == "topk"
    assert accuracy["values"]["top1"] == 1.0, accuracy["headline"]
    assert re.search(rf"\bgood={SAMPLES}, total={SAMPLES}\b", accuracy["headline"]), accuracy["headline"]
    received = sorted(key for _, keys in batches for key in keys)
    assert received == list(range(SAMPLES)), "the backend must receive every sample exactly once"


def _worker_threads(batches: list[tuple[str, list[int]]]) -> set[str]:
    return {thread for thread, _ in batches}


def test_offline_batches_and_two_workers_route_every_response(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             probe_site: Path) -> None:
    record, batches = _routed_run(tmp_path, monkeypatch, probe_site, "Offline", "max_batch_size=64", "workers=2",
                                  sleep=0.002)
    _assert_every_sample_routed_once(record, batches)
    # One query of 1024 split into batches of 64, served by both workers.
    assert [len(keys) for _, keys in batches] == [64] * 16
    assert _worker_threads(batches) == {"mlharness-worker-0", "mlharness-worker-1"}


def test_server_merges_queries_into_batches_and_routes_every_response(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_site: Path) -> None:
    """Server queries come one sample at a time; a backend slower than the arrival rate lets the
    queue fill, so the workers merge waiting queries (and LoadGen coalesces late ones into one
    issue, which the SUT splits) into batches of up to max_batch_size."""
    record, batches = _routed_run(tmp_path, monkeypatch, probe_site, "Server", "max_batch_size=16", "workers=2",
                                  "target_qps=4000", "coalesce_queries=true", sleep=0.008)
    _assert_every_sample_routed_once(record, batches)
    sizes = [len(keys) for _, keys in batches]
    assert max(sizes) == 16 and min(sizes) >= 1, sizes
    assert sum(size > 1 for size in sizes) >= len(sizes) // 2, f"most batches should be merged: {sizes}"
    assert _worker_threads(batches) == {"mlharness-worker-0", "mlharness-worker-1"}


@pytest.mark.parametrize("max_batch_size, expected_sizes", [(16, {8}), (3, {3, 2})],
                         ids=["query-fits-one-batch", "query-larger-than-a-batch"])
def test_multistream_batches_route_every_response(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_site: Path,
                                                  max_batch_size: int, expected_sizes: set[int]) -> None:
    """A MultiStream query is 8 samples: one batch when it fits, else split 3 + 3 + 2."""
    record, batches = _routed_run(tmp_path, monkeypatch, probe_site, "MultiStream",
                                  f"max_batch_size={max_batch_size}", "workers=2", sleep=0.001)
    _assert_every_sample_routed_once(record, batches)
    assert {len(keys) for _, keys in batches} == expected_sizes
    assert _worker_threads(batches) == {"mlharness-worker-0", "mlharness-worker-1"}


def test_singlestream_routes_every_response(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_site: Path) -> None:
    """SingleStream runs inline in LoadGen's issue thread, one sample per query, whatever the
    batching settings say."""
    record, batches = _routed_run(tmp_path, monkeypatch, probe_site, "SingleStream", "max_batch_size=16", "workers=2")
    _assert_every_sample_routed_once(record, batches)
    assert {len(keys) for _, keys in batches} == {1}
    assert not any(thread.startswith("mlharness-worker-") for thread in _worker_threads(batches))


def test_every_scenario_is_covered() -> None:
    covered = {"Offline", "Server", "MultiStream", "SingleStream"}
    assert covered == set(SCENARIOS)


def test_the_shipped_null_routed_model_scores_exactly_one_on_the_null_backend(tmp_path: Path) -> None:
    """As a user runs it: by name, on the null backend itself (the probe above is a subclass)."""
    results = tmp_path / "results"
    assert run_cli("run", "null-routed", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--set", "workers=2", "--set", "max_batch_size=100", "--timeout", "60", "--results-dir", results) == 0
    record = read_run(results, "null-routed", "Offline")
    assert record["backend"] == "null"
    assert record["accuracy"]["values"] == {"top1": 1.0, "top5": 1.0}


def test_the_plain_null_model_does_not_route() -> None:
    """Routing is the null-routed model's: the plain null model keeps its zero-filled predict."""
    from mlharness.sut.backends.null_backend import NullBackend

    hardware = load_manifest(REPO / "specs" / "hardware" / "cpu.yaml")
    plain = NullBackend(load_manifest(REPO / "specs" / "models" / "null.yaml"), {}, hardware)
    plain.load()
    assert "predict" not in vars(plain)
    assert not plain.predict({"x": np.arange(4, dtype=np.float32).reshape(4, 1)})["scores"].any()
    routed = NullBackend(load_manifest(MODEL), {}, hardware)
    routed.load()
    scores = routed.predict({"x": np.array([[3.0], [1030.0]], dtype=np.float32)})["scores"]
    assert scores.shape == (2, 1024) and scores.sum() == 2.0
    assert int(np.argmax(scores[0])) == 3 and int(np.argmax(scores[1])) == 1030 % 1024


def test_route_from_input_must_name_a_declared_input(tmp_path: Path) -> None:
    from mlharness.errors import UserError
    from mlharness.sut.backends.null_backend import NullBackend

    text = MODEL.read_text().replace("route_from_input: x", "route_from_input: y")
    model = load_manifest(write_manifest(tmp_path, "null-routed.yaml", text))
    backend = NullBackend(model, {}, load_manifest(REPO / "specs" / "hardware" / "cpu.yaml"))
    with pytest.raises(UserError) as raised:
        backend.load()
    assert str(raised.value) == (f"{model.path}: attributes.route_from_input: expected one of the declared "
                                 "inputs ['x'], got 'y'")


# The SUT's merge and overflow paths, driven directly --------------------------------------------

class _RecordingHandoff:
    """Gathers as the real handoff does; completes by copying each response row, by query id."""

    name = "recording"

    def __init__(self) -> None:
        self.completed: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def gather(self, staged: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        np.take(staged, rows, axis=0, out=out)

    def complete(self, query_ids: list[int], results: np.ndarray) -> None:
        with self._lock:
            for qid, row in zip(query_ids, results):
                self.completed.setdefault(int(qid), []).append(np.array(row))


def _direct_sut(max_batch_size: int, workers: int) -> tuple[Any, _RecordingHandoff, list[list[int]]]:
    from mlharness.sut.backends.null_backend import NullBackend
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.staging import StagedSamples
    from mlharness.sut.system_under_test import SystemUnderTest

    model = load_manifest(MODEL)
    received: list[list[int]] = []

    class Recording(NullBackend):
        def load(self) -> None:
            super().load()
            routed = self.predict

            def predict(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                received.append([int(v) for v in inputs["x"][:, 0]])
                return routed(inputs)

            self.predict = predict  # type: ignore[method-assign]

    backend = Recording(model, {}, load_manifest(REPO / "specs" / "hardware" / "cpu.yaml"))
    backend.load()
    ctx = ProcessingContext(attributes=model.attributes, model=model)
    staged = StagedSamples([(i, i) for i in range(SAMPLES)], model.inputs,
                           lambda sample, ctx: np.array([sample], dtype=np.float32), None, ctx)
    staged.load_samples(list(reversed(range(64))))  # staged rows are not the sample indices
    handoff = _RecordingHandoff()
    sut = SystemUnderTest(backend=backend, staged=staged, handoff=handoff, scenario="Server", postprocess=None,
                          ctx=ctx, max_batch_size=max_batch_size, workers=workers, result_spec=model.outputs[0])
    return sut, handoff, received


def _wait_for(handoff: _RecordingHandoff, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(handoff.completed) < count and time.monotonic() < deadline:
        time.sleep(0.005)


def _assert_routed(handoff: _RecordingHandoff, sample_of: dict[int, int]) -> None:
    assert sorted(handoff.completed) == sorted(sample_of), "every query id completed, none other"
    for qid, sample in sample_of.items():
        rows = handoff.completed[qid]
        assert len(rows) == 1, f"query {qid} completed {len(rows)} times"
        assert int(np.argmax(rows[0])) == sample and rows[0].sum() == 1.0, f"query {qid} got another sample's answer"


def test_the_worker_merges_waiting_queries_and_puts_the_overflow_back() -> None:
    """max_batch_size 4, one worker, the queue filled before it starts: a partial query of 3, then a
    query of 6 that issue_query splits into 4 + 2, in staged-row order (rows are reversed here, so
    samples 15, 14, 13, 12 then 11, 10). The worker merges 3 + 4 into a batch of 4 and puts the 3 left
    over back at the end; then 2 + those 3 give a batch of 4 and 1 goes back again."""
    sut, handoff, received = _direct_sut(max_batch_size=4, workers=1)
    sut.issue_query([100, 101, 102], [5, 6, 7])
    sut.issue_query([200, 201, 202, 203, 204, 205], [10, 11, 12, 13, 14, 15])
    sut.start()
    try:
        _wait_for(handoff, 9)
    finally:
        sut.stop()
    assert sut.failure is None
    assert received == [[5, 6, 7, 15], [11, 10, 14, 13], [12]]
    _assert_routed(handoff, {100: 5, 101: 6, 102: 7, 200: 10, 201: 11, 202: 12, 203: 13, 204: 14, 205: 15})


def test_many_workers_merge_single_sample_queries_without_misrouting() -> None:
    """Server's shape: 60 single-sample queries waiting, three workers merging them into batches of
    up to 8 (a batch of one goes through the no-copy path, larger ones through gather)."""
    sut, handoff, received = _direct_sut(max_batch_size=8, workers=3)
    sample_of = {1000 + i: (i * 7) % 64 for i in range(60)}
    for qid, sample in sample_of.items():
        sut.issue_query([qid], [sample])
    sut.start()
    try:
        _wait_for(handoff, len(sample_of))
    finally:
        sut.stop()
    assert sut.failure is None
    assert max(len(batch) for batch in received) == 8
    assert sorted(s for batch in received for s in batch) == sorted(sample_of.values())
    _assert_routed(handoff, sample_of)
