"""Faults of runs against an OpenAI-compatible LLM server, with real processes on loopback: nothing
listening, the server killed mid-stream, streams that end without `[DONE]` or mid-event, events that
are not JSON, lines that are not Server-Sent Events, an answer that is not streamed, errors inside the
stream, busy answers (429, 503) retried, answers that ignore max_tokens or the stop tokens or carry no
content, an unknown model, a prompt refused as too long, silence past endpoint_timeout, and token
counts that differ between the server's usage and the client's tokenizer. Each failing run must fail
(not hang) with one line on stderr that names the endpoint (and the sample where one failed), exit 1,
and keep LoadGen's logs so far and the requests sent in the failed run's folder.

The misbehaving server is tests/fake_openai.py (a process of its own, started by each test)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mlharness.sut.network.sse import Event, SSEDecoder, StrayLine
from tests.fake_openai import (BUSY_TIMES, ENDPOINT_RETRIES, EOS_TEXT, FAULTY_EVERY, LISTED, MODEL, TOO_LONG, Fake,
                               fake_openai)
from tests.network_support import checkout_env, error_line, finish, free_port, kept_folder

REPO = Path(__file__).resolve().parent.parent
LINE_BOUND_S = 60.0  # a bound on a line's arrival in the fake's log

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
