"""What the LLM benchmarks share (bench/llm_efficiency.py, bench/llm_llamacpp_efficiency.py): an
engine loaded as a run loads it, outside LoadGen, and the dataset's prompts as that engine's token
ids, so a plain loop and mlharness start from the same prompts."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def load_engine(model_name: str, backend: str, threads: int, dataset: str | None = None) -> Any:
    """The harness's engine for `model_name` on `backend`, loaded with `threads` intra-op threads, generating
    as many tokens as `dataset` asks (its generation.max_new_tokens; default: the model's dataset)."""
    from mlharness.running.resolve import select_model
    from mlharness.specs import artifacts
    from mlharness.specs.index import default_index
    from mlharness.sut import backends
    from mlharness.sut.llm.runtime import for_dataset

    index = default_index()
    model = select_model(index, model_name, backend)
    model = for_dataset(model, index.find("dataset", dataset or model.default_dataset))
    engine = backends.create(backend, model=model, sources=artifacts.resolve_all(model),
                             hardware=index.find("hardware", "cpu"), options={"intra_op_threads": threads})
    engine.load()
    return engine


def prompt_ids(engine: Any, count: int, dataset: str | None = None) -> list[list[int]]:
    """The first `count` prompts of `dataset` (default: the engine's model's), as the engine tokenizes them."""
    from mlharness.specs.index import default_index
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    dataset = default_index().find("dataset", dataset or engine.model.default_dataset)
    ctx = ProcessingContext(attributes={}, sources=resolve_sources(dataset), model=engine.model, dataset=dataset)
    return [engine.encode(prompt).tolist() for prompt, _ in enumerate_samples(dataset, ctx, count)]


def harness_run_record(model_name: str, backend: str, scenario: str, threads: int, prompts: int, warmup: int,
                       overrides: list[str], command: str, dataset: str | None = None) -> Any:
    """A quick mlharness run of the first `prompts` prompts of `dataset` (default: the model's) on `backend`
    (no tuned settings, its results in a folder removed afterwards); its RunRecord."""
    from mlharness import RunRequest, run

    with tempfile.TemporaryDirectory(prefix="mlharness-bench-") as scratch:
        return run(RunRequest(model=model_name, scenario=scenario, backend=backend, dataset=dataset, quick=True,
                              overrides=(f"intra_op_threads={threads}", f"dataset_limit={prompts}",
                                         f"warmup_queries={warmup}", *overrides),
                              results_dir=Path(scratch), use_tuned=False, quiet=True, command=command))


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds for a printed line; '-' where there is no figure."""
    return f"{ns / 1e6:.1f}" if ns else "-"
