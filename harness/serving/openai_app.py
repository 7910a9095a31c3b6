"""`mlharness serve MODEL --openai HOST:PORT`: a generative model over the OpenAI API (Starlette, served by
uvicorn): GET /v1/models and /health, POST /v1/completions and /v1/chat/completions, answered whole or
streamed as Server-Sent Events (`data: {json}` chunks, one per token's text, then `data: [DONE]`).

Greedy decoding only (temperature 0 or absent); max_tokens up to the manifest's generation.max_new_tokens
(its default). `usage.completion_tokens` counts the generated tokens without the stop token that ended
the answer, as llama.cpp's server counts. A malformed request answers the API's error shape
(`{"error": {"message", "type", "param", "code"}}`, 400, or 404 for a model not served here) with one
line on stderr, and the server keeps serving. The engine bridge is mlharness.serving.llm_engine."""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlharness.errors import UserError, require
from mlharness.serving.llm_engine import (ROLES, EngineError, Generation, IncrementalText, LLMEngine, PromptError,
                                          open_engine)
from mlharness.serving.server import GRACE_SECONDS

# Parameters that would change what is generated and are not served: refused rather than ignored.
UNSERVED = {"n": 1, "best_of": 1, "stop": None, "logprobs": None, "top_logprobs": None, "echo": False,
            "tools": None, "suffix": None}


@dataclass(frozen=True)
class OpenAIOptions:
    host: str
    port: int  # 0: any free one
    max_sequences: int  # sequences generated together (a batching engine)
    max_sequence_tokens: int  # prompt and new tokens of one request
    max_body_bytes: int


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def log_line(message: str) -> None:
    print(f"mlharness serve: openai: {message}", file=sys.stderr, flush=True)


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, separators=(',', ':'))}\n\n"


@dataclass(frozen=True)
class Ask:
    """A validated request."""
    chat: bool
    prompt_ids: Any  # np.ndarray of int64
    max_tokens: int
    stream: bool
    include_usage: bool


class OpenAIFront:
    def __init__(self, name: str, engine: LLMEngine, max_body_bytes: int):
        self.name, self.engine, self.max_body_bytes = name, engine, max_body_bytes
        self.created = int(time.time())

    def app(self) -> Starlette:
        routes = [Route("/v1/models", self.models), Route("/health", self.health),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"])]
        # An unknown path or method answers the API's error shape too: clients parse every error body.
        return Starlette(routes=routes, exception_handlers={HTTPException: self._unrouted})

    async def _unrouted(self, request: Request, exc: HTTPException) -> Response:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        log_line(f"refused: {message}")
        return JSONResponse(error_body(message), status_code=exc.status_code, headers=exc.headers)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                                          "owned_by": "mlharness"}]})

    async def completions(self, request: Request) -> Response:
        return await self._answer(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._answer(request, chat=True)

    async def _answer(self, request: Request, chat: bool) -> Response:
        try:
            ask = self._parse(await self._body(request), chat)
        except RequestError as exc:
            log_line(f"refused: {request.url.path}: {exc}")
            return JSONResponse(error_body(str(exc), exc.param, exc.kind), status_code=exc.status)
        generation = self.engine.submit(ask.prompt_ids, ask.max_tokens)
        reply_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if ask.stream:
            return StreamingResponse(self._stream(ask, generation, reply_id), media_type="text/event-stream")
        try:
            async for _ in generation:
                pass
        except EngineError as exc:
            log_line(f"failed: {request.url.path}: {exc}")
            return JSONResponse(error_body(str(exc), kind="server_error"), status_code=500)
        finally:
            generation.cancel()  # stops the engine's work if this handler was cancelled; no-op once finished
        text = self.engine.decode(generation.tokens)
        choice: dict[str, Any] = {"index": 0, "finish_reason": generation.finish_reason, "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        return JSONResponse({"id": reply_id, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.name, "choices": [choice],
                             "usage": usage(generation)})

    async def _stream(self, ask: Ask, generation: Generation, reply_id: str) -> AsyncIterator[str]:
        created = int(time.time())
        head = {"id": reply_id, "object": "chat.completion.chunk" if ask.chat else "text_completion",
                "created": created, "model": self.name}

        def chunk(text: str | None, finish: str | None = None, delta: dict[str, str] | None = None) -> str:
            if ask.chat:
                choice = {"index": 0, "delta": delta if delta is not None else ({"content": text} if text else {}),
                          "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            return sse({**head, "choices": [choice], **({"usage": None} if ask.include_usage else {})})

        try:
            if ask.chat:
                yield chunk(None, delta={"role": "assistant", "content": ""})
            text = IncrementalText(self.engine.decode)
            async for token in generation:
                piece = text.add(token)  # one token's text as it is made (a cut character waits for the next)
                if piece:
                    yield chunk(piece)
            if rest := text.rest():
                yield chunk(rest)
            yield chunk(None, finish=generation.finish_reason)
            if ask.include_usage:
                yield sse({**head, "choices": [], "usage": usage(generation)})
        except EngineError as exc:
            log_line(f"failed mid-stream: {reply_id}: {exc}")
            yield sse(error_body(str(exc), kind="server_error"))
        except (asyncio.CancelledError, GeneratorExit):
            log_line(f"client left mid-stream: {reply_id}: its generation stopped")
            raise
        finally:
            generation.cancel()
        yield sse("[DONE]")

    async def _body(self, request: Request) -> dict[str, Any]:
        length = int(request.headers.get("content-length") or 0)
        if length > self.max_body_bytes:
            raise RequestError(413, f"request body of {length} bytes is over the limit of {self.max_body_bytes}")
        try:
            body = await request.body()
        except ClientDisconnect:
            raise RequestError(400, "the client disconnected before sending the whole body") from None
        try:
            parsed = json.loads(body)
        except ValueError as exc:  # UnicodeDecodeError included
            raise RequestError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise RequestError(400, f"expected a JSON object, got {type(parsed).__name__}")
        return parsed

    def _parse(self, body: dict[str, Any], chat: bool) -> Ask:
        model = optional(body, "model", str)
        if model is not None and model != self.name:
            raise RequestError(404, f"the model {model!r} is not served here (serving {self.name!r})", "model")
        temperature = optional(body, "temperature", (int, float))
        if temperature not in (None, 0):
            raise RequestError(400, f"temperature {temperature}: only greedy decoding is served (temperature 0)",
                               "temperature")
        for key, default in UNSERVED.items():
            if body.get(key) not in (None, default):
                raise RequestError(400, f"{key}: not served here (greedy decoding of one answer, ended by the "
                                        f"model's own stop token or max_tokens)", key)
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = optional(body, key, int)
        ceiling = self.engine.max_new_tokens
        if max_tokens is None:
            max_tokens = ceiling
        elif not 1 <= max_tokens <= ceiling:
            raise RequestError(400, f"{key} {max_tokens}: expected 1 to {ceiling} (the manifest's "
                                    f"generation.max_new_tokens)", key)
        stream = bool(optional(body, "stream", bool))
        options = optional(body, "stream_options", dict) or {}
        if options and not stream:
            raise RequestError(400, "stream_options: only with stream: true", "stream_options")
        include_usage = bool(optional(options, "include_usage", bool, "stream_options.include_usage"))
        param = "messages" if chat else "prompt"
        try:
            prompt_ids = self.engine.chat_prompt(messages_of(body)) if chat else \
                self.engine.text_prompt(required(body, "prompt", str))
        except PromptError as exc:
            raise RequestError(400, str(exc), param) from None
        if len(prompt_ids) == 0:
            raise RequestError(400, "the prompt is empty", param)
        if len(prompt_ids) + max_tokens > self.engine.max_sequence_tokens:
            raise RequestError(400, f"the prompt is {len(prompt_ids)} tokens; with {key} {max_tokens} that exceeds "
                                    f"the {self.engine.max_sequence_tokens} tokens a request may have here", param)
        return Ask(chat, prompt_ids, max_tokens, stream, include_usage)


def usage(generation: Generation) -> dict[str, int]:
    completion = len(generation.tokens)  # the stop token is not among them
    return {"prompt_tokens": generation.prompt_tokens, "completion_tokens": completion,
            "total_tokens": generation.prompt_tokens + completion}


def optional(body: dict[str, Any], key: str, kind: type | tuple[type, ...], param: str | None = None) -> Any:
    """body[key] when present and not null, checked against `kind` (a bool is no number here)."""
    value, kinds = body.get(key), kind if isinstance(kind, tuple) else (kind,)
    if value is None:
        return None
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise RequestError(400, f"{param or key}: expected {_kind_name(kind)}, got {json.dumps(value)[:80]}",
                           param or key)
    return value


def required(body: dict[str, Any], key: str, kind: type) -> Any:
    if body.get(key) is None:
        raise RequestError(400, f"{key}: required", key)
    return optional(body, key, kind)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
             list: "a list"}
    return " or ".join(names[k] for k in (kind if isinstance(kind, tuple) else (kind,)))


def messages_of(body: dict[str, Any]) -> list[dict[str, str]]:
    """The chat turns as the template takes them: a role it takes and text content (a string or text parts)."""
    messages = required(body, "messages", list)
    if not messages:
        raise RequestError(400, "messages: expected at least one message", "messages")
    turns = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(400, f"{where}: expected an object with role and content", "messages")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise RequestError(400, f"{where}.role: expected one of {', '.join(ROLES)} (the turns the chat template "
                                    f"takes), got {json.dumps(role)[:40]}", "messages")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                             isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(400, f"{where}.content: expected a string or a list of text parts", "messages")
        turns.append({"role": role, "content": content})
    return turns


async def serve_openai(backend: Any, name: str, options: OpenAIOptions) -> None:
    """Serve until SIGTERM or Ctrl-C, then stop taking requests, let those in flight finish (a bounded grace)
    and close the engine. One line on stderr once listening says where."""
    uvicorn = require("uvicorn", "network", "mlharness serve --openai")
    loop = asyncio.get_running_loop()
    engine = open_engine(backend, loop, options.max_sequences, options.max_sequence_tokens)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    class QuietServer(uvicorn.Server):
        def capture_signals(self):  # noqa: ANN202 - ours handle SIGTERM/SIGINT
            return nullcontext()

    config = uvicorn.Config(OpenAIFront(name, engine, options.max_body_bytes).app(), host=options.host,
                            port=options.port, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=int(GRACE_SECONDS))
    server = QuietServer(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise UserError(f"--openai {options.host}:{options.port}: the HTTP server did not start")
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        print(f"mlharness serve: serving {name} ({backend.name}, {engine.describe()}, max_tokens up to "
              f"{engine.max_new_tokens}) at openai http://{options.host}:{bound}/v1", file=sys.stderr, flush=True)
        await stop.wait()
        print("mlharness serve: stopping (requests in flight finish)", file=sys.stderr, flush=True)
    finally:
        server.should_exit = True
        if not task.done():  # a server that failed to start raised above
            await task
        engine.close(GRACE_SECONDS)
