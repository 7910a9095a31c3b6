"""A misbehaving OpenAI-compatible server for tests of runs against one: `python tests/fake_openai.py FAULT
[PORT]` serves GET /v1/models and POST /v1/chat/completions (aiohttp, streamed as Server-Sent Events) on
127.0.0.1 (PORT 0 or none: any free port, said on its ready line), answers every request well ("positive",
finish_reason "stop", usage where asked) except the LoadGen requests FaultPlan picks, which get FAULT.
The runs send exactly one warm-up request (`warmup_queries=0`: the first prompt alone), so the fake
takes the first POST for the warm-up's. `fake_openai(FAULT)` starts it for a test and stops it by its pid."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from tests.network_support import fake_server

START_BOUND_S = 60.0  # a bound on the fake server's start

MODEL = "smollm2-135m"
WARMUP_REQUESTS = 1  # the runs' warm-up: warmup_queries=0 sends the first prompt alone
FAULTY_EVERY = 3  # which of LoadGen's requests misbehave: the 3rd, 6th, ...
BUSY_TIMES = 2  # busy answers before a recovering server answers (within endpoint_retries)
ENDPOINT_RETRIES = 3  # endpoint_retries' default
FAKE_READY = re.compile(r"fake-openai: listening (?P<url>http://\S+)$")
EOS_TEXT = "<|im_end|>"  # SmolLM2's end-of-sequence token as text
TOO_LONG = ("This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
            "(8996 in the messages, 4 in the completion). Please reduce the length of the messages.")
# The models a fault's server lists (a fault in the listing, none in the requests); the others list MODEL.
LISTED = {"models-two": ["llama-3-8b", "qwen2-0.5b"], "models-other": ["HuggingFaceTB/SmolLM2-135M-Instruct"]}


class FaultPlan:
    """Which POSTs misbehave: none of the warm-up's (the first WARMUP_REQUESTS), then every
    FAULTY_EVERY-th of LoadGen's. The busy faults instead answer the first BUSY_TIMES of LoadGen's POSTs
    busy (the runs send one request at a time: one request's retries), or all of them (`-forever`)."""

    def __init__(self, fault: str):
        self.fault, self.posts = fault, 0
        self.models = LISTED.get(fault, [MODEL])
        self.busy_at: float | None = None  # when the last busy answer went out
        # Requests so far on each connection, by its transport: held, so that no later connection takes the
        # key (an id or the client's port can come back once a connection has closed).
        self.on_connection: dict[Any, int] = {}

    def seen_on_connection(self, request: Any) -> int:
        """The number of `request` among its connection's requests (1: the connection is fresh)."""
        transport = request.transport
        self.on_connection[transport] = self.on_connection.get(transport, 0) + 1
        return self.on_connection[transport]

    def faulty(self) -> int | None:
        """The number of this POST among LoadGen's when it gets the fault, else None."""
        self.posts += 1
        measured = self.posts - WARMUP_REQUESTS
        if measured <= 0 or self.fault in LISTED:
            return None
        if self.fault.startswith("busy-"):
            hit = self.fault.endswith("-forever") or measured <= BUSY_TIMES
        elif self.fault.startswith("close-"):  # every one of LoadGen's POSTs (close-reused: on a reused connection)
            hit = True
        else:
            hit = measured % FAULTY_EVERY == 0
        if not hit:
            return None
        say(f"{self.fault} on request {measured}")
        return measured


def say(text: str) -> None:
    print(f"fake-openai: {text}", file=sys.stderr, flush=True)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One chat.completion.chunk as OpenAI streams it (no choices: the usage chunk)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                            "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def event(body: Any) -> bytes:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n".encode()


def answer_events(pieces: list[str], finish: str, completion_tokens: int, usage: bool) -> list[bytes]:
    """A whole stream: the role, each piece as a delta, the finish, the usage (where asked), [DONE]."""
    events = [event(chunk({"role": "assistant", "content": ""}))]
    events += [event(chunk({"content": piece})) for piece in pieces]
    events.append(event(chunk({}, finish)))
    if usage:
        events.append(event(chunk(usage={"prompt_tokens": 20, "completion_tokens": completion_tokens,
                                         "total_tokens": 20 + completion_tokens})))
    return events + [event("[DONE]")]


SILENCE = None  # in a stream's pieces: nothing more, ever (the process is stopped by its pid)


def stream_of(kind: str, usage: bool, max_tokens: int) -> list[bytes | None]:
    """The pieces of one answer's body (written as they come) for a fault, or a good answer ("good")."""
    good = answer_events(["positive"], "stop", 2, usage)  # "positive" and the stop token: 2 tokens
    streams: dict[str, list[bytes | None]] = {
        "good": good,
        "no-done": good[:-1],
        "cut-mid-event": good[:2] + [good[2][:25]],
        "not-json": good[:1] + [b'data: {"choices": [{"delta": {"content": positive}}]}\n\n'] + good[1:],
        # The chunks as bare JSON lines, not SSE's `data:` fields (the [DONE] right): the content would be lost.
        "no-data-field": [piece.removeprefix(b"data: ") for piece in good[:-1]] + good[-1:],
        # llama.cpp's server streams an error as an `error:` line and ends the stream there.
        "error-field": good[:1] + [b'error: {"code": 400, "message": "injected: the request exceeds the available '
                                   b'context size", "type": "exceed_context_size_error"}\n\n'],
        "error-in-stream": good[:1] + [event({"error": {"message": "injected: the engine ran out of memory",
                                                        "code": 500}}), event("[DONE]")],
        "ignores-max-tokens": answer_events([f" word{i}" for i in range(max_tokens + 2)], "length", max_tokens + 2,
                                            usage),
        "ignores-stop": answer_events(["positive", EOS_TEXT, "\nmore"], "length", 3, usage),
        "empty-deltas": answer_events([], "stop", 0, usage),
        "usage-differs": answer_events(["positive"], "stop", 3, usage),  # 3 by its count, 2 by the tokenizer's
        "silent-headers": [SILENCE],
        "silent-mid-stream": good[:2] + [SILENCE],  # the first token, then nothing
        "killed-mid-stream": good[:2] + [SILENCE],  # the first token; the test kills the server meanwhile
    }
    return streams[kind]


def make_app(plan: FaultPlan) -> Any:
    from aiohttp import web  # only the fake server's process needs it (the tests' module imports stay quick)

    async def models(request: web.Request) -> web.StreamResponse:
        plan.seen_on_connection(request)
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "fake"}
                                                             for name in plan.models]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("model") not in plan.models:  # as vLLM answers a model it does not serve
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "code": 404}}, status=404)
        if plan.busy_at is not None:
            say(f"next request {time.monotonic() - plan.busy_at:.3f} s after the busy answer")
            plan.busy_at = None
        reused = plan.seen_on_connection(request) > 1
        measured = plan.faulty()
        kind = "good" if measured is None else plan.fault
        if (kind == "close-reused" and reused) or (kind == "close-fresh" and not reused):
            # The connection ends before any byte of an answer, as when a server closes an idle
            # keep-alive connection just as the client sends on it.
            say(f"closed the connection ({'reused' if reused else 'fresh'}) on request {measured}")
            # No byte more: the end of the stream (FIN) now, then the socket dropped without aiohttp's 500.
            request.transport.get_extra_info("socket").shutdown(socket.SHUT_WR)
            request.transport.abort()
            raise asyncio.CancelledError
        if kind.startswith("close-"):
            kind = "good"
        if kind.startswith("busy-"):  # busy-STATUS[-after][-forever]
            status = int(kind.split("-")[1])
            plan.busy_at = time.monotonic()
            return web.json_response({"error": {"message": f"injected: busy ({status})", "type": "server_error"}},
                                     status=status, headers={"Retry-After": "1"} if "-after" in kind else {})
        if kind == "too-long":
            return web.json_response({"error": {"message": TOO_LONG, "type": "invalid_request_error",
                                                "param": "messages", "code": "context_length_exceeded"}}, status=400)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if kind == "not-streamed":  # stream: true ignored; the whole answer as one JSON body
            return web.json_response({"id": "chatcmpl-fake", "object": "chat.completion", "model": MODEL,
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "positive"}}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        if plan.fault.startswith("close-"):
            # The answer and the body's end in one write: the client reads the end with [DONE], so the
            # connection goes back to its pool to be reused (as a short answer from a real server does).
            await response.write_eof(b"".join(stream_of(kind, usage, 4)))  # type: ignore[arg-type]
            return response
        for piece in stream_of(kind, usage, int(body.get("max_tokens") or 4)):
            if piece is SILENCE:
                say(f"silent on request {measured}")
                await asyncio.Event().wait()
            else:
                await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    return app


async def serve_faulty(fault: str, port: int) -> None:
    """Serve until SIGTERM; one line on stderr says where, once it listens."""
    from aiohttp import web

    runner = web.AppRunner(make_app(FaultPlan(fault)), access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    await web.SockSite(runner, sock, shutdown_timeout=0.1).start()  # a silent stream holds no stop
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    say(f"listening http://127.0.0.1:{sock.getsockname()[1]}")
    await stop.wait()
    await runner.cleanup()


# ---- the fake as a process of a test ------------------------------------------------------------------------

@dataclass
class Fake:
    process: subprocess.Popen
    url: str
    log: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        """The server as --endpoint takes it."""
        return f"openai+{self.url}/v1"

    def served(self, text: str) -> int:
        """How many of the fake's lines hold `text`."""
        return sum(text in line for line in self.log)


@contextlib.contextmanager
def fake_openai(fault: str) -> Iterator[Fake]:
    with fake_server([sys.executable, __file__, fault, "0"], FAKE_READY, START_BOUND_S) as (process, match, log):
        yield Fake(process, match["url"], log)


if __name__ == "__main__":
    asyncio.run(serve_faulty(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
