"""A real third-party Open Inference Protocol (KServe v2) server for the tests: Seldon MLServer 1.7.1 serving a
`null` model, so our OIP clients are checked against someone else's implementation, not only `mlharness serve`.
Its input is what `mlharness run null --endpoint ...` sends: the null-samples dataset's raw sample (an index, a
Python int) as INT64, one per request, so shape [1] (a batch of scalars is [N]); it refuses anything else.

Findings (scratch venvs on Python 3.11, ray[default]==2.60.0 and pydantic>=2.9,<3 installed first):

* Chosen: `mlserver==1.7.1`. `kserve==0.21.0` also installs, but it is heavier (+349 MB vs +240 MB, pulls
  kubernetes, grpcio-tools, cloudevents, pillow, fastapi 0.165/starlette 1.x), pins psutil<6 (downgrades
  a newer psutil), and hard-codes its listen addresses (HTTP 0.0.0.0, gRPC [::]); MLServer binds its HTTP,
  gRPC and metrics listeners to `host` (127.0.0.1 here) and can switch metrics and worker pools off.
* `pip install mlserver==1.7.1` next to ray 2.60.0: `pip check` clean; ray, pydantic (2.14.4), grpcio
  (1.85.3) and numpy unchanged; **protobuf goes 7.36.2 -> 6.33.6** (mlserver, like kserve and
  tritonclient[grpc], requires protobuf<7; onnx 1.23.2 needs >=6.31.1, ray >=3.20.3, so 6.33.6 satisfies all).
  40 packages added (gevent, aiokafka, opentelemetry instrumentation, pandas, fastapi 0.115.14, starlette
  0.46.2, uvicorn, uvloop, tritonclient[http] 2.73.0, ...). About 14 s to install from the local indexes.
  (MLServer 1.7.1 also ran HTTP and gRPC fine with protobuf 7.36.2 forced in, but pip then reports a conflict.)
* Ready on /v2/health/ready about 0.9-1.8 s after the process starts (2 noisy cores); SIGTERM exits in 0.5-2 s.
* HTTP JSON infer works. Triton's binary tensor extension over HTTP: **not supported** (a body with
  `Inference-Header-Content-Length` is answered 422, and `binary_data_output` is ignored: outputs come back
  as JSON `data`), so drive it over HTTP with binary off.
* gRPC (inference.GRPCInferenceService) works on its own port; the reply mirrors the request: tensors sent
  in `raw_input_contents` come back in `raw_output_contents`, typed `contents` come back typed.
* Gotchas handled below: gRPC binds after HTTP is already answering ready (and a failed gRPC bind then exits
  the process), so readiness also waits for the "gRPC server running on" log line; `parallel_workers: 0`
  keeps inference in the one process (no worker pool, no `.metrics`/`.envs` folders written; the default pool of
  1 worker crash-loops here: uvloop's get_event_loop raises in the worker); `metrics_endpoint:
  null` turns off the extra metrics listener (default port 8082); `gzip_enabled: false` keeps replies
  uncompressed; MLServer reads MLSERVER_* environment variables and a `.env` in its working directory, so the
  child gets neither. A folder argument MLServer cannot find (a relative path, resolved against its cwd) is not an
  error: it silently runs defaults (0.0.0.0:8080/8081/8082, no models), hence the absolute path. gRPC listens
  with SO_REUSEPORT (grpcio's default), so a port clash with another gRPC server may go unnoticed; ports are
  fresh per start, and a start that loses a port race (the server exits on a failed bind) is retried.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# Added to the project's test extra: the server itself (it brings tritonclient[http] and protobuf<7 along).
THIRD_PARTY_PINS: list[str] = ["mlserver==1.7.1"]

MODEL_NAME = "null"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
_START_ATTEMPTS = 3  # fresh ports each time: a port picked free can be taken before the server binds it
_BIND_FAILURES = ("address already in use", "Failed to bind")

# The model MLServer imports from the model folder: input `x` INT64 [-1] in (the null-samples dataset's indices, as
# our client sends them), `scores` FP32 [-1, 1000] zeros out. MLServer itself checks neither datatype nor shape
# against model-settings.json, so the model does: a client that sends other than it declares is refused (400).
_MODEL_CODE = '''\
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse


class NullModel(MLModel):
    """Answers every batch with zeros, so tests measure the protocol and not a model."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = next((t for t in payload.inputs if t.name == "x"), None)
        if x is None or x.datatype != "INT64" or len(x.shape) != 1:
            got = f"{x.datatype} {list(x.shape)}" if x is not None else [t.name for t in payload.inputs]
            raise MLServerError(f"expected input 'x' INT64 of shape [batch], got {got}", status_code=400)
        scores = np.zeros((int(x.shape[0]), 1000), dtype=np.float32)
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("scores", scores)])
'''


def server_available() -> bool:
    """Whether the server package is installed (tests skip with a reason when it is not)."""
    return importlib.util.find_spec("mlserver") is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_repository(root: Path, http_port: int, grpc_port: int) -> None:
    """settings.json (server) and null/model-settings.json + the model module: MLServer only reads files."""
    model_dir = root / MODEL_NAME
    model_dir.mkdir(parents=True, exist_ok=True)
    settings = {"debug": False, "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
                "metrics_endpoint": None, "parallel_workers": 0, "gzip_enabled": False,
                "load_models_at_startup": True}
    (root / "settings.json").write_text(json.dumps(settings, indent=1))
    model = {"name": MODEL_NAME, "implementation": "oip_null_model.NullModel", "parallel_workers": 0,
             "inputs": [{"name": "x", "datatype": "INT64", "shape": [-1]}],
             "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 1000]}]}
    (model_dir / "model-settings.json").write_text(json.dumps(model, indent=1))
    (model_dir / "oip_null_model.py").write_text(_MODEL_CODE)


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _http_ready(http_port: int) -> bool:
    for path in ("/v2/health/ready", f"/v2/models/{MODEL_NAME}/ready"):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=2) as reply:
                if reply.status != 200:
                    return False
        except (urllib.error.URLError, OSError):
            return False
    return True


def _exited(pid: int, timeout_s: float) -> bool:
    """Wait up to timeout_s for pid to exit without reaping it, so its pid (and process group id) stays ours."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # already reaped
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM by pid, SIGKILL after STOP_TIMEOUT_S; then anything left in the process group it leads
    (start_new_session; none with parallel_workers 0), before the pid is reaped and could be reused."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        if not _exited(proc.pid, STOP_TIMEOUT_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            _exited(proc.pid, STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STOP_TIMEOUT_S)


def _start(root: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """One start on fresh ports; returns once HTTP says ready and gRPC has bound, or raises."""
    http_port, grpc_port = _free_port(), _free_port()
    while grpc_port == http_port:
        grpc_port = _free_port()
    _write_repository(root, http_port, grpc_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLSERVER")}
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-c", "import sys; from mlserver.cli import main; sys.exit(main())", "start", str(root)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    grpc_line = f"gRPC server running on http://127.0.0.1:{grpc_port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if _exited(proc.pid, 0):
                raise _StartFailed(_tail(log))
            if grpc_line in log.read_text(errors="replace") and _http_ready(http_port) and not _exited(proc.pid, 0):
                return proc, http_port, grpc_port
            time.sleep(0.1)
        raise RuntimeError(f"MLServer not ready on 127.0.0.1:{http_port} (gRPC {grpc_port}) within "
                           f"{READY_TIMEOUT_S:.0f} s; last log lines ({log}):\n{_tail(log)}")
    except BaseException:
        _stop(proc)
        raise


class _StartFailed(RuntimeError):
    def __init__(self, tail: str):
        super().__init__(f"MLServer exited before it was ready; last log lines:\n{tail}")
        self.port_race = any(marker in tail for marker in _BIND_FAILURES)


@contextlib.contextmanager
def third_party_oip_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """MLServer serving the `null` model on 127.0.0.1: yields ("127.0.0.1:HTTP", "127.0.0.1:GRPC") once both
    listen, and stops the server by its pid on exit. Files (settings, model code, mlserver.log) go to tmp_path."""
    if not server_available():
        raise RuntimeError(f"mlserver is not installed in {sys.executable}'s environment ({THIRD_PARTY_PINS[0]})")
    base = Path(tmp_path).resolve()  # absolute: MLServer resolves the folder argument against its own cwd (root)
    root = base / "oip-mlserver"
    root.mkdir(parents=True, exist_ok=True)
    log = base / "mlserver.log"
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            proc, http_port, grpc_port = _start(root, log)
            break
        except _StartFailed as exc:
            if not exc.port_race or attempt == _START_ATTEMPTS:
                raise
    try:
        yield f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    finally:
        _stop(proc)
