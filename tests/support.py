"""Helpers the tests share (an importable module, so `pytest` and `python -m pytest` collect alike):
run the real CLI in-process, read results, write manifests."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import shutil
import socket
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from mlharness.cli import main

if TYPE_CHECKING:
    import psutil

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> int:
    return main([str(a) for a in args])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scenario_root(results: Path, model: str, scenario: str) -> Path:
    """results/<system>/<model>/<Scenario> (there is one system per machine)."""
    matches = list(results.glob(f"*/{model}/{scenario}"))
    assert len(matches) == 1, f"expected one scenario dir, found {matches}"
    return matches[0]


def read_run(results: Path, model: str, scenario: str) -> dict:
    return json.loads((scenario_root(results, model, scenario) / "run.json").read_text())


def write_manifest(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def write_blank_prompt_dataset(folder: Path, name: str) -> Path:
    """A dataset manifest `name` of two prompts, the second ('  ', item 1) without words."""
    return write_manifest(folder, f"{name}.yaml", f"""\
        kind: dataset
        name: {name}
        version: 1.0.0
        sample_count: 2
        samples: |
          def samples(ctx):
              return [("Say yes.", "positive"), ("  ", "negative")]
        evaluation: {{metric: exact_match}}
        """)


def newest_run(results: Path, model: str, scenario: str) -> dict:
    """The record of the newest ok run of a model and scenario, from its own folder (runs/<run id>/)."""
    files = sorted(scenario_root(results, model, scenario).glob("runs/*/run.json"))
    assert files, f"no runs of {model} {scenario} under {results}"
    return json.loads(files[-1].read_text())


def copy_specs(dest: Path) -> Path:
    """A copy of the shipped specs/ at `dest`, for tests that add or edit manifests (point
    MLHARNESS_SPECS at it; tests/conftest.py's `specs_copy` fixture does both)."""
    shutil.copytree(REPO / "specs", dest)
    return dest


def run_ids(results: Path) -> set[str]:
    """Ids of the runs stored in a results directory's database (none when it has no database)."""
    from mlharness.store.result_store import ResultStore

    if not (results / "mlharness.sqlite").exists():
        return set()
    with ResultStore(results / "mlharness.sqlite") as store:
        return {row["run_id"] for row in store.list_runs()}


def run_new(results: Path, *args: str | Path) -> str:
    """`mlharness run ARGS --results-dir RESULTS`, which must succeed; the id of the run it stored.
    Taken from the database, not the folders: two runs can start within the same clock tick."""
    before = run_ids(results)
    assert run_cli("run", *args, "--results-dir", results) == 0
    (new,) = run_ids(results) - before
    return new


NULL_OFFLINE = ("null", "--scenario", "Offline", "--quick")


def null_offline_pair(results: Path, *extra: str) -> dict[str, str]:
    """A null Offline --quick performance run and an accuracy run into `results`: their run ids."""
    return {"performance": run_new(results, *NULL_OFFLINE, *extra),
            "accuracy": run_new(results, *NULL_OFFLINE, "--mode", "accuracy", *extra)}


def failing_null_model(name: str = "flaky", *, bad_sample: int = -1, postprocess_calls: int = 10**9) -> str:
    """A null-backend model manifest whose preprocess raises ValueError("cannot read this one") for
    `bad_sample` and whose postprocess raises RuntimeError("postprocess blew up") once it has
    returned `postprocess_calls` batches; one sample per batch."""
    return textwrap.dedent(f"""\
        kind: model
        name: {name}
        version: 1.0.0
        framework: {{name: "null"}}
        dataset: null-samples
        inputs: [{{name: x, type: tensor, element_type: float32, shape: [batch, 1]}}]
        outputs: [{{name: scores, type: scores, element_type: float32, shape: [batch, 10]}}]
        preprocess: |
          import numpy as np
          def preprocess(sample, ctx):
              if sample == {bad_sample}:
                  raise ValueError("cannot read this one")
              return np.array([sample], dtype=np.float32)
        postprocess: |
          def postprocess(outputs, ctx):
              if ctx.cache.setdefault("calls", 0) >= {postprocess_calls}:
                  raise RuntimeError("postprocess blew up")
              ctx.cache["calls"] += 1
              return outputs["scores"]
        attributes:
          max_batch_size: 1
          settings: {{Offline: {{target_qps: 2000}}, Server: {{target_qps: 500}}, SingleStream: {{target_latency: 0.05}}}}
        accuracy: {{metric: topk, k: [1]}}
        """)


def smollm2_first_prompts_reference(folder: Path, name: str, backend: str) -> Path:
    """A reference log for smollm2-135m on `backend` over the first few polarity prompts: exact_match
    at least 0.99 x 0.5 (MLPerf's one-sided rule) and the token ids both engines generate for samples 0
    and 1, as the LLM tests expect them."""
    return write_manifest(folder, "reference.yaml", f"""\
        kind: reference
        name: {name}
        version: 1.0.0
        model: {{name: smollm2-135m, version: 1.0.0}}
        dataset: {{name: pang-lee-polarity-prompts, version: 1.0.0}}
        backend: {backend}
        accuracy:
          exact_match: {{expected: 0.5, min_fraction: 0.99}}
        outputs:
          - {{sample: 0, values: [16185, 2], atol: 0}}
          - {{sample: 1, values: [16185, 2], atol: 0}}
        """)


def tiny_torch_model(name: str = "tiny-cnn") -> str:
    """A PyTorch model manifest built in code (no weights file): a linear lift, a 3x3 convolution
    and a linear head, seeded, over the null-samples dataset; batches of up to 8."""
    return textwrap.dedent(f"""\
        kind: model
        name: {name}
        version: 1.0.0
        framework: {{name: torch, version: ">=2.0"}}
        dataset: null-samples
        inputs: [{{name: x, type: tensor, element_type: float32, shape: [batch, 1]}}]
        outputs: [{{name: y, type: scores, element_type: float32, shape: [batch, 10]}}]
        sources:
          module:
            factory: |
              import torch
              class TinyCNN(torch.nn.Module):
                  def __init__(self):
                      super().__init__()
                      torch.manual_seed(0)
                      self.lift = torch.nn.Linear(1, 3 * 16 * 16)
                      self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
                      self.head = torch.nn.Linear(8, 10)
                  def forward(self, x):
                      h = torch.relu(self.conv(self.lift(x).view(-1, 3, 16, 16)))
                      return self.head(h.mean(dim=(2, 3)))
              def factory(ctx):
                  return TinyCNN()
        preprocess: |
          import numpy as np
          def preprocess(sample, ctx):
              return np.array([sample % 7], dtype=np.float32)
        attributes:
          max_batch_size: 8
          settings: {{Offline: {{target_qps: 2000}}}}
        accuracy: {{metric: topk, k: [1]}}
        """)


def linear_torch_model(name: str, *, sources: str = "", target_qps: int = 500, accuracy: bool = True) -> str:
    """A PyTorch model manifest built in code: one Linear(1, 3) over null-samples, fed the label
    (sample % 2), batches of up to 16. `sources` replaces the factory source (a `torchscript: ...`
    line, say) or, starting with `weights:`, is added beside it (one line each, no indent)."""
    factory = ("module:\n  factory: |\n    import torch\n    def factory(ctx):\n"
               "        return torch.nn.Sequential(torch.nn.Linear(1, 3))")
    module = sources if sources.startswith("torchscript:") else "\n".join(filter(None, (factory, sources)))
    lines = [
        "kind: model", f"name: {name}", "version: 1.0.0", 'framework: {name: torch, version: ">=2.0"}',
        "dataset: null-samples",
        "inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]",
        "outputs: [{name: y, type: scores, element_type: float32, shape: [batch, 3]}]",
        "sources:", textwrap.indent(module, "  "),
        "preprocess: |", "  import numpy as np", "  def preprocess(sample, ctx):",
        "      return np.array([sample % 2], dtype=np.float32)",
        "attributes:", "  max_batch_size: 16", f"  settings: {{Offline: {{target_qps: {target_qps}}}}}",
    ]
    return "\n".join(lines + (["accuracy: {metric: topk, k: [1]}"] if accuracy else [])) + "\n"


def null_model_with(folder: Path, *, preprocess: str | None = None, postprocess: str | None = None,
                    name: str = "null", benchmark: str | None = None) -> Path:
    """The shipped null model with other code (same name unless told, so it publishes where a null run
    does) and naming `benchmark` as its mlperf_benchmark if given, written under a name of its own text
    so two variants never overwrite each other."""
    text = (REPO / "specs" / "models" / "null.yaml").read_text()
    if preprocess is not None:
        start, end = text.index("preprocess: |"), text.index("attributes:")
        text = text[:start] + "preprocess: |\n" + yaml_block(preprocess) + text[end:]
    if postprocess is not None:
        text = text.replace("attributes:", "postprocess: |\n" + yaml_block(postprocess) + "attributes:", 1)
    if benchmark is not None:
        text = text.replace("attributes:", f"mlperf_benchmark: {benchmark}\nattributes:", 1)
    text = text.replace('name: "null"', f'name: "{name}"', 1)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    path.write_text(text)
    return path


def yaml_block(code: str) -> str:
    """Code as the body of a YAML block scalar under a top-level key."""
    return "".join(f"  {line}\n" for line in code.splitlines())


def sleeping_postprocess(seconds: float) -> str:
    """A postprocess that waits `seconds` per query: the null model's speed fixed by construction, with
    the CPU idle while it waits."""
    return f"import time\n\ndef postprocess(outputs, ctx):\n    time.sleep({seconds!r})\n    return outputs[\"scores\"]\n"


# An hour-long run of the null model slowed to 20 ms a query (the CPU idle while it waits): whatever ends
# it within a test's time was a stop, not its end. LoadGen generates its queries up front: an hour at
# 20 ms is 180,000 of them (the null model's own 100 million took a core and 3 GB until stopped).
HOUR_LONG_SETTINGS = ("min_duration=3600000", "min_query_count=1", "target_latency=20")
# A whole-run timeout for such a run, far above the ~1.2 s from start to a claimed run measured on 2
# busy cores, so the run is under way when it fires, however slow the start (the child's clock starts
# before its imports).
HOUR_LONG_TIMEOUT_S = 15


def hour_long_null(folder: Path) -> Path:
    """The null model of HOUR_LONG_SETTINGS: 20 ms a query, as its target_latency says."""
    return null_model_with(folder, postprocess=sleeping_postprocess(0.02))


def wait_for(happened: Callable[[], bool], what: str, timeout: float = 60, poll: float = 0.02) -> None:
    """Wait for an event; the deadline only fails a test whose event never comes (never a verdict on speed)."""
    deadline = time.monotonic() + timeout
    while not happened():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(poll)


def ended(process: "psutil.Process") -> bool:
    """Gone, or a zombie nobody reaped yet (as the harness counts an owner)."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def mllog_line(key: str, value: object, **metadata: bool) -> str:
    """One line of a LoadGen detail log (`:::MLLOG {...}`), with metadata flags such as is_error=True."""
    return f":::MLLOG {json.dumps({'key': key, 'value': value, 'metadata': metadata})}\n"


def detail_log(path: Path, scenario: str, key: str, value: object, valid: bool = True) -> Path:
    """A detail log with the three values a compliance verdict reads: the scenario, the validity and `key`."""
    path.write_text(mllog_line("effective_scenario", scenario)
                    + mllog_line("result_validity", "VALID" if valid else "INVALID") + mllog_line(key, value))
    return path


# An in-process LoadGen test (the LLM SUT's) takes seconds; past this it has lost a response.
LOADGEN_HANG_SECONDS = 30


@contextmanager
def loadgen_hang_guard(seconds: float = LOADGEN_HANG_SECONDS) -> Iterator[None]:
    """Around an in-process LoadGen test: a query the SUT never completes keeps LoadGen waiting in
    this process for ever, and nothing in Python can stop it. Past `seconds` (many times the test's
    own length) every thread's stack is dumped and the process ends, so the test fails at once
    instead of at the suite's per-test timeout (a mutant that loses a response dies in seconds)."""
    import faulthandler

    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def token_mode_settings(scenario: str, queries: int, outdir: Path, *, min_duration_ms: int = 0,
                        single_stream_latency_ns: int = 1_000_000, offline_qps: float = 1000,
                        log_every_response: bool = False, trace: bool = False):
    """LoadGen's (TestSettings, LogSettings) for an in-process performance test in token mode of at
    least `queries` queries in `scenario` (Server at 100 a second), its logs in `outdir`; every
    response in the accuracy log, with its first token's, where asked."""
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario, settings.mode = getattr(lg.TestScenario, scenario), lg.TestMode.PerformanceOnly
    settings.use_token_latencies = True
    settings.min_duration_ms, settings.min_query_count = min_duration_ms, queries
    settings.single_stream_expected_latency_ns = single_stream_latency_ns
    settings.offline_expected_qps = offline_qps
    settings.server_target_qps = 100
    if log_every_response:
        settings.accuracy_log_probability = 1.0
    log = lg.LogSettings()
    log.log_output.outdir = str(outdir)
    log.enable_trace = trace
    return settings, log


def answer_of_child(method: str, target: Callable[..., None], *args: Any, seconds: float) -> Any:
    """What `target(*args, pipe)` sends through `pipe`, run in a process of its own that multiprocessing
    starts by `method` ("spawn" or "forkserver": never a fork of a test's process, which inherits LoadGen's
    configuration and a torch test's missing OpenMP pool). The wait is bounded by `seconds`; a child that
    dies without answering fails at once, with its exit code; one that outlives its answer is killed."""
    context = multiprocessing.get_context(method)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=target, args=(*args, send))
    child.start()
    send.close()  # the child's end only: a child that dies unanswered ends the wait (EOF)
    answered = ended = False
    answer = None
    try:
        if receive.poll(seconds):
            answer, answered = receive.recv(), True
    except EOFError:  # the child closed its end without answering: it ended, or is ending
        ended = True
    finally:
        child.join(seconds if answered or ended else 0)
        if child.is_alive():
            child.kill()
            child.join()
    assert answered or ended, f"the child process answered nothing in {seconds} s (killed)"
    assert answered, f"the child process ended without answering (exit code {child.exitcode})"
    return answer


@contextmanager
def unanswered_port() -> Iterator[int]:
    """A port on 127.0.0.1 that never answers a connection (as behind a firewall that drops): Linux drops the
    connection request to a listening socket whose queue is full, so the queue is filled first, until a
    connection is no longer taken. A connection attempt there waits for its own timeout or TCP's retries."""
    import pytest

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued: list[socket.socket] = []
        try:
            for _ in range(16):
                client = socket.socket()
                queued.append(client)
                client.settimeout(0.5)
                try:
                    client.connect(("127.0.0.1", port))
                except socket.timeout:
                    break
            else:
                pytest.fail("the listening socket's queue never filled")
            yield port
        finally:
            for client in queued:
                client.close()
