"""`mlharness serve` started by a test: a real server on 127.0.0.1 (any free ports), ready when its
own line says where it listens (no sleeps), stopped by its own pid (SIGTERM, then SIGKILL after a
bound), its stderr kept for assertions."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

READY = re.compile(r"mlharness serve: serving .* at (?P<where>.+)$")
START_BOUND_S = 180.0  # a model load on a loaded 2-core machine; a bound, never a verdict


@dataclass
class Served:
    process: subprocess.Popen
    http: str | None
    grpc: str | None
    log: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None

    def read_log(self) -> str:
        """Everything the server wrote to stderr so far (after it stops: everything)."""
        return "".join(self.log)

    def stop(self) -> int:
        return stop_process(self.process, self.log, self.drain)


def stop_process(process: subprocess.Popen, log: list[str], drain: threading.Thread | None = None,
                 grace_s: float = 30.0) -> int:
    """SIGTERM by its pid, wait (bounded), SIGKILL if still there; the rest of its stderr into `log`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if drain is not None:
        drain.join(10)
    elif process.stderr is not None and not process.stderr.closed:
        log.append(process.stderr.read() or "")
    return process.returncode


def _drain(process: subprocess.Popen, log: list[str]) -> None:
    """Keep reading the server's stderr so that its log lines never fill the pipe and block it."""
    assert process.stderr is not None
    for line in process.stderr:
        log.append(line)


@contextmanager
def mlharness_serve(model: str, *args: str, http: bool = True, grpc: bool = True, cwd: Path | None = None,
                    env: dict[str, str] | None = None) -> Iterator[Served]:
    command = [sys.executable, "-m", "mlharness.cli", "serve", model, *args]
    if http:
        command += ["--http", "127.0.0.1:0"]
    if grpc:
        command += ["--grpc", "127.0.0.1:0"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd,
                               env=env or dict(os.environ), start_new_session=True)
    served = Served(process, None, None)
    try:
        where = _wait_ready(process, served.log)
        served.http = next((w for w in where if w.startswith("http://")), None)
        served.grpc = next((w for w in where if w.startswith("grpc://")), None)
        served.drain = threading.Thread(target=_drain, args=(process, served.log), daemon=True)
        served.drain.start()
        yield served
    finally:
        stop_process(process, served.log, served.drain)


def read_until(process: subprocess.Popen, log: list[str], pattern: re.Pattern[str], bound_s: float) -> re.Match[str] | None:
    """The first line of the process's stderr matching `pattern`, None if it ended first or `bound_s` s
    passed (a bound, never a verdict). Lines are read by a thread with the pipe's own readline: a select()
    on the pipe beside a buffered readline misses lines already in the buffer (two lines written at once,
    the second never seen, as a loaded machine showed). What follows the match stays in the pipe's buffer."""
    assert process.stderr is not None
    found: list[re.Match[str]] = []

    def read() -> None:
        for line in process.stderr:
            log.append(line)
            match = pattern.search(line.strip())
            if match:
                found.append(match)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(bound_s)
    if reader.is_alive():  # still waiting: stopping the process ends its pipe, and the reader (its drain) with it
        stop_process(process, log, reader)
    return found[0] if found else None


def _wait_ready(process: subprocess.Popen, log: list[str]) -> list[str]:
    match = read_until(process, log, READY, START_BOUND_S)
    if match:
        return match["where"].split()
    stop_process(process, log)
    raise AssertionError(f"mlharness serve did not start (exit {process.returncode}): {''.join(log)[-2000:]}")


# ---- what the fault tests share (tests/test_network_faults.py, tests/test_openai_faults.py) ----

RUN_BOUND_S = 180.0  # a bound on any one `mlharness run` (a hang fails the test), never a verdict
REPO = Path(__file__).resolve().parent.parent


def checkout_env() -> dict[str, str]:
    """This checkout first on the path (the fake server is this file run as a script)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))


def wait_line(process: subprocess.Popen, log: list[str], pattern: re.Pattern[str], bound_s: float) -> re.Match[str]:
    """The first line of the process's stderr that matches `pattern` (at most `bound_s` seconds)."""
    match = read_until(process, log, pattern, bound_s)
    if match is None:
        raise AssertionError(f"no line matching {pattern.pattern!r} (exit {process.poll()}): {''.join(log)[-2000:]}")
    return match


def finish(process: subprocess.Popen, bound_s: float = RUN_BOUND_S) -> tuple[int, str]:
    """(exit status, stderr); a run still going after `bound_s` is a hang: killed (its group), failed."""
    try:
        _, err = process.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        raise AssertionError(f"the run hung (killed after {bound_s:g} s): {err[-2000:]}") from None
    return process.returncode, err


def error_line(err: str) -> str:
    """A failed command's stderr: exactly one line, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    return lines[0]


def kept_folder(line: str) -> Path:
    """The failed run's folder the error names (`logs kept in ...`): its run.json says failed."""
    match = re.search(r"\(logs kept in (\S+)\)", line)
    assert match, line
    folder = Path(match[1])
    assert folder.name.startswith("failed-") and folder.is_dir(), folder
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "failed" and record["error"] in line
    return folder


def free_port() -> int:
    """A port nothing listens on: bound and closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def fake_server(command: list[str], ready: re.Pattern[str], bound_s: float
                ) -> Iterator[tuple[subprocess.Popen, re.Match[str], list[str]]]:
    """A test's own misbehaving server (a script run as `command`): (its process, its ready line's match,
    its stderr lines so far and to come), stopped by its pid on the way out."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=checkout_env(), start_new_session=True)
    log: list[str] = []
    drain = None
    try:
        match = wait_line(process, log, ready, bound_s)
        # Keep reading its stderr (its lines say which requests it spoiled; a full pipe would block it).
        drain = threading.Thread(target=lambda: log.extend(iter(process.stderr.readline, "")), daemon=True)
        drain.start()
        yield process, match, log
    finally:
        stop_process(process, log, drain, grace_s=10.0)
