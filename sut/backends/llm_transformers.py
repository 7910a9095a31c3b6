"""The transformers engine for generative models (issue 19): a causal LM loaded from a GGUF file
(transformers dequantizes it to fp32 with the `gguf` package), its tokenizer and chat template from the
same file, and a greedy decode loop of its own that reports every token as it is made, so the SUT can
tell LoadGen the first token's time (FirstTokenComplete) and the finished sequence's token count.

Two ways to generate:
- `generate(prompt_ids, on_token)`: one sequence, the engine's own greedy loop (prefill, then one token a
  step with a DynamicCache). SingleStream uses it, and it is the "plain loop" bench/llm_efficiency.py
  compares with.
- `open_batch(max_sequences, max_sequence_tokens)`: a session over transformers' own continuous
  batching (`init_continuous_batching`, a ContinuousBatchingManager): sequences submitted to it share
  every forward step (ragged, no padding: each step packs the new prompts' tokens and one token of every
  decoding sequence), the KV cache is paged and a finished sequence's pages are freed at once. The SUT
  (mlharness.sut.llm.token_sut) decides when a sequence is submitted (continuous or static batching).
`predict` is not the way in: generative models run through mlharness.sut.llm, never through the tensor SUT."""
from __future__ import annotations

import itertools
import math
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlharness.errors import UserError
from mlharness.sut.backends.base import Backend

GGUF_MAGIC = b"GGUF"
# What transformers' GGUF reader raises for a file it cannot read: a file cut short comes out of the gguf
# package's struct reads as struct.error (not a ValueError).
GGUF_READ_ERRORS = (ValueError, OSError, KeyError, struct.error)


def reader_reason(exc: BaseException) -> str:
    """A GGUF reader's own reason, for the one-line error: its first line, or its type when it gives none."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def check_gguf(path: Path, role: str = "weights") -> None:
    """A file that is not GGUF is refused in one line before transformers sees it."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != GGUF_MAGIC:
        raise UserError(f"sources.{role}: {path} is not a GGUF file (its first bytes are {head!r}, "
                        f"a GGUF file starts with {GGUF_MAGIC!r})")


def gguf_weights(backend: Backend) -> Path:
    """A generative backend's weights file, checked before its engine opens it: the model must be
    generative and name its GGUF file in sources.weights, and the file must be GGUF."""
    if backend.model.generation is None:
        raise UserError(f"{backend.model.path}: generation: the {backend.name} backend runs generative models only")
    weights = backend.sources.get("weights")
    if weights is None:
        raise UserError(f"{backend.model.path}: sources.weights: expected the model's GGUF file")
    check_gguf(Path(weights))
    return Path(weights)


def stop_token_ids(backend: Backend, eos: int | None, tokenize: Callable[[str], list[int]]) -> set[int]:
    """The ids that end a sequence: the end-of-sequence token (None or negative: none) and each of the
    manifest's stop strings, which must be one token each in the engine's own vocabulary."""
    stop = {int(eos)} if eos is not None and int(eos) >= 0 else set()
    for text in backend.model.generation.stop:
        ids = tokenize(text)
        if len(ids) != 1:
            raise UserError(f"{backend.model.path}: generation.stop: expected strings that are one token each, "
                            f"got {text!r} ({len(ids)} tokens)")
        stop.add(int(ids[0]))
    return stop


def chat_turns(spec: Any, prompt: str) -> list[dict[str, str]]:
    """The prompt as one user turn, after the manifest's system turn when it has one (else the
    template's own default system turn applies)."""
    system = [{"role": "system", "content": spec.system_prompt}] if spec.system_prompt is not None else []
    return system + [{"role": "user", "content": prompt}]


def chat_template_failure(backend: Backend, weights: Path, exc: Exception, why: str | None = None) -> UserError:
    """A GGUF's tokenizer.chat_template that does not compile or render, in one line naming the file
    and why it is read: the manifest asks for it, unless `why` says otherwise (jinja's own error names
    neither)."""
    text = str(exc).strip()
    line = getattr(exc, "lineno", None)  # jinja's syntax errors carry the template's line
    where = f" (template line {line})" if line else ""
    why = why or f"{backend.model.path} asks for the chat template (generation.chat_template: true)"
    return UserError(f"sources.weights: {weights}: its tokenizer.chat_template does not render{where}: "
                     f"{type(exc).__name__}{': ' + text.splitlines()[0] if text else ''}; {why}")


class TransformersLLMBackend(Backend):
    name = "transformers"
    framework = "transformers"
    generative = True
    batch_admits_at_every_step = True  # open_batch's manager schedules waiting sequences at every step

    def load(self) -> None:
        weights = gguf_weights(self)
        spec = self.model.generation
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file; never the hub
        import torch
        from transformers.utils import logging as hf_logging

        from mlharness.sut.llm import gguf_unpacked

        if self.intra_op_threads:
            torch.set_num_threads(self.intra_op_threads)
        hf_logging.disable_progress_bar()
        self.weights = weights
        try:
            self.tokenizer = gguf_unpacked.load_tokenizer(weights)
            if spec.chat_template:  # a template that will not render fails before the weights load
                self._chat_text("probe")
            self.lm = gguf_unpacked.load_model(weights)
        except GGUF_READ_ERRORS as exc:
            raise UserError(f"sources.weights: transformers cannot load {weights}: {reader_reason(exc)}") from None
        self.lm.eval()
        self._torch = torch
        own_window = int(getattr(self.lm.config, "max_position_embeddings", 0) or 0)
        if spec.context_window and own_window and spec.context_window > own_window:
            raise UserError(f"{self.model.path}: generation.context_window: expected at most the model's own "
                            f"{own_window} tokens, got {spec.context_window}")
        self.context_window = spec.context_window or own_window
        self.stop_ids = stop_token_ids(self, self.tokenizer.eos_token_id,
                                       lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        self.max_new_tokens = spec.max_new_tokens

    # prompts ---------------------------------------------------------------------------------
    def encode(self, prompt: str) -> np.ndarray:
        """The prompt's token ids (int64), in the chat template as one user turn when the manifest asks."""
        spec = self.model.generation
        if spec.chat_template:
            ids = self.tokenizer.encode(self._chat_text(prompt), add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(prompt)
        return np.asarray(ids, dtype=np.int64)

    def _chat_text(self, prompt: str) -> str:
        try:
            return self.tokenizer.apply_chat_template(chat_turns(self.model.generation, prompt),
                                                      add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # noqa: BLE001 - the template is the file's code: jinja's errors, a missing one
            raise chat_template_failure(self, self.weights, exc) from None

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    # generation ------------------------------------------------------------------------------
    def generate(self, prompt_ids: np.ndarray, on_token: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Greedy decoding of one sequence: prefill the prompt, then one token per step with the KV cache,
        until a stop token (kept, and counted) or max_new_tokens. `on_token(token_id, position)` is called
        as each token is chosen (position 0 is the first token). Returns the generated ids (int64)."""
        torch = self._torch
        out = np.empty(self.max_new_tokens, dtype=np.int64)
        count = 0
        with torch.inference_mode():
            step_input = torch.from_numpy(prompt_ids).view(1, -1)
            past = None
            while count < self.max_new_tokens:
                result = self.lm(input_ids=step_input, past_key_values=past, use_cache=True)
                past = result.past_key_values
                token = int(result.logits[0, -1].argmax())
                out[count] = token
                if on_token is not None:
                    on_token(token, count)
                count += 1
                if token in self.stop_ids:
                    break
                step_input = torch.tensor([[token]], dtype=torch.long)
        return out[:count]

    def batch_configs(self, max_sequences: int, max_sequence_tokens: int) -> tuple[Any, Any]:
        """(GenerationConfig, ContinuousBatchingConfig) of a batch session: greedy to max_new_tokens or a stop
        token; a paged cache of 32-token pages for `max_sequences` sequences of `max_sequence_tokens`, at most
        `max_sequences` sequences in a step (bench/llm_efficiency.py gives transformers' generate_batch the same)."""
        from transformers import ContinuousBatchingConfig, GenerationConfig

        if max_sequences < 1 or max_sequence_tokens < 1:
            raise UserError(f"the transformers engine's batch needs at least one sequence of one token, got "
                            f"{max_sequences} sequences of {max_sequence_tokens} tokens")
        page = TransformersBatchSession.PAGE_TOKENS
        pages = max_sequences * math.ceil(max_sequence_tokens / page) + max_sequences
        batching = ContinuousBatchingConfig(
            max_requests_per_batch=max_sequences, num_blocks=pages, page_size=page,
            max_batch_tokens=max(256, min(4096, max_sequences * max_sequence_tokens)), scheduler_type="fifo")
        generation = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False,
                                      eos_token_id=sorted(self.stop_ids) or -1)
        return generation, batching

    def open_batch(self, max_sequences: int, max_sequence_tokens: int) -> "TransformersBatchSession":
        """A session of transformers' continuous batching for at most `max_sequences` sequences at once, each
        at most `max_sequence_tokens` long (prompt and new tokens). Close it before `generate` is used again:
        the manager swaps the model's attention to a paged one while it runs."""
        return TransformersBatchSession(self, max_sequences, max_sequence_tokens)

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise UserError("the transformers backend generates tokens (mlharness.sut.llm); it has no one-shot predict")

    def close(self) -> None:
        self.lm = None
        self.tokenizer = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": "transformers (fp32, dequantized from GGUF)",
                "decoding": "greedy",
                "batching": "one sequence at a time (generate) or transformers' continuous batching (open_batch)",
                "context_window": getattr(self, "context_window", None),
                "max_new_tokens": getattr(self, "max_new_tokens", None)}

    @property
    def supports_batching(self) -> bool:
        return False


class TransformersBatchSession:
    """Sequences generated together by transformers' ContinuousBatchingManager (its background thread runs
    the forward steps; at each step its FIFO scheduler adds waiting sequences while there is room in the
    step and in the paged KV cache, and frees a finished sequence's pages). A dispatcher thread here reads
    the manager's streamed outputs and calls each sequence's `on_token(token, position)` for every new
    token and `on_done(tokens, error)` once: the generated ids (int64) or the error.

    The cache is sized for `max_sequences` sequences of `max_sequence_tokens` (pages of 32 tokens); a step
    holds at most `max_sequences` sequences. The manager admits by itself (the engine's
    `batch_admits_at_every_step`): a
    submitted sequence waits in its queue until a step has room, and joins at that step. So for continuous
    batching the SUT submits every query as it arrives; a SUT that gated submissions on its own would
    learn of a finished sequence only after the step that finished it and lose a step per turnover
    (measured: Offline output tokens/s 0.75 of generate_batch's)."""

    PAGE_TOKENS = 32

    def __init__(self, backend: TransformersLLMBackend, max_sequences: int, max_sequence_tokens: int):
        from transformers.utils import logging as hf_logging

        generation, config = backend.batch_configs(max_sequences, max_sequence_tokens)
        # The manager logs each start and stop (and a flash-attention hint) at info/warning level.
        hf_logging.get_logger("transformers.generation.continuous_batching.continuous_api").setLevel(40)
        self.max_new_tokens = backend.max_new_tokens
        self._manager = backend.lm.init_continuous_batching(generation_config=generation,
                                                            continuous_batching_config=config)
        self._sequences: dict[str, list[Any]] = {}  # request id -> [on_token, on_done, tokens reported]
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closing = threading.Event()
        # (start ns, end ns, sequences, query tokens) of each forward step: the profile's batch size per step
        self.steps: list[tuple[int, int, int, int]] = []
        self._record_steps()
        self._manager.start()
        self._dispatcher = threading.Thread(target=self._dispatch, name="mlharness-llm-dispatch", daemon=True)
        self._dispatcher.start()

    def _record_steps(self) -> None:
        """Time each of the manager's forward steps and keep its size: one list append a step. The manager's
        loop calls `self._generation_step()`, so the instance attribute set here is what it runs. A transformers
        without these (private) names runs unrecorded: the profile then has no engine steps."""
        manager, steps, clock = self._manager, self.steps, time.perf_counter_ns
        step = getattr(manager, "_generation_step", None)
        if step is None:
            return

        def timed_step() -> None:
            start = clock()
            step()
            batch = getattr(getattr(manager, "batch_processor", None), "inputs_and_outputs", None)
            steps.append((start, clock(), getattr(batch, "num_request_in_batch", 0), getattr(batch, "num_q_tokens", 0)))

        manager._generation_step = timed_step

    def submit(self, prompt_ids: np.ndarray, on_token: Callable[[int, int], None] | None,
               on_done: Callable[[np.ndarray | None, BaseException | None], None]) -> None:
        request_id = f"seq-{next(self._ids)}"
        with self._lock:
            self._sequences[request_id] = [on_token, on_done, 0]
        added = self._manager.add_request([int(t) for t in prompt_ids], request_id=request_id, streaming=True,
                                          max_new_tokens=self.max_new_tokens)
        if added is None:  # the manager refused it (stopped or failed)
            self._finish(request_id, None, RuntimeError("transformers' continuous batching refused the sequence "
                                                        "(its manager is stopped)"))

    def _finish(self, request_id: str, tokens: np.ndarray | None, error: BaseException | None) -> None:
        with self._lock:
            entry = self._sequences.pop(request_id, None)
        if entry is not None:
            entry[1](tokens, error)

    def _dispatch(self) -> None:
        manager = self._manager
        while True:
            output = manager.get_result(timeout=0.05)
            if output is None:
                if manager.background_thread_status.fatal_error is not None:
                    break
                if self._closing.is_set() and (not self._sequences or not manager.is_running()):
                    break
                continue
            with self._lock:
                entry = self._sequences.get(output.request_id)
            if entry is None:
                continue
            on_token, _, reported = entry
            generated = output.generated_tokens
            try:
                if on_token is not None:
                    for position in range(reported, len(generated)):
                        on_token(int(generated[position]), position)
                entry[2] = len(generated)
            except BaseException as exc:  # the SUT's callback: end this sequence with its error
                self._finish(output.request_id, None, exc)
                continue
            if output.error is not None:
                self._finish(output.request_id, None, RuntimeError(f"transformers' continuous batching: "
                                                                   f"{output.error}"))
            elif output.is_finished():
                self._finish(output.request_id, np.asarray(generated, dtype=np.int64), None)
        error = manager.background_thread_status.fatal_error or RuntimeError(
            "the continuous-batching session closed before the sequence finished")
        for request_id in list(self._sequences):
            self._finish(request_id, None, error if isinstance(error, BaseException) else RuntimeError(str(error)))

    def close(self) -> None:
        """Stop the manager (sequences still running fail with an error) and restore the model's attention."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._manager.stop(block=True, hard_stop=bool(self._sequences))
        self._dispatcher.join()
