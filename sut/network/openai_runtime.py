"""What a run against an OpenAI-compatible LLM server holds on the LoadGen node: the dataset's prompt
texts (the server applies the chat template and tokenizes them), the manifest's own tokenizer (for the
client's token count and to score the answers) and the connection. It has the shape of
mlharness.sut.llm.runtime.LLMRuntime where the runner reads one, with `network = True`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mlharness.errors import UserError
from mlharness.specs.endpoint import Endpoint
from mlharness.specs.manifests import DatasetManifest, ModelManifest
from mlharness.sut.network.connection import EndpointConnection
from mlharness.sut.network.oip_client import EndpointError
from mlharness.sut.network.token_exchange import APIS, PromptTexts, TokenExchange
from mlharness.sut.processing import ProcessingContext
from mlharness.sut.runtime import describe_sources, enumerate_samples, resolve_sources


@dataclass
class LLMEndpointRuntime:
    model: ModelManifest
    dataset: DatasetManifest
    backend: EndpointConnection  # the runner describes and closes it as it does a backend
    staged: PromptTexts
    ctx: ProcessingContext
    tokenizer: Any  # mlharness.sut.llm.text_tokenizer.TextTokenizer
    api: str
    token_count: str
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    cold_start: dict[str, Any] = field(default_factory=dict)
    postprocess: Any = None
    generative = True
    network = True

    @property
    def labels(self) -> list[Any]:
        return self.staged.labels()

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode(ids)

    def exchange(self) -> TokenExchange:
        from mlharness.sut.backends.llm_transformers import chat_turns

        return TokenExchange(self.backend, self.staged, self.tokenizer, self.model.generation, self.api,
                             self.token_count, chat_turns)


def choose_api(model: ModelManifest, requested: str | None) -> str:
    """`/chat/completions` for a manifest that uses its chat template, `/completions` otherwise; the
    endpoint_api setting overrides."""
    if requested in APIS:
        return str(requested)
    return "chat" if model.generation.chat_template else "completions"


def build_openai_runtime(model: ModelManifest, dataset: DatasetManifest, endpoint: Endpoint,
                         options: dict[str, Any]) -> LLMEndpointRuntime:
    """Enumerate the prompts, load the manifest's tokenizer, connect to the server and find the model it
    serves; each phase timed into cold_start."""
    from mlharness.sut.llm.runtime import check_prompts
    from mlharness.sut.llm.text_tokenizer import load_text_tokenizer

    seconds: dict[str, Any] = {}
    started = time.perf_counter()
    model_sources, dataset_sources = resolve_sources(model), resolve_sources(dataset)
    ctx = ProcessingContext(attributes=dict(model.attributes), sources={**dataset_sources, **model_sources},
                            model=model, dataset=dataset)
    items = enumerate_samples(dataset, ctx, int(options.get("dataset_limit") or 0))
    check_prompts(items, dataset)
    seconds["enumerate_seconds"] = time.perf_counter() - started
    started = time.perf_counter()
    tokenizer = load_text_tokenizer(model, model_sources)
    seconds["tokenizer_seconds"] = time.perf_counter() - started
    started = time.perf_counter()
    explicit = bool(options.get("endpoint_model"))
    connection = EndpointConnection(endpoint, str(options.get("endpoint_model") or model.name),
                                    int(options["endpoint_concurrency"]), float(options["endpoint_timeout"]),
                                    float(options["endpoint_connect_timeout"]), retries=int(options["endpoint_retries"]),
                                    explicit_model=explicit)
    try:
        connection.check()
    except BaseException:
        connection.close()
        raise
    seconds["connect_seconds"] = time.perf_counter() - started
    described = {**describe_sources(dataset, dataset_sources), **describe_sources(model, model_sources)}
    return LLMEndpointRuntime(model, dataset, connection, PromptTexts(items), ctx, tokenizer,
                              choose_api(model, options.get("endpoint_api")), str(options["endpoint_token_count"]),
                              described, seconds)


def warm_up_openai(runtime: LLMEndpointRuntime, queries: int, seconds: float) -> dict[str, Any]:
    """The first prompt through the server (its first answer, timed), then prompts (cycled) until `queries`
    answers and `seconds` passed, timed as the in-process warm-up is (mlharness.sut.warmup): the server's
    caches and the connection pool are warm when LoadGen starts. LoadGen is not running: no first-token call."""
    from mlharness.sut.warmup import timed_warm_up

    connection, exchange, count = runtime.backend, runtime.exchange(), len(runtime.staged)

    def answer(index: int) -> None:
        try:
            connection.run(_drain(connection, exchange, index % count), connection.timeout_s + 1)
        except EndpointError as exc:
            raise UserError(f"--endpoint: warm-up, sample {index % count}: {exc}") from None

    started = time.perf_counter()
    answer(0)
    first = time.perf_counter() - started
    return {"first_inference_seconds": first, "warmup": timed_warm_up(answer, 1, queries, seconds)}


async def _drain(connection: EndpointConnection, exchange: TokenExchange, index: int) -> None:
    async for _ in connection.client.stream(exchange.api, exchange.body(exchange.prompts.prompt(index)), {}):
        pass
