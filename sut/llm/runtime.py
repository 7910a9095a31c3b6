"""The runtime of a generative model: its engine loaded, the dataset's prompts tokenized (once, before
LoadGen starts, so a prompt too long for the context window is refused before any test), and the
warm-up. It has the shape of mlharness.sut.runtime.Runtime where the runner reads one (model, dataset, backend,
staged, ctx, artifacts, cold_start, labels), with `generative = True`."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.manifests import DatasetManifest, HardwareManifest, ModelManifest
from mlharness.sut import backends
from mlharness.sut.processing import ProcessingContext
from mlharness.sut.runtime import _timed, describe_sources, enumerate_samples, resolve_sources
from mlharness.sut.warmup import timed_warm_up


class PromptSet:
    """The query sample library of a generative model: each sample's prompt token ids, tokenized up
    front. LoadQuerySamples only marks which samples LoadGen may ask for (nothing to copy)."""

    def __init__(self, items: list[tuple[Any, Any]], token_ids: list[np.ndarray]):
        self.items = items
        self.token_ids = token_ids
        self.loaded: set[int] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def load_samples(self, indices: Sequence[int]) -> None:
        with self._lock:
            self.loaded.update(int(i) for i in indices)

    def unload_samples(self, indices: Sequence[int]) -> None:
        with self._lock:
            self.loaded.difference_update(int(i) for i in indices)

    def prompt(self, index: int) -> np.ndarray:
        return self.token_ids[index]

    def labels(self) -> list[Any]:
        return [item[1] for item in self.items]


@dataclass
class LLMRuntime:
    model: ModelManifest
    dataset: DatasetManifest
    backend: Any  # a generative backend (encode, decode, generate)
    staged: PromptSet
    ctx: ProcessingContext
    sources: dict[str, Path] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    cold_start: dict[str, Any] = field(default_factory=dict)
    postprocess: Any = None
    generative: bool = True

    @property
    def labels(self) -> list[Any]:
        return self.staged.labels()

    def decode(self, ids: Any) -> str:
        return self.backend.decode(ids)


def for_dataset(model: ModelManifest, dataset: DatasetManifest) -> ModelManifest:
    """The model as it answers this dataset's prompts: the dataset's generation.max_new_tokens, where it
    declares one, replaces the model's (an answer's length belongs to the task: a label, a summary)."""
    if dataset.max_new_tokens is None or model.generation is None:
        return model
    generation = model.generation.model_copy(update={"max_new_tokens": dataset.max_new_tokens})
    return model.model_copy(update={"generation": generation})  # the same file, path and sha256


def build_llm_runtime(model: ModelManifest, dataset: DatasetManifest, hardware: HardwareManifest,
                      backend_name: str, options: dict[str, Any]) -> LLMRuntime:
    """Resolve and verify the weights, enumerate the prompts (the dataset's samples: (prompt text, label)),
    load the engine (with the dataset's max_new_tokens, see for_dataset), tokenize every prompt; each
    phase timed into cold_start."""
    model = for_dataset(model, dataset)
    if backend_name == "null":
        raise UserError(f"{model.path}: the null backend does not generate tokens; run a generative model on "
                        f"{model.framework}")
    seconds: dict[str, Any] = {}
    with _timed(seconds, "resolve_seconds"):
        model_sources = resolve_sources(model)
        dataset_sources = resolve_sources(dataset)
    ctx = ProcessingContext(attributes=dict(model.attributes), sources={**dataset_sources, **model_sources},
                            model=model, dataset=dataset)
    with _timed(seconds, "enumerate_seconds"):
        items = enumerate_samples(dataset, ctx, int(options.get("dataset_limit") or 0))
    check_prompts(items, dataset)
    with _timed(seconds, "load_seconds"):
        backend = backends.create(backend_name, model=model, sources=model_sources, hardware=hardware, options=options)
        backend.load()
    with _timed(seconds, "tokenize_seconds"), _closed_on_error(backend):
        token_ids = tokenize_prompts(backend, [prompt for prompt, _ in items], model, str(dataset.path))
    described = {**describe_sources(dataset, dataset_sources), **describe_sources(model, model_sources)}
    prompt_lengths = [len(ids) for ids in token_ids]
    seconds["prompt_tokens_mean"] = float(np.mean(prompt_lengths)) if prompt_lengths else 0.0
    seconds["prompt_tokens_max"] = max(prompt_lengths, default=0)
    return LLMRuntime(model, dataset, backend, PromptSet(items, token_ids), ctx,
                      {**dataset_sources, **model_sources}, described, cold_start=seconds)


@contextmanager
def _closed_on_error(backend: Any) -> Iterator[None]:
    """A refused prompt must not leave the engine (its memory, its threads) loaded."""
    try:
        yield
    except BaseException:
        backend.close()
        raise


def check_prompts(items: Sequence[tuple[Any, Any]], dataset: DatasetManifest) -> None:
    """Every sample a prompt with text in it, or a UserError naming the dataset file and the sample."""
    for i, (prompt, _) in enumerate(items):
        if not isinstance(prompt, str):
            raise UserError(f"{dataset.path}: samples: item {i}: expected a prompt string for a generative model, "
                            f"got {type(prompt).__name__}")
        if not prompt.strip():  # the chat template would send the model a turn without words
            raise UserError(f"{dataset.path}: samples: item {i}: expected a prompt with text in it, got {prompt!r}")


def tokenize_prompts(backend: Any, prompts: Sequence[str], model: ModelManifest, where: str) -> list[np.ndarray]:
    """Each prompt's token ids; a prompt that leaves no room for max_new_tokens in the engine's context
    window is refused in one line naming the sample, before LoadGen starts."""
    window, new = backend.context_window, model.generation.max_new_tokens
    token_ids = []
    for i, prompt in enumerate(prompts):
        ids = backend.encode(prompt)
        if window and len(ids) + new > window:
            raise UserError(f"{where}: sample {i}: the prompt is {len(ids)} tokens; with max_new_tokens {new} "
                            f"that exceeds {model.name}'s context window of {window} tokens")
        token_ids.append(ids)
    return token_ids


def first_generation_and_warm_up(runtime: LLMRuntime, queries: int, seconds: float) -> dict[str, Any]:
    """Time one whole generation (the first sample), then generate the first samples again (cycled) until
    `queries` generations ran and `seconds` passed: torch's first calls do lazy work."""
    backend = runtime.backend
    count = len(runtime.staged)
    started = time.perf_counter()
    backend.generate(runtime.staged.prompt(0))
    first = time.perf_counter() - started
    warmup = timed_warm_up(lambda i: backend.generate(runtime.staged.prompt(i % count)), 1, queries, seconds)
    return {"first_inference_seconds": first, "warmup": warmup}
