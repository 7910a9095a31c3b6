"""One sample against an OpenAI-compatible LLM server, in LoadGen's token mode: the prompt sent as one
user turn (`/chat/completions`, when the manifest uses a chat template) or as the prompt text
(`/completions`), greedy, streamed; `FirstTokenComplete` at the first non-empty delta (as MLPerf's
reference SUTs for such servers do), `QuerySamplesComplete` once the stream ends, with the answer's token
ids and `n_tokens`.

The server returns text. The client's tokenizer (the manifest's own, mlharness.sut.llm.text_tokenizer)
turns the whole answer into the token ids LoadGen's accuracy log holds, and counts them; the server's
`usage.completion_tokens` (asked for with `stream_options.include_usage`) is the other count. Which one
reaches LoadGen as n_tokens is `endpoint_token_count`: `server` (its usage where it sends one of at least
2 tokens, else the client's count, and the run says how many samples fell back) or `client`. Both are kept
per request.
The client's ids end with the end-of-sequence token when the answer ended on a stop (finish_reason
"stop"): the server made it but sends no text for it, and the in-process engines keep and count it (so
the ids compare with theirs, and an answer of one word is not one token: LoadGen refuses n_tokens of 1,
it divides by n_tokens - 1).

Each content chunk's arrival is one token time (a chunk may carry several tokens: a server that merges
them shows fewer, longer inter-token gaps). Every request's clock and counts are kept for the run's
`requests.jsonl`. An answer that cannot be right fails the sample: no content at all (empty deltas
only), more content chunks or usage tokens than `max_tokens` allows (the server ignored it), the text of
a stop token in the answer (the server ignored the stop tokens)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mlharness.sut.network.connection import EndpointConnection
from mlharness.sut.network.network_sut import Answer
from mlharness.sut.staging import SampleError

TOKEN_COUNTS = ("server", "client")
APIS = ("chat", "completions")


@dataclass
class RequestRecord:
    """One request's clock (perf_counter_ns) and counts, for requests.jsonl."""
    sample: int
    query_id: int
    issued: int  # LoadGen issued the query (the SUT's clock)
    sent: int
    chunks: list[int] = field(default_factory=list)  # arrival of each content chunk
    server_tokens: int | None = None
    client_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    retries: int = 0
    status: str = "ok"
    done: int = 0
    counted_by: str = ""  # whose count reached LoadGen: "server" or "client"

    def as_json(self, origin: int) -> dict[str, Any]:
        def ms(stamp: int) -> float:
            return round((stamp - origin) / 1e6, 4)
        return {"sample": self.sample, "query_id": self.query_id, "issued_ms": ms(self.issued), "sent_ms": ms(self.sent),
                "first_token_ms": ms(self.chunks[0]) if self.chunks else None, "done_ms": ms(self.done) if self.done else None,
                "chunk_ms": [ms(stamp) for stamp in self.chunks], "server_tokens": self.server_tokens,
                "client_tokens": self.client_tokens, "prompt_tokens": self.prompt_tokens,
                "finish_reason": self.finish_reason, "counted_by": self.counted_by, "retries": self.retries,
                "status": self.status}


class PromptTexts:
    """The query sample library of a run against an LLM server: the dataset's prompt texts (nothing to
    load: LoadQuerySamples only marks what LoadGen may ask for)."""

    def __init__(self, items: Sequence[tuple[Any, Any]]):
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def load_samples(self, indices: Sequence[int]) -> None:
        """Nothing to load: the prompts are text, held from the start."""

    def unload_samples(self, indices: Sequence[int]) -> None:
        """Nothing was loaded."""

    def prompt(self, index: int) -> str:
        return self.items[index][0]

    def labels(self) -> list[Any]:
        return [label for _, label in self.items]


class TokenExchange:
    token_mode = True

    def __init__(self, connection: EndpointConnection, prompts: PromptTexts, tokenizer: Any, generation: Any,
                 api: str, token_count: str, chat_turns: Any):
        import mlperf_loadgen as lg

        self._lg = lg
        self.connection, self.prompts, self.tokenizer = connection, prompts, tokenizer
        self.generation, self.api, self.token_count = generation, api, token_count
        self._chat_turns = chat_turns
        self.max_tokens = int(generation.max_new_tokens)
        self.stop_texts = [text for text in generation.stop if text]
        self._first: set[int] = set()  # query ids whose first token LoadGen has been told
        self.records: list[RequestRecord] = []
        self.described = {"api": api, "token_count": token_count, "tokenizer": tokenizer.name,
                          "max_tokens": self.max_tokens}

    def body(self, prompt: str) -> dict[str, Any]:
        """The request: greedy (temperature 0), at most the manifest's max_new_tokens, streamed with usage."""
        body: dict[str, Any] = {"model": self.connection.model_name, "max_tokens": self.max_tokens, "temperature": 0,
                                "stream": True, "stream_options": {"include_usage": True}}
        if self.api == "chat":
            body["messages"] = self._chat_turns(self.generation, prompt)
        else:
            body["prompt"] = prompt
        if self.stop_texts:
            body["stop"] = self.stop_texts
        return body

    def first_token_sent(self, query_id: int) -> bool:
        return query_id in self._first

    async def answer(self, query_id: int, index: int, issued: int) -> Answer:
        record = RequestRecord(index, query_id, issued, time.perf_counter_ns())
        self.records.append(record)
        counters: dict[str, int] = {}
        pieces: list[str] = []
        try:
            async for arrived, chunk in self.connection.client.stream(self.api, self.body(self.prompts.prompt(index)),
                                                                      counters):
                usage = chunk.get("usage") if isinstance(chunk, dict) else None
                if isinstance(usage, dict):
                    record.server_tokens = _count(usage.get("completion_tokens"))
                    record.prompt_tokens = _count(usage.get("prompt_tokens"))
                for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
                    piece = _content(choice, self.api)
                    if piece:
                        if not pieces:
                            self._tell_first(query_id)
                        pieces.append(piece)
                        record.chunks.append(arrived)
                    if isinstance(choice, dict) and choice.get("finish_reason"):
                        record.finish_reason = str(choice["finish_reason"])
            record.done = time.perf_counter_ns()
            record.retries = counters.get("retries", 0)
            text = "".join(pieces)
            self._check(text, record, index)
            ids = self.tokenizer.encode(text)
            if record.finish_reason == "stop" and self.tokenizer.eos_id is not None:
                # The stop token the server made but sent no text for: kept, as the in-process engines keep it.
                ids = np.append(ids, np.int64(self.tokenizer.eos_id))
            record.client_tokens = int(ids.size)
        except BaseException as exc:
            record.retries = counters.get("retries", 0)
            record.status = f"error: {exc}"[:300]
            raise
        return Answer(ids, self._n_tokens(record), {})

    def _tell_first(self, query_id: int) -> None:
        # The first token's id is known only once the whole answer is tokenized: the time is what counts.
        lg = self._lg
        self._first.add(query_id)
        lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])

    def _check(self, text: str, record: RequestRecord, index: int) -> None:
        url = self.connection.endpoint.url
        if not record.chunks:
            raise SampleError([index], "endpoint", f"{url} streamed no content for the prompt (empty deltas only"
                                                   f"{', finish_reason ' + record.finish_reason if record.finish_reason else ''})")
        if len(record.chunks) > self.max_tokens or (record.server_tokens or 0) > self.max_tokens:
            made = max(len(record.chunks), record.server_tokens or 0)
            raise SampleError([index], "endpoint", f"{url} answered {made} tokens for max_tokens {self.max_tokens}: "
                                                   "the server ignored max_tokens")
        for stop in self.stop_texts + [self.tokenizer.eos_text]:
            if stop and stop in text:
                raise SampleError([index], "endpoint", f"{url} answered text past the stop token {stop!r}: the server "
                                                       "ignored the stop tokens")

    def _n_tokens(self, record: RequestRecord) -> int:
        """The count LoadGen gets (its TPOT divides by n_tokens - 1, and it refuses 1): the server's where
        asked for and usable, else the client's; which one is kept on the record."""
        if self.token_count == "server" and record.server_tokens is not None and record.server_tokens > 1:
            record.counted_by = "server"
            return record.server_tokens
        record.counted_by = "client"
        return max(int(record.client_tokens or 0), 1)

    # ---- what the run records ----

    def token_counts(self) -> dict[str, Any]:
        """Both counts over the completed requests: totals, how many samples had a server count, the share
        whose two counts differ, and which count reached LoadGen."""
        done = [r for r in self.records if r.status == "ok" and r.client_tokens is not None]
        both = [r for r in done if r.server_tokens is not None]
        differ = sum(r.server_tokens != r.client_tokens for r in both)
        by_client = sum(r.counted_by == "client" for r in done)
        if self.token_count == "client" or by_client == 0:
            source = self.token_count
        elif not both:
            source = "client (the server sent no usage)"
        else:
            source = f"server ({by_client} of {len(done)} samples from the client: no usage, or fewer than 2 tokens)"
        return {"output_tokens_client": sum(r.client_tokens or 0 for r in done),
                "output_tokens_server": sum(r.server_tokens or 0 for r in both) if both else None,
                "samples_with_server_count": len(both),
                "token_count_mismatch_share": round(differ / len(both), 4) if both else None,
                "token_count_source": source,
                "retried_requests": sum(1 for r in self.records if r.retries),
                "retries": sum(r.retries for r in self.records)}

    def sample_clocks(self) -> list[tuple[int, list[int]]]:
        """(issued, content chunk arrivals) per completed request, for the inter-token latency and goodput."""
        return [(r.issued, r.chunks) for r in self.records if r.status == "ok"]

    def write_requests(self, path: Path, origin: int) -> int:
        """Every request as one JSON line, times in ms from `origin` (the test's first issue); the count."""
        with open(path, "w") as out:
            for record in self.records:
                out.write(json.dumps(record.as_json(origin)) + "\n")
        return len(self.records)


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _content(choice: Any, api: str) -> str:
    """A chunk's new text: a chat delta's `content`, a completion's `text`; anything else is none."""
    if not isinstance(choice, dict):
        return ""
    if api == "chat":
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
    else:
        piece = choice.get("text")
    return piece if isinstance(piece, str) else ""
