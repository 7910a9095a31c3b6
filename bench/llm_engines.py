"""What the LLM benchmarks share (bench/llm_efficiency.py, bench/llm_llamacpp_efficiency.py): an
engine loaded as a run loads it, outside LoadGen, and the dataset's prompts as that engine's token
ids, so a plain loop and mlharness start from the same prompts."""
from __future__ import annotations

from typing import Any


def load_engine(model_name: str, backend: str, threads: int) -> Any:
    """The harness's engine for `model_name` on `backend`, loaded with `threads` intra-op threads."""
    from harness.running.runner import select_model
    from specs import artifacts
    from specs.index import default_index
    from sut import backends

    index = default_index()
    model = select_model(index, model_name, backend)
    engine = backends.create(backend, model=model, sources=artifacts.resolve_all(model),
                             hardware=index.find("hardware", "cpu"), options={"intra_op_threads": threads})
    engine.load()
    return engine


def prompt_ids(engine: Any, count: int) -> list[list[int]]:
    """The first `count` prompts of the engine's model's dataset, as the engine tokenizes them."""
    from specs.index import default_index
    from sut.processing import ProcessingContext
    from sut.runtime import enumerate_samples, resolve_sources

    dataset = default_index().find("dataset", engine.model.default_dataset)
    ctx = ProcessingContext(attributes={}, sources=resolve_sources(dataset), model=engine.model, dataset=dataset)
    return [engine.encode(prompt).tolist() for prompt, _ in enumerate_samples(dataset, ctx, count)]
