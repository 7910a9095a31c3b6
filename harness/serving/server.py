"""`mlharness serve`: load the model, then serve it over HTTP (uvicorn) and gRPC (grpc.aio) from one
event loop until SIGTERM or Ctrl-C; then stop taking requests, let those in flight finish (a bounded
grace), and exit. Once both listen, one line on stderr says where (`serving ... http://... grpc://...`):
what scripts and tests wait for."""
from __future__ import annotations

import asyncio
import signal
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlharness.errors import UserError, require
from mlharness.serving.batcher import DynamicBatcher
from mlharness.serving.protocol import input_meta, model_metadata
from mlharness.specs.endpoint import parse_endpoint

GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class ServeOptions:
    http: str | None  # HOST:PORT (port 0: any free one)
    grpc: str | None
    max_queue_delay_ms: float = 1.0
    max_body_mb: float = 64.0


def _address(text: str, flag: str, scheme: str) -> tuple[str, int]:
    """(host, port) to listen on; port 0 asks for any free one."""
    any_port = text.endswith(":0")
    checked = text[:-2] + ":1" if any_port else text
    endpoint = parse_endpoint(checked if "://" in checked else f"{scheme}://{checked}", flag)
    return endpoint.host, 0 if any_port else endpoint.port


def probe_raw_sample(model: Any, dataset: Any) -> np.ndarray | None:
    """One raw sample of the model's own dataset (what a client will send), for the input's metadata;
    None where the dataset cannot be loaded here."""
    try:
        from mlharness.sut.network.runtime import open_raw_samples

        samples, _ = open_raw_samples(model, dataset, 1)
        samples.load_samples([0])
        return samples.get(0)[0]  # as the client sends it, less the batch dim of one
    except Exception:  # noqa: BLE001 - only the metadata's datatype depends on it
        return None


async def serve(served: Any, name: str, raw_sample: np.ndarray | None, options: ServeOptions) -> None:
    uvicorn = require("uvicorn", "network", "mlharness serve over HTTP")
    grpc = require("grpc", "network", "mlharness serve over gRPC")
    from mlharness.serving.grpc_service import GrpcFront
    from mlharness.serving.http_app import HttpFront
    from mlharness.sut.network import oip_grpc

    loop = asyncio.get_running_loop()
    batcher = DynamicBatcher(served, options.max_queue_delay_ms, loop)
    inputs = input_meta(served, raw_sample)
    metadata = model_metadata(served, name, raw_sample)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    where: list[str] = []
    http_server = grpc_server = None
    try:
        if options.http:
            host, port = _address(options.http, "--http", "http")

            class QuietServer(uvicorn.Server):
                def capture_signals(self):  # noqa: ANN202 - ours handle SIGTERM/SIGINT for both servers
                    return nullcontext()

            front = HttpFront(name, served, batcher, inputs, metadata, int(options.max_body_mb * (1 << 20)))
            config = uvicorn.Config(front.app(), host=host, port=port, log_level="warning", access_log=False,
                                    lifespan="off", timeout_graceful_shutdown=int(GRACE_SECONDS))
            http_server = QuietServer(config)
            http_task = asyncio.create_task(http_server.serve())
            while not http_server.started:
                if http_task.done():
                    http_task.result()
                    raise UserError(f"--http {options.http}: the HTTP server did not start")
                await asyncio.sleep(0.01)
            bound = http_server.servers[0].sockets[0].getsockname()
            where.append(f"http://{host}:{bound[1]}")
        if options.grpc:
            host, port = _address(options.grpc, "--grpc", "grpc")
            grpc_server = grpc.aio.server(options=[("grpc.max_receive_message_length", int(options.max_body_mb * (1 << 20))),
                                                   ("grpc.so_reuseport", 0)])
            oip_grpc.add_servicer(
                GrpcFront(name, served, batcher, inputs, metadata), grpc_server)
            try:
                bound_port = grpc_server.add_insecure_port(f"{host}:{port}")
            except RuntimeError as exc:
                raise UserError(f"--grpc {options.grpc}: cannot listen there: {exc}") from None
            await grpc_server.start()
            where.append(f"grpc://{host}:{bound_port}")
        print(f"mlharness serve: serving {name} ({served.backend_name}, batch up to {served.max_batch_size}) at "
              f"{' '.join(where)}", file=sys.stderr, flush=True)
        await stop.wait()
        print("mlharness serve: stopping (requests in flight finish)", file=sys.stderr, flush=True)
    finally:
        if grpc_server is not None:
            await grpc_server.stop(GRACE_SECONDS)
        if http_server is not None:
            http_server.should_exit = True
            await http_task
        batcher.close()
