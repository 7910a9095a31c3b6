"""`mlharness serve MODEL`: a tensor model served over the Open Inference Protocol, a generative model
over the OpenAI API (--openai) (docs/network.md)."""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

from mlharness.errors import UserError

# --openai: a request's most tokens by default. The transformers engine's paged KV cache holds max_batch_size
# sequences of this many tokens (fp32: about 46 kB a token for SmolLM2-135M, 0.75 GB at 8 x 2048).
DEFAULT_SEQUENCE_TOKENS = 2048


def cmd_serve(args: argparse.Namespace) -> int:
    from mlharness.running.resolve import check_device, harness_options, prepare_settings, resolve_manifests
    from mlharness.running.request import RunRequest
    from mlharness.serving.server import ServeOptions, probe_raw_sample, serve
    from mlharness.sut.served_model import load_served_model

    if args.openai and (args.http or args.grpc):
        raise UserError("mlharness serve: --openai serves a generative model alone; it cannot be combined with "
                        "--http or --grpc")
    if not args.openai and not args.http and not args.grpc:
        raise UserError("mlharness serve: give --http HOST:PORT, --grpc HOST:PORT or both (a tensor model), or "
                        "--openai HOST:PORT (a generative model)")
    if not args.max_queue_delay_ms >= 0:
        raise UserError(f"--max-queue-delay-ms: expected a number >= 0, got {args.max_queue_delay_ms}")
    request = RunRequest(model=args.model, scenario="Server", backend=args.backend, hardware=args.hardware,
                         overrides=tuple(args.set or ()))
    model, backend_name, dataset, hardware, _, _ = resolve_manifests(request)
    if model.generation is not None and not args.openai:
        raise UserError(f"{model.path}: a generative model; serve it over the OpenAI API with --openai HOST:PORT")
    if model.generation is None and args.openai:
        raise UserError(f"{model.path}: not a generative model; --openai serves generative models (serve a tensor "
                        f"model with --http or --grpc)")
    check_device(backend_name, hardware)
    options = harness_options(prepare_settings(request, model), model)
    if args.openai:
        return serve_generative(args, model, backend_name, hardware, options)
    served = load_served_model(model, hardware, backend_name, options)
    raw = probe_raw_sample(model, dataset) if model.preprocess else None
    try:
        asyncio.run(serve(served, args.name or model.name, raw,
                          ServeOptions(args.http, args.grpc, args.max_queue_delay_ms, args.max_body_mb)))
    finally:
        served.backend.close()
    return 0


def serve_generative(args: argparse.Namespace, model: Any, backend_name: str, hardware: Any,
                     options: dict[str, Any]) -> int:
    from mlharness.serving.llm_engine import check_servable, load_backend
    from mlharness.serving.openai_app import OpenAIOptions, serve_openai
    from mlharness.serving.server import _address

    host, port = _address(args.openai, "--openai", "http")  # checked before the model loads
    check_servable(backend_name, model.path)
    if args.max_sequence_tokens is not None and args.max_sequence_tokens < 2:
        raise UserError(f"--max-sequence-tokens: expected at least 2 (a prompt token and a new one), got "
                        f"{args.max_sequence_tokens}")
    backend = load_backend(model, backend_name, hardware, options)
    try:
        window = int(backend.context_window or DEFAULT_SEQUENCE_TOKENS)
        if args.max_sequence_tokens is not None and args.max_sequence_tokens > window:
            raise UserError(f"--max-sequence-tokens: expected at most {model.name}'s context window of {window} "
                            f"tokens, got {args.max_sequence_tokens}")
        sequence_tokens = args.max_sequence_tokens or min(window, DEFAULT_SEQUENCE_TOKENS)
        asyncio.run(serve_openai(backend, args.name or model.name,
                                 OpenAIOptions(host, port, int(options["max_batch_size"]), sequence_tokens,
                                               int(args.max_body_mb * (1 << 20)))))
    finally:
        backend.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="serve a model over the Open Inference Protocol (HTTP and gRPC), or a "
                                          "generative model over the OpenAI API")
    parser.add_argument("model", help="model manifest name or path")
    parser.add_argument("--http", metavar="HOST:PORT", help="listen for HTTP/REST here (port 0: any free port)")
    parser.add_argument("--grpc", metavar="HOST:PORT", help="listen for gRPC here (port 0: any free port)")
    parser.add_argument("--openai", metavar="HOST:PORT",
                        help="a generative model: serve the OpenAI API here (/v1/completions, /v1/chat/completions; "
                             "port 0: any free port)")
    parser.add_argument("--max-sequence-tokens", type=int, metavar="N",
                        help=f"--openai: the most tokens (prompt and answer) of one request; sizes the batching "
                             f"engine's KV cache (default: the context window, at most {DEFAULT_SEQUENCE_TOKENS})")
    parser.add_argument("--name", help="the model's name in the protocol (default: the manifest's name)")
    parser.add_argument("--backend", help="backend name (default: the model manifest's framework)")
    parser.add_argument("--hardware", default="cpu", help="hardware manifest (default: cpu)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a harness setting (max_batch_size, "
                                                                            "intra_op_threads, ...)")
    parser.add_argument("--max-queue-delay-ms", type=float, default=1.0,
                        help="longest wait for more requests to batch with the first (default 1 ms)")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body accepted (default 64)")
    parser.set_defaults(func=cmd_serve)
