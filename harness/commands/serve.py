"""`mlharness serve MODEL`: the model served over the Open Inference Protocol (docs/network.md)."""
from __future__ import annotations

import argparse
import asyncio

from mlharness.errors import UserError


def cmd_serve(args: argparse.Namespace) -> int:
    from mlharness.running.runner import _harness_options, check_device, prepare_settings, resolve_manifests
    from mlharness.running.request import RunRequest
    from mlharness.serving.server import ServeOptions, probe_raw_sample, serve
    from mlharness.sut.served_model import load_served_model

    if not args.http and not args.grpc:
        raise UserError("mlharness serve: give --http HOST:PORT, --grpc HOST:PORT or both")
    if not args.max_queue_delay_ms >= 0:
        raise UserError(f"--max-queue-delay-ms: expected a number >= 0, got {args.max_queue_delay_ms}")
    request = RunRequest(model=args.model, scenario="Server", backend=args.backend, hardware=args.hardware,
                         overrides=tuple(args.set or ()))
    model, backend_name, dataset, hardware, _, _ = resolve_manifests(request)
    if model.generation is not None:
        raise UserError(f"{model.path}: a generative model; mlharness serve takes tensor models (the Open Inference Protocol)")
    check_device(backend_name, hardware)
    options = _harness_options(prepare_settings(request, model), model)
    served = load_served_model(model, hardware, backend_name, options)
    raw = probe_raw_sample(model, dataset) if model.preprocess else None
    try:
        asyncio.run(serve(served, args.name or model.name, raw,
                          ServeOptions(args.http, args.grpc, args.max_queue_delay_ms, args.max_body_mb)))
    finally:
        served.backend.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="serve a model over the Open Inference Protocol (HTTP and gRPC)")
    parser.add_argument("model", help="model manifest name or path")
    parser.add_argument("--http", metavar="HOST:PORT", help="listen for HTTP/REST here (port 0: any free port)")
    parser.add_argument("--grpc", metavar="HOST:PORT", help="listen for gRPC here (port 0: any free port)")
    parser.add_argument("--name", help="the model's name in the protocol (default: the manifest's name)")
    parser.add_argument("--backend", help="backend name (default: the model manifest's framework)")
    parser.add_argument("--hardware", default="cpu", help="hardware manifest (default: cpu)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a harness setting (max_batch_size, "
                                                                            "intra_op_threads, ...)")
    parser.add_argument("--max-queue-delay-ms", type=float, default=1.0,
                        help="longest wait for more requests to batch with the first (default 1 ms)")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body accepted (default 64)")
    parser.set_defaults(func=cmd_serve)
