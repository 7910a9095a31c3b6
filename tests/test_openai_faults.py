"""Faults of runs against an OpenAI-compatible LLM server, with real processes on loopback: nothing
listening, the server killed mid-stream, streams that end without `[DONE]` or mid-event, events that
are not JSON, lines that are not Server-Sent Events, an answer that is not streamed, errors inside the
stream, busy answers (429, 503) retried, answers that ignore max_tokens or the stop tokens or carry no
content, an unknown model, a prompt refused as too long, silence past endpoint_timeout, and token
counts that differ between the server's usage and the client's tokenizer. Each failing run must fail
(not hang) with one line on stderr that names the endpoint (and the sample where one failed), exit 1,
and keep LoadGen's logs so far and the requests sent in the failed run's folder.

The misbehaving server lives in this file: `python tests/test_openai_faults.py FAULT [PORT]` serves
GET /v1/models and POST /v1/chat/completions (aiohttp, streamed as Server-Sent Events) on 127.0.0.1
(PORT 0 or none: any free port, said on its ready line), answers every request well ("positive",
finish_reason "stop", usage where asked) except the LoadGen requests FaultPlan picks, which get FAULT.
The runs send exactly one warm-up request (`warmup_queries=0`: the first prompt alone), so the fake
takes the first POST for the warm-up's."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from mlharness.sut.network.sse import Event, SSEDecoder, StrayLine
from tests.network_support import checkout_env, error_line, fake_server, finish, free_port, kept_folder

REPO = Path(__file__).resolve().parent.parent
START_BOUND_S = 60.0  # a bound on the fake server's start
LINE_BOUND_S = 60.0  # a bound on a line's arrival in the fake's log

# ---- the misbehaving server (a subprocess; `python tests/test_openai_faults.py FAULT [PORT]`) ---------------

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


# ---- processes ---------------------------------------------------------------------------------------------

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


OFFLINE = ("--scenario", "Offline", "--set", "dataset_limit=20", "--set", "warmup_queries=0", "--quiet")


def start_run(results: Path, endpoint: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlharness.cli", "run", MODEL, "--backend", "llama_cpp",
                             "--endpoint", endpoint, *OFFLINE, *args, "--results-dir", str(results)],
                            cwd=results.parent, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def run_against(results: Path, endpoint: str, *args: str) -> tuple[int, str]:
    return finish(start_run(results, endpoint, *args))


def requests_sent(folder: Path) -> list[dict[str, Any]]:
    """The run's requests.jsonl (one performance run): every request's clock, counts and status."""
    (path,) = folder.rglob("requests.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_failed_before_loadgen(code: int, err: str, *named: str) -> str:
    """One line naming each of `named`, exit 1, the run's folder kept but LoadGen never started."""
    assert code == 1, err
    line = error_line(err)
    for text in named:
        assert text in line, line
    assert not list(kept_folder(line).rglob("mlperf_log_detail.txt")), line
    return line


def assert_failed_in_loadgen(code: int, err: str, endpoint: str) -> tuple[str, dict[str, Any]]:
    """One line naming the endpoint, how many samples failed and the first (with its sample), exit 1;
    LoadGen's logs so far kept in the folder it names, with the failed request in its requests.jsonl.
    The line and that request."""
    assert code == 1, err
    line = error_line(err)
    assert re.search(rf"\b[1-9]\d* sample\(s\) failed at {re.escape(endpoint)}\b", line), line
    first = re.search(rf"the first: sample (\d+): endpoint {re.escape(endpoint)}", line)
    assert first, line
    folder = kept_folder(line)
    (detail,) = folder.rglob("mlperf_log_detail.txt")
    assert detail.stat().st_size > 0, line
    failed = [r for r in requests_sent(folder) if r["status"] != "ok"]
    assert failed and failed[0]["status"].startswith("error: "), failed[:3]
    assert any(r["sample"] == int(first[1]) for r in failed), (first[1], failed[:3])
    return line, failed[0]


def newest_record(results: Path) -> dict[str, Any]:
    """The run.json of the one ok run under `results`."""
    (path,) = results.glob(f"*/{MODEL}/Offline/runs/*/run.json")
    return json.loads(path.read_text())


def wait_for_log(fake: Fake, text: str, run: subprocess.Popen) -> None:
    """Until a line of the fake's holds `text` (bounded; the run must still be going)."""
    deadline = time.monotonic() + LINE_BOUND_S
    while not fake.served(text):
        assert run.poll() is None, f"the run ended first: {run.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"the fake did not log {text!r}: {''.join(fake.log)[-2000:]}"
        time.sleep(0.05)


# ---- the stream's lines ------------------------------------------------------------------------------------

def test_a_line_of_no_sse_field_comes_out_in_its_place() -> None:
    """The standard ignores it; the client must see it (content or an error lost otherwise)."""
    decoder = SSEDecoder()
    found = decoder.feed(b'data: {"a": 1}\n\n{"b": 2}\nid: 7\nretry: 10\n: ping\n'
                         b'error: {"message": "x"}\n\ndata: [DONE]\n\n')
    assert found == [Event('{"a": 1}'), StrayLine('{"b": 2}'), StrayLine('error: {"message": "x"}'), Event("[DONE]")]


# ---- before LoadGen ----------------------------------------------------------------------------------------

def test_nothing_listening_is_one_line_naming_the_endpoint(tmp_path: Path) -> None:
    endpoint = f"openai+http://127.0.0.1:{free_port()}/v1"
    code, err = run_against(tmp_path / "results", endpoint)
    line = assert_failed_before_loadgen(code, err, f"--endpoint: {endpoint}")
    assert re.search(r"connect|refused", line, re.IGNORECASE), line


def test_an_unserved_model_is_one_line_naming_the_listed_models(tmp_path: Path) -> None:
    with fake_openai("models-two") as fake:
        code, err = run_against(tmp_path / "results", fake.endpoint)
    assert_failed_before_loadgen(code, err, f"--endpoint: {fake.endpoint}", f"model {MODEL!r}",
                                 "lists 'llama-3-8b', 'qwen2-0.5b'", "endpoint_model=NAME")


def test_the_servers_only_model_is_used_under_its_own_name(tmp_path: Path) -> None:
    """The server lists one model named otherwise (vLLM serves 'org/name'): the run asks for it (the fake
    answers 404 to any other name) and records the name it used."""
    results = tmp_path / "results"
    with fake_openai("models-other") as fake:
        code, err = run_against(results, fake.endpoint)
    assert code == 0, err
    record = newest_record(results)
    sut = record["loadgen"]["performance"]["sut"]
    assert (sut["served_model"], sut["platform"]) == (LISTED["models-other"][0], "openai (the server's only model)")
    assert sut["network"]["failed_samples"] == 0 and sut["network"]["requests"] > 0


# ---- answers that fail the run while LoadGen runs ----------------------------------------------------------

SILENT = ("--set", "endpoint_timeout=1")
# What the first error says (after the sample and the endpoint) of each fault; the run's extra settings.
FAULT_SAYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "no-done": ("POST /chat/completions: the stream ended without [DONE]", ()),
    "cut-mid-event": ("POST /chat/completions: the stream ended mid-event without [DONE]", ()),
    "not-json": ("""POST /chat/completions: a streamed event is not JSON: '{"choices": [{"delta": """, ()),
    "no-data-field": ("""POST /chat/completions: a streamed line is no Server-Sent Events field: '{"id": """, ()),
    "not-streamed": ("POST /chat/completions: answered application/json, not a stream (text/event-stream)", ()),
    "error-field": ("POST /chat/completions: the stream carried an error: injected: the request exceeds the "
                    "available context size", ()),
    "error-in-stream": ("POST /chat/completions: the stream carried an error: injected: the engine ran out of "
                        "memory", ()),
    "too-long": (f"POST /chat/completions: HTTP 400: {TOO_LONG}", ()),
    "ignores-max-tokens": ("answered 6 tokens for max_tokens 4: the server ignored max_tokens", ()),
    "ignores-stop": (f"answered text past the stop token {EOS_TEXT!r}: the server ignored the stop tokens", ()),
    "empty-deltas": ("streamed no content for the prompt (empty deltas only, finish_reason stop)", ()),
    "silent-headers": ("POST /chat/completions: the server sent nothing for 1 s (endpoint_timeout)", SILENT),
    "silent-mid-stream": ("POST /chat/completions: the server sent nothing for 1 s (endpoint_timeout)", SILENT),
}


@pytest.mark.parametrize("fault", list(FAULT_SAYS))
def test_a_faulty_answer_fails_the_run_naming_sample_and_endpoint(tmp_path: Path, fault: str) -> None:
    says, settings = FAULT_SAYS[fault]
    with fake_openai(fault) as fake:
        code, err = run_against(tmp_path / "results", fake.endpoint, *settings)
    line, request = assert_failed_in_loadgen(code, err, fake.endpoint)
    assert says in line, line
    assert says in request["status"], request
    assert fake.served(f"fake-openai: {fault} on request {FAULTY_EVERY}\n"), "the fault was never served"


def test_the_server_killed_mid_stream_fails_the_run_naming_the_endpoint(tmp_path: Path) -> None:
    """SIGKILL by its pid once a stream has sent its first token: no goodbye to the client."""
    results = tmp_path / "results"
    with fake_openai("killed-mid-stream") as fake:
        run = start_run(results, fake.endpoint)
        try:
            wait_for_log(fake, "fake-openai: silent on request", run)
            fake.process.kill()
            fake.process.wait(30)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            raise
    code, err = finish(run)
    line, request = assert_failed_in_loadgen(code, err, fake.endpoint)
    assert "POST /chat/completions: " in line and "endpoint_timeout" not in line, line
    # the stream cut, or (the first failure seen, with requests in flight) another request's body unwritable,
    # or (a loaded machine: the next request sent before the cut was noticed) its connection refused
    assert re.search(r"payload|closed|reset|refused|disconnect|can not write|cannot connect|without \[DONE\]", line,
                     re.IGNORECASE), line


# ---- busy answers ------------------------------------------------------------------------------------------

ONE_AT_A_TIME = ("--set", "endpoint_concurrency=1")  # one request's retries are the fake's next POSTs


@pytest.mark.parametrize("retry_after", [False, True], ids=["no-retry-after", "retry-after"])
@pytest.mark.parametrize("status", [429, 503])
def test_busy_answers_are_retried_and_counted_when_the_server_recovers(tmp_path: Path, status: int,
                                                                       retry_after: bool) -> None:
    fault = f"busy-{status}{'-after' if retry_after else ''}"
    results = tmp_path / "results"
    with fake_openai(fault) as fake:
        code, err = run_against(results, fake.endpoint, *ONE_AT_A_TIME)
    assert code == 0, err
    assert fake.served(f"fake-openai: {fault} on request ") == BUSY_TIMES
    record = newest_record(results)
    performance = record["performance"]
    assert (performance["retries"], performance["retried_requests"]) == (BUSY_TIMES, 1), performance
    requests = requests_sent(Path(record["results_path"]))
    assert [r["retries"] for r in requests if r["retries"]] == [BUSY_TIMES]
    assert all(r["status"] == "ok" for r in requests)
    if retry_after:  # Retry-After: 1 waited before each retry (a lower bound, no verdict on speed)
        waits = [float(m[1]) for m in re.finditer(r"next request (\S+) s after", "".join(fake.log))]
        assert len(waits) == BUSY_TIMES and min(waits) >= 0.9, waits


@pytest.mark.parametrize("fault, says", [("busy-429-forever", "HTTP 429: injected: busy (429)"),
                                         ("busy-503-after-forever", "HTTP 503: injected: busy (503)")])
def test_a_server_busy_past_the_retries_fails_the_run_naming_the_status(tmp_path: Path, fault: str,
                                                                        says: str) -> None:
    with fake_openai(fault) as fake:
        code, err = run_against(tmp_path / "results", fake.endpoint, *ONE_AT_A_TIME)
    line, request = assert_failed_in_loadgen(code, err, fake.endpoint)
    assert f"POST /chat/completions: {says}" in line, line
    assert request["retries"] == ENDPOINT_RETRIES, request
    assert fake.served(f"fake-openai: {fault} on request ") == 1 + ENDPOINT_RETRIES  # then no request more


# ---- a connection closed before any answer -----------------------------------------------------------------

def test_a_reused_connection_closed_before_any_answer_is_sent_again_and_counted(tmp_path: Path) -> None:
    """A server that closes a kept-alive connection as a request arrives on it (an idle-timeout race):
    the request goes out once more on a fresh connection, the run is ok and the retries counted."""
    results = tmp_path / "results"
    with fake_openai("close-reused") as fake:
        code, err = run_against(results, fake.endpoint, *ONE_AT_A_TIME)
    assert code == 0, err
    closed = fake.served("fake-openai: closed the connection (reused)")
    assert closed >= 1 and not fake.served("(fresh)"), "".join(fake.log)[-2000:]
    record = newest_record(results)
    requests = requests_sent(Path(record["results_path"]))
    assert all(r["status"] == "ok" for r in requests)
    assert sum(r["retries"] for r in requests) == record["performance"]["retries"] == closed


def test_a_fresh_connection_closed_before_any_answer_fails_the_run_not_sent_again(tmp_path: Path) -> None:
    """Sent again only from a reused connection: a fresh one that ends unanswered is the server's fault.
    Offline sends the prompts at once, so most go out on fresh connections, which the server closes."""
    with fake_openai("close-fresh") as fake:
        code, err = run_against(tmp_path / "results", fake.endpoint)
    line, _ = assert_failed_in_loadgen(code, err, fake.endpoint)
    assert "POST /chat/completions: ServerDisconnectedError" in line, line
    failed = [r for r in requests_sent(kept_folder(line)) if r["status"] != "ok"]
    assert fake.served("(fresh)") >= 1 and not fake.served("(reused)"), "".join(fake.log)[-2000:]
    assert all(r["retries"] == 0 for r in failed), failed[:3]


# ---- the two token counts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("count", ["server", "client"])
def test_token_counts_that_differ_are_recorded_with_their_source(tmp_path: Path, count: str) -> None:
    """Every FAULTY_EVERY-th answer's usage says 3 tokens where the tokenizer counts 2 ("positive" and
    the stop token): both totals, the share that differs and whose count reached LoadGen."""
    results = tmp_path / "results"
    with fake_openai("usage-differs") as fake:
        code, err = run_against(results, fake.endpoint, "--set", f"endpoint_token_count={count}")
    assert code == 0, err
    record = newest_record(results)
    performance = record["performance"]
    requests = requests_sent(Path(record["results_path"]))
    differ = [r for r in requests if r["server_tokens"] != r["client_tokens"]]
    assert differ and all((r["server_tokens"], r["client_tokens"]) == (3, 2) for r in differ), differ[:3]
    assert performance["token_count_mismatch_share"] == round(len(differ) / len(requests), 4) > 0
    assert performance["output_tokens_client"] == 2 * len(requests)
    assert performance["output_tokens_server"] == 2 * len(requests) + len(differ)
    assert performance["token_count_source"] == count
    assert {r["counted_by"] for r in requests} == {count}


if __name__ == "__main__":
    asyncio.run(serve_faulty(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
