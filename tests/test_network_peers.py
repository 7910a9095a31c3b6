"""Network runs against peers: `mlharness serve` queried by Triton's own clients (tritonclient, HTTP with
and without the binary extension, gRPC), a third-party server (Seldon MLServer) driven by our network SUT,
and `mlharness serve` driven by `mlharness run --endpoint`, each checked against what the same model computes
in this process. Real servers on 127.0.0.1 only, stopped by their own pids (tests/network_support.py,
tests/oip_third_party.py).

The LoadGen runs are short but VALID by LoadGen's own rules, with these settings (measured on the project's
2-core machine while another test run kept it busy):

* Server and SingleStream pass LoadGen's early stopping only after enough queries: at the default
  percentiles (99 for Server, 90 for SingleStream) about 460 and 64 queries with none over the latency
  target. The null model through MLServer affords the full 99th percentile (500 queries at 250/s, and
  a 500 ms latency target that its 2-10 ms answers did not come near). resnet50-light answers in
  150-250 ms here, so its SingleStream and Server runs judge the 50th percentile
  (`target_latency_percentile=50`: SingleStream's early stopping then needs 11 queries, says LoadGen's
  summary, and Server passed with 12), with a 2 s Server latency target.
* Offline is VALID when its one query takes at least min_duration: LoadGen sends target_qps x
  min_duration x 1.1 samples, so target_qps must stay above what the server can do (resnet50-light: 8/s
  here, at most about 20/s on an idle machine; 40 is the manifest's own).
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from mlharness.running.resolve import select_model
from mlharness.running.settings import HARNESS_DEFAULTS
from mlharness.specs.index import default_index
from mlharness.sut.network.tensors import datatype_of
from mlharness.sut.processing import batch_result_function
from mlharness.sut.runtime import build_runtime
from tests.network_support import Served, mlharness_serve
from tests.oip_third_party import server_available, third_party_oip_server
from tests.support import linear_torch_model, newest_run, run_new, write_manifest

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402 - after the skip: needs tritonclient

# Served and computed in this process for the conformance tests (model -> backend; the model's name in the
# protocol is its manifest's). null-routed answers each sample one-hot at its own index, so a row sent back
# for the wrong sample shows.
CONFORMANCE_MODELS = {"resnet50-light": "onnxruntime", "null": "null", "null-routed": "null"}
BATCHED = [3, 0, 5]  # dataset indices sent together in one request (the server batches them as one)
SINGLES = [7, 1]  # sent one per request


@dataclass(frozen=True)
class InProcess:
    """What the model computes in this process (the in-process run's runtime: the dataset's load, the
    staged preprocess, the backend and the postprocess) for some dataset indices, with their raw samples."""
    raw: np.ndarray  # the raw samples as the dataset loads them, stacked: what a client sends
    results: np.ndarray  # the result rows, in the same order
    input_name: str
    result_name: str
    result_datatype: str


def in_process(name: str, backend: str, groups: list[list[int]]) -> list[InProcess]:
    """For each group of dataset indices, what one batch of them gives in this process."""
    index = default_index()
    model = select_model(index, name, backend)
    dataset = index.find("dataset", model.default_dataset)
    options = {**HARNESS_DEFAULTS, "max_batch_size": int(model.attributes.get("max_batch_size", 1))}
    runtime = build_runtime(model, dataset, index.find("hardware", "cpu"), backend, options)
    result_of, staged, result = batch_result_function(runtime.postprocess), runtime.staged, model.result or model.outputs[0]
    found = []
    try:
        for indices in groups:
            raw = np.stack([np.asarray(staged.load_raw(staged.items[i][0], runtime.ctx) if staged.load_raw
                                       else staged.items[i][0]) for i in indices])
            staged.load_samples(indices)
            batch = {input_name: array[staged.rows(indices)] for input_name, array in staged.arrays.items()}
            results = np.array(result_of(runtime.backend.predict(batch), runtime.ctx, batch))  # a copy
            found.append(InProcess(raw, results, model.inputs[0].name, result.name, datatype_of(results)))
    finally:
        runtime.backend.close()
    return found


class ServerPool:
    """`mlharness serve` per model, started on first use and kept for the module (a model load is seconds)."""

    def __init__(self, stack: contextlib.ExitStack, cwd: Path):
        self.stack, self.cwd, self.servers = stack, cwd, {}

    def get(self, model: str, *args: str) -> Served:
        if model not in self.servers:
            self.servers[model] = self.stack.enter_context(mlharness_serve(model, *args, cwd=self.cwd))
        return self.servers[model]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    with contextlib.ExitStack() as stack:
        yield ServerPool(stack, tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def expected() -> dict[str, InProcess]:
    """The in-process results of each conformance model, batched as the requests batch them."""
    groups = [BATCHED, *([i] for i in SINGLES)]
    return {f"{model}/{tuple(indices)}": found
            for model, backend in CONFORMANCE_MODELS.items()
            for indices, found in zip(groups, in_process(model, backend, groups))}


def _authority(url: str) -> str:
    return url.partition("://")[2]


# ---- 1. Conformance: Triton's clients against mlharness serve ----

@pytest.mark.parametrize("model", CONFORMANCE_MODELS)
def test_tritonclient_http_reads_health_and_metadata(model: str, servers: ServerPool,
                                                     expected: dict[str, InProcess]) -> None:
    served = servers.get(model)
    want = expected[f"{model}/{tuple(BATCHED)}"]
    client = tritonhttp.InferenceServerClient(_authority(served.http))
    try:
        assert (client.is_server_live(), client.is_server_ready(), client.is_model_ready(model)) == (True, True, True)
        assert client.is_model_ready("no-such-model") is False
        server = client.get_server_metadata()
        assert server["name"] == "mlharness" and "binary_tensor_data" in server["extensions"]
        meta = client.get_model_metadata(model)
        # The input is the raw sample as the dataset loads it (any size per dimension), batched; the
        # output is the manifest's result.
        assert meta["name"] == model and meta["inputs"] == [
            {"name": want.input_name, "datatype": datatype_of(want.raw), "shape": [-1] * want.raw.ndim}]
        assert meta["outputs"] == [{"name": want.result_name, "datatype": want.result_datatype,
                                    "shape": [-1, *want.results.shape[1:]]}]
        # Triton's own extension (model configuration) is not served: refused with the protocol's JSON error,
        # which tritonclient reads (it failed to parse Starlette's plain-text 404 before).
        with pytest.raises(InferenceServerException, match="not a route of the protocol served here"):
            client.get_model_config(model)
    finally:
        client.close()


def _http_infer(client: Any, model: str, want: InProcess, binary: bool, request_id: str,
                name_output: bool = True) -> Any:
    tensor = tritonhttp.InferInput(want.input_name, list(want.raw.shape), datatype_of(want.raw))
    tensor.set_data_from_numpy(want.raw, binary_data=binary)
    outputs = [tritonhttp.InferRequestedOutput(want.result_name, binary_data=binary)] if name_output else None
    return client.infer(model, [tensor], outputs=outputs, request_id=request_id)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", CONFORMANCE_MODELS)
def test_tritonclient_http_infer_equals_in_process(model: str, binary: bool, servers: ServerPool,
                                                   expected: dict[str, InProcess]) -> None:
    served = servers.get(model)
    client = tritonhttp.InferenceServerClient(_authority(served.http))
    try:
        for indices in (BATCHED, *([i] for i in SINGLES)):
            want = expected[f"{model}/{tuple(indices)}"]
            reply = _http_infer(client, model, want, binary, f"req-{indices[0]}")
            assert reply.get_response()["id"] == f"req-{indices[0]}"
            output = reply.get_output(want.result_name)
            assert (output["datatype"], output["shape"]) == (want.result_datatype, list(want.results.shape))
            assert ("binary_data_size" in (output.get("parameters") or {})) is binary
            np.testing.assert_array_equal(reply.as_numpy(want.result_name), want.results)
        # No output named: all of them (the one result), as the protocol says.
        want = expected[f"{model}/{tuple(BATCHED)}"]
        np.testing.assert_array_equal(_http_infer(client, model, want, binary, "all", name_output=False)
                                      .as_numpy(want.result_name), want.results)
        bad = tritonhttp.InferRequestedOutput("no-such-output", binary_data=binary)
        tensor = tritonhttp.InferInput(want.input_name, list(want.raw.shape), datatype_of(want.raw))
        tensor.set_data_from_numpy(want.raw, binary_data=binary)
        with pytest.raises(InferenceServerException, match="requested output 'no-such-output'"):
            client.infer(model, [tensor], outputs=[bad])
    finally:
        client.close()


@pytest.mark.parametrize("model", CONFORMANCE_MODELS)
def test_tritonclient_grpc_health_metadata_and_infer_equal_in_process(model: str, servers: ServerPool,
                                                                      expected: dict[str, InProcess]) -> None:
    served = servers.get(model)
    client = tritongrpc.InferenceServerClient(_authority(served.grpc))
    try:
        assert (client.is_server_live(), client.is_server_ready(), client.is_model_ready(model)) == (True, True, True)
        assert client.get_server_metadata(as_json=True)["name"] == "mlharness"
        want = expected[f"{model}/{tuple(BATCHED)}"]
        meta = client.get_model_metadata(model, as_json=True)
        # Protobuf's JSON writes int64 dimensions as strings.
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [
            (want.input_name, datatype_of(want.raw), [-1] * want.raw.ndim)]
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]] == [
            (want.result_name, want.result_datatype, [-1, *want.results.shape[1:]])]
        with pytest.raises(InferenceServerException, match="not served here"):
            client.get_model_metadata("no-such-model")
        for indices in (BATCHED, *([i] for i in SINGLES)):
            want = expected[f"{model}/{tuple(indices)}"]
            tensor = tritongrpc.InferInput(want.input_name, list(want.raw.shape), datatype_of(want.raw))
            tensor.set_data_from_numpy(want.raw)
            for outputs in ([tritongrpc.InferRequestedOutput(want.result_name)], None):
                reply = client.infer(model, [tensor], outputs=outputs, request_id=f"req-{indices[0]}")
                assert reply.get_response().id == f"req-{indices[0]}"
                output = reply.get_output(want.result_name)
                assert (output.datatype, list(output.shape)) == (want.result_datatype, list(want.results.shape))
                np.testing.assert_array_equal(reply.as_numpy(want.result_name), want.results)
        with pytest.raises(InferenceServerException, match="requested output 'no-such-output'"):
            client.infer(model, [tensor], outputs=[tritongrpc.InferRequestedOutput("no-such-output")])
    finally:
        client.close()


# ---- 2. A third-party server: MLServer's null model driven by mlharness run --endpoint ----

# 500 queries at 250/s, judged at LoadGen's own 99th percentile: early stopping needs about 460 with none
# over the (generous) latency target; measured VALID at 239.6 samples/s over both transports, p99 7-10 ms.
MLSERVER_SERVER = ("--scenario", "Server", "--quick", "--set", "target_qps=250", "--set", "min_query_count=500",
                   "--set", "min_duration=1000", "--set", "target_latency=500")


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    if not server_available():
        pytest.skip(f"mlserver is not installed in {sys.executable}'s environment")
    with third_party_oip_server(tmp_path_factory.mktemp("mlserver")) as ports:
        yield ports


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_mlserver_null_model_under_loadgen_server_is_valid(transport: str, mlserver: tuple[str, str],
                                                           tmp_path: Path) -> None:
    """Our client's request is what MLServer's null model declares (INT64 [batch]: null-samples' indices):
    a datatype or shape it does not declare is refused, and the first refusal fails the run."""
    http, grpc = mlserver
    endpoint = (["--endpoint", f"grpc://{grpc}"] if transport == "grpc"
                else ["--endpoint", f"http://{http}", "--set", "endpoint_binary=false"])  # MLServer: no binary extension
    run_new(tmp_path, "null", *MLSERVER_SERVER, *endpoint)
    record = newest_run(tmp_path, "null", "Server")
    performance = record["performance"]
    assert (record["status"], performance["result"]) == ("ok", "VALID"), performance["raw"]
    assert performance["completed_samples_per_second"] > 0
    sut = record["loadgen"]["performance"]["sut"]
    assert sut["server"] == "mlserver 1.7.1" and sut["protocol"] == transport
    assert sut["binary_tensors"] is (False if transport == "http" else None)
    assert sut["network"]["requests"] >= 500
    assert (sut["network"]["failed_samples"], sut["network"]["unsent_samples"]) == (0, 0)


# ---- 3. mlharness serve driven by mlharness run --endpoint ----

# resnet50-light answers in 150-250 ms on the busy 2-core machine (about 8 samples/s at batch 8), judged at
# the 50th percentile (see the module's docstring). Measured VALID over both transports: Offline 7.9-8.2
# samples/s, SingleStream p50 147-201 ms, Server 3.6-3.7 samples/s with p50 157-232 ms. The Server run's
# bound is not the speed's: with both cores held by busy loops the server answered 2.2 samples/s, p50 2.07 s,
# over the 2 s bound this had. Its 12 queries arrive in 3 s, so the 6th waits about 6/r - 1.5 s at r samples/s:
# within 30 s on any server faster than 0.2 samples/s.
RESNET_RUNS = {
    "Offline": ("--set", "target_qps=40", "--set", "min_duration=500"),
    "SingleStream": ("--set", "min_duration=1000", "--set", "min_query_count=16",
                     "--set", "target_latency_percentile=50"),
    "Server": ("--set", "target_qps=4", "--set", "target_latency=30000", "--set", "target_latency_percentile=50",
               "--set", "min_duration=1000", "--set", "min_query_count=12"),
}


@pytest.mark.parametrize("scenario", RESNET_RUNS)
@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_resnet50_light_through_mlharness_serve_is_valid(transport: str, scenario: str, servers: ServerPool,
                                                         tmp_path: Path) -> None:
    served = servers.get("resnet50-light")
    endpoint = served.grpc if transport == "grpc" else served.http
    run_new(tmp_path, "resnet50-light", "--scenario", scenario, "--quick", *RESNET_RUNS[scenario],
            "--endpoint", endpoint)
    record = newest_run(tmp_path, "resnet50-light", scenario)
    performance = record["performance"]
    assert (record["status"], performance["result"]) == ("ok", "VALID"), performance["raw"]
    sut = record["loadgen"]["performance"]["sut"]
    assert (sut["issue_path"], sut["endpoint"], sut["platform"]) == ("network", endpoint, "onnxruntime")
    assert sut["server"].startswith("mlharness ")
    assert (sut["network"]["failed_samples"], sut["network"]["unsent_samples"]) == (0, 0)
    # The server's own timings came back with every answer: it ran the model (preprocess included).
    assert sut["network"]["server_timings"]["infer_us"]["p50"] > 0
    assert sut["network"]["server_timings"]["preprocess_us"]["p50"] > 0


def _accuracy_log(record: dict) -> dict[int, str]:
    """Each sample's result bytes (hex) from the run's LoadGen accuracy log."""
    log = Path(record["results_path"]) / "accuracy" / "mlperf_log_accuracy.json"
    return {entry["qsl_idx"]: entry["data"] for entry in json.loads(log.read_text())}


def _accuracy_run(results: Path, model: str, *args: str) -> dict:
    run_new(results, model, "--scenario", "Offline", "--mode", "accuracy", *args)
    record = newest_run(results, model, "Offline")
    assert record["status"] == "ok", record["error"]
    return record


MOBILENET = ("mobilenet-v2", "--backend", "onnxruntime")


@pytest.fixture(scope="module")
def mobilenet_in_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _accuracy_run(tmp_path_factory.mktemp("in-process"), *MOBILENET)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_accuracy_through_mlharness_serve_equals_in_process(transport: str, servers: ServerPool,
                                                            mobilenet_in_process: dict, tmp_path: Path) -> None:
    """mobilenet-v2 (ONNX Runtime) on the 20 labelled imagenet-samples: the run through the server passes
    the same reference as the run in this process, with the same accuracy and every sample's top-5 equal."""
    served = servers.get(*MOBILENET)
    record = _accuracy_run(tmp_path, *MOBILENET, "--endpoint", served.grpc if transport == "grpc" else served.http)
    here, there = mobilenet_in_process["accuracy"], record["accuracy"]
    assert (here["verdict"], there["verdict"]) == ("PASS", "PASS")
    assert there["reference"] == here["reference"] and "mobilenet-v2.imagenet-samples.onnxruntime" in there["reference"]
    assert there["values"] == here["values"] == {"top1": 0.9, "top5": 1.0}
    assert [(c["name"], c["pass"]) for c in there["checks"]] == [(c["name"], c["pass"]) for c in here["checks"]]
    assert record["loadgen"]["accuracy"]["sut"]["issue_path"] == "network"
    served_log, local_log = _accuracy_log(record), _accuracy_log(mobilenet_in_process)
    assert sorted(served_log) == list(range(20)) and served_log == local_log


def test_scalar_samples_reach_the_served_preprocess_as_scalars(specs_copy: Path, tmp_path: Path) -> None:
    """null-samples' raw samples are Python ints. The client sends a batch of them as INT64 [N], as the
    server's metadata declares, and the served preprocess gets each as the scalar a run in this process
    gets: a torch Linear(1, 3) fed `np.array([sample % 2])` answers [N, 3] (it answered [N, 1, 3] and
    every request failed when the client sent a scalar as [1, 1]). Seeded, so both processes build the same
    weights: its scores through the server equal the in-process run's, sample by sample, to float32 rounding
    (the server batches other samples together)."""
    manifest = linear_torch_model("linear-scalars")
    assert manifest.count("return torch.nn.Sequential(") == 1
    write_manifest(specs_copy / "models", "linear-scalars.yaml",
                   manifest.replace("return torch.nn.Sequential(", "torch.manual_seed(0); return torch.nn.Sequential("))
    limit = ("--set", "dataset_limit=64")
    local = _accuracy_run(tmp_path / "here", "linear-scalars", *limit)
    with mlharness_serve("linear-scalars", cwd=tmp_path) as served:
        through = _accuracy_run(tmp_path / "there", "linear-scalars", *limit, "--endpoint", served.grpc)
    assert through["accuracy"]["values"] == local["accuracy"]["values"]
    served_log, local_log = _accuracy_log(through), _accuracy_log(local)
    assert sorted(served_log) == sorted(local_log) == list(range(64))
    scores = {i: [np.frombuffer(bytes.fromhex(log[i]), np.float32) for log in (served_log, local_log)] for i in local_log}
    for i, (served_scores, local_scores) in scores.items():
        assert served_scores.shape == (3,), f"sample {i}"
        np.testing.assert_allclose(served_scores, local_scores, rtol=0, atol=1e-6, err_msg=f"sample {i}")


def test_the_client_works_beside_tritonclient_in_one_process() -> None:
    """tritonclient (like mlserver and kserve) registers the protocol's `inference.*` messages in
    protobuf's default pool; mlharness' own are in a pool of their own, so both load in one process."""
    code = ("import tritonclient.grpc\nfrom mlharness.sut.network import oip_grpc\n"
            "request = oip_grpc.messages().ModelInferRequest(model_name='m', id='1')\n"
            "print(type(request).FromString(request.SerializeToString()).model_name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "m", done.stderr[-2000:]
