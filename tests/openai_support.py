"""`mlharness serve MODEL --openai 127.0.0.1:0` started by a test: a real server, ready when its own line says
where it listens, stopped by its own pid (tests/network_support.py's helpers), its stderr kept."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from tests.network_support import _wait_ready, stop_process

LOG_BOUND_S = 30.0  # a bound on a log line's way through the pipe


@dataclass
class OpenAIServed:
    process: subprocess.Popen
    url: str = ""  # http://127.0.0.1:PORT/v1
    log: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None
    logged: threading.Condition = field(default_factory=threading.Condition)

    def read_log(self) -> str:
        return "".join(self.log)

    def wait_for_line(self, text: str, bound_s: float = LOG_BOUND_S) -> str:
        """The first line of the server's stderr that contains `text`, waited for (bounded)."""
        deadline = time.monotonic() + bound_s
        with self.logged:
            while True:
                line = next((line for line in self.log if text in line), None)
                if line is not None or not self.logged.wait(max(0.0, deadline - time.monotonic())):
                    break
        assert line is not None, f"no line with {text!r} in the server's log: {self.read_log()[-2000:]}"
        return line

    def stop(self) -> int:
        return stop_process(self.process, self.log, self.drain)


@contextmanager
def openai_serve(model: str, *args: str) -> Iterator[OpenAIServed]:
    command = [sys.executable, "-m", "mlharness.cli", "serve", model, *args, "--openai", "127.0.0.1:0"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ), start_new_session=True)
    served = OpenAIServed(process)
    try:
        where = _wait_ready(process, served.log)  # ["openai", "http://127.0.0.1:PORT/v1"]
        served.url = next(w for w in where if w.startswith("http://"))
        served.drain = threading.Thread(target=_drain, args=(served,), daemon=True)
        served.drain.start()
        yield served
    finally:
        stop_process(process, served.log, served.drain)


def _drain(served: OpenAIServed) -> None:
    """Keep reading the server's stderr (so that it never fills the pipe), telling waiters of each line."""
    assert served.process.stderr is not None
    for line in served.process.stderr:
        with served.logged:
            served.log.append(line)
            served.logged.notify_all()
