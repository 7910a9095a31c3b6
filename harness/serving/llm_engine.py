"""A generative backend (mlharness.sut.backends.llm_*) bridged to asyncio for `mlharness serve --openai`:
a request's prompt ids go in (`LLMEngine.submit`), its token ids come back as an async iterator on the
event loop (`Generation`).

- An engine with `open_batch` (transformers): one continuous-batching session for the server's life.
  Every request is submitted as it arrives; the engine's scheduler admits it at the next step while the
  batch has room (`max_sequences`), else it waits in the engine's queue, so concurrent requests share
  the forward steps.
- An engine without it (llama.cpp): one worker thread generates one sequence at a time
  (`backend.generate`); requests wait in arrival order.
Engine callbacks come on the engine's threads; tokens reach the loop through `call_soon_threadsafe`.

Per-request max_tokens: the backends generate up to the manifest's generation.max_new_tokens (the
server's ceiling; the app refuses more). The bridge ends a request after max_tokens tokens with
finish_reason "length" and stops the engine's work on it by raising from its token callback: llama.cpp's
loop ends there, transformers' session drops the sequence from its dispatch (its manager runs it on to
the ceiling unseen: at most max_new_tokens - max_tokens steps of one sequence). A client that leaves is
stopped the same way at its next token.

The stop token (eos, or a generation.stop string) ends a request with finish_reason "stop". It is not
yielded, so it is neither sent as text nor counted in completion_tokens (as llama.cpp's server counts).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.manifests import HardwareManifest, ModelManifest
from mlharness.sut import backends
from mlharness.sut.runtime import resolve_sources

ROLES = ("system", "user", "assistant")  # the turns the chat templates served here take


class PromptError(ValueError):
    """A prompt the engine cannot take (its chat template refused the turns): the client's mistake."""


class EngineError(RuntimeError):
    """The engine failed a request."""


class _Halt(Exception):
    """Raised from an engine's token callback to end its work on a sequence (max_tokens, or the client left)."""


def load_backend(model: ModelManifest, backend_name: str, hardware: HardwareManifest,
                 options: dict[str, Any]) -> Any:
    """The generative backend loaded as a run loads it (mlharness.sut.llm.runtime): sources verified."""
    backend = backends.create(backend_name, model=model, sources=resolve_sources(model), hardware=hardware,
                              options=options)
    backend.load()
    return backend


_End = Union[str, BaseException]  # a finish reason, or the engine's error


class Generation:
    """One request's generated token ids (the stop token left out) as an async iterator, read on the loop;
    when it ends, `finish_reason` is "stop" or "length" and `tokens` holds every id it yielded. An engine
    failure raises EngineError from the iterator (`finish_reason` "error"). `cancel()` stops the engine's
    work at its next token (a request still waiting for the llama.cpp worker is skipped)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, prompt_tokens: int, max_tokens: int, stop_ids: frozenset[int]):
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.cancelled = False
        self._loop, self._stop_ids = loop, stop_ids
        self._items: asyncio.Queue[int | _End] = asyncio.Queue()
        self._made = 0  # engine side: tokens passed on
        self._ended = False  # engine side: the end was posted

    # the engine's thread ------------------------------------------------------------------------
    def on_token(self, token: int, position: int) -> None:
        if self.cancelled or self._ended:
            raise _Halt()
        if token in self._stop_ids:
            self._end("stop")  # the engine ends the sequence itself
            return
        self._made += 1
        self._post(int(token))
        if self._made >= self.max_tokens:
            self._end("length")
            raise _Halt()

    def on_done(self, error: BaseException | None) -> None:
        """The engine is done with the sequence: without a stop token it reached the ceiling ("length")."""
        if error is not None and not isinstance(error, _Halt):
            self._end(EngineError(f"the engine failed the request: {type(error).__name__}: {error}"))
        else:
            self._end("length")  # a no-op once "stop" or "length" was posted

    def _end(self, end: _End) -> None:
        if not self._ended:
            self._ended = True
            self._post(end)

    def _post(self, item: int | _End) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is gone and nobody reads this request
            self.cancelled = True

    # the event loop ----------------------------------------------------------------------------
    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> int:
        if self.finish_reason is not None:
            raise StopAsyncIteration
        item = await self._items.get()
        if isinstance(item, int):
            self.tokens.append(item)
            return item
        if isinstance(item, BaseException):
            self.finish_reason = "error"
            raise item
        self.finish_reason = item
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class IncrementalText:
    """The text of a growing list of token ids, piece by piece: the whole is decoded each time and the new
    suffix returned, held back while it ends in a cut multi-byte character (U+FFFD)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode, self._ids, self.text = decode, [], ""

    def add(self, token: int) -> str:
        self._ids.append(token)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.text = text[len(self.text):], text  # a tokenizer that rewrote earlier text: best effort
        return piece

    def rest(self) -> str:
        """What is still held back once the sequence has ended (a cut character, as the decoder shows it)."""
        text = self._decode(self._ids)
        piece, self.text = text[len(self.text):], text
        return piece


class LLMEngine:
    """A loaded generative backend served to the event loop. `submit` is called on the loop."""

    def __init__(self, backend: Any, loop: asyncio.AbstractEventLoop, max_sequence_tokens: int):
        self.backend, self.loop = backend, loop
        self.stop_ids = frozenset(int(t) for t in backend.stop_ids)
        self.max_new_tokens = int(backend.max_new_tokens)  # the ceiling of a request's max_tokens
        self.max_sequence_tokens = max_sequence_tokens  # prompt and new tokens
        self.prompts = _PROMPTS[backend.name](backend)

    def describe(self) -> str:
        raise NotImplementedError

    def chat_prompt(self, messages: list[dict[str, str]]) -> np.ndarray:
        return self.prompts.chat(messages)

    def text_prompt(self, prompt: str) -> np.ndarray:
        return self.prompts.text(prompt)

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(np.asarray(ids, dtype=np.int64))

    def submit(self, prompt_ids: np.ndarray, max_tokens: int) -> Generation:
        generation = Generation(self.loop, len(prompt_ids), max_tokens, self.stop_ids)
        self._start(generation, prompt_ids)
        return generation

    def _start(self, generation: Generation, prompt_ids: np.ndarray) -> None:
        raise NotImplementedError

    def close(self, timeout: float) -> None:
        raise NotImplementedError


class BatchedEngine(LLMEngine):
    def __init__(self, backend: Any, loop: asyncio.AbstractEventLoop, max_sequence_tokens: int, max_sequences: int):
        super().__init__(backend, loop, max_sequence_tokens)
        self.max_sequences = max_sequences
        self._session = backend.open_batch(max_sequences, max_sequence_tokens)

    def describe(self) -> str:
        return f"continuous batching of up to {self.max_sequences} sequences"

    def _start(self, generation: Generation, prompt_ids: np.ndarray) -> None:
        self._session.submit(prompt_ids, generation.on_token, lambda _tokens, error: generation.on_done(error))

    def close(self, timeout: float) -> None:
        self._session.close()  # sequences still running fail (the server has stopped taking them)


class SequentialEngine(LLMEngine):
    def __init__(self, backend: Any, loop: asyncio.AbstractEventLoop, max_sequence_tokens: int):
        super().__init__(backend, loop, max_sequence_tokens)
        self._queue: queue.SimpleQueue[tuple[Generation, np.ndarray] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._serve, name="mlharness-openai-engine", daemon=True)
        self._worker.start()

    def describe(self) -> str:
        return "one sequence at a time"

    def _start(self, generation: Generation, prompt_ids: np.ndarray) -> None:
        self._queue.put((generation, prompt_ids))

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            generation, prompt_ids = item
            if generation.cancelled:  # the client left while it waited
                continue
            try:
                self.backend.generate(prompt_ids, generation.on_token)
                generation.on_done(None)
            except BaseException as exc:  # noqa: BLE001 - the request fails with it; the worker serves the next
                generation.on_done(exc)

    def close(self, timeout: float) -> None:
        self._queue.put(None)
        self._worker.join(timeout)  # the sequence under way ends at max_new_tokens


def open_engine(backend: Any, loop: asyncio.AbstractEventLoop, max_sequences: int,
                max_sequence_tokens: int) -> LLMEngine:
    """Batched where the backend can batch (open_batch), else one sequence at a time."""
    if hasattr(backend, "open_batch"):
        return BatchedEngine(backend, loop, max_sequence_tokens, max_sequences)
    return SequentialEngine(backend, loop, max_sequence_tokens)


# prompts: each engine's own tokenizer and chat template -----------------------------------------------
def with_system_turn(spec: Any, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The manifest's system turn first when the request has none (as backend.encode does for one prompt)."""
    if spec.system_prompt is None or any(m["role"] == "system" for m in messages):
        return messages
    return [{"role": "system", "content": spec.system_prompt}, *messages]


class TransformersPrompts:
    def __init__(self, backend: Any):
        self.backend, self.tokenizer = backend, backend.tokenizer

    def chat(self, messages: list[dict[str, str]]) -> np.ndarray:
        turns = with_system_turn(self.backend.model.generation, messages)
        text = _render(lambda: self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False))
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)

    def text(self, prompt: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(prompt), dtype=np.int64)  # backend.encode without a template


class LlamaCppPrompts:
    def __init__(self, backend: Any):
        self.backend, self.llm = backend, backend.llm

    def chat(self, messages: list[dict[str, str]]) -> np.ndarray:
        template = self.backend.template
        if template is None:
            raise PromptError(f"{self.backend.model.name} has no chat template here; use /v1/completions")
        text = _render(lambda: template(messages=with_system_turn(self.backend.model.generation, messages)).prompt)
        return np.asarray(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True), dtype=np.int64)

    def text(self, prompt: str) -> np.ndarray:  # backend.encode without a template
        return np.asarray(self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True), dtype=np.int64)


_PROMPTS: dict[str, Callable[[Any], Any]] = {"transformers": TransformersPrompts, "llama_cpp": LlamaCppPrompts}


def _render(render: Callable[[], str]) -> str:
    """The chat template's text; a template that refuses the turns (Jinja's raise_exception) is the client's mistake."""
    import jinja2  # both engines' chat templates are Jinja (installed with torch and llama-cpp-python, not the harness)

    try:
        return render()
    except jinja2.TemplateError as exc:
        raise PromptError(f"the chat template refused the messages: {exc}") from None


def check_servable(backend_name: str, model_path: Path) -> None:
    if backend_name not in _PROMPTS:
        raise UserError(f"{model_path}: --openai serves the {', '.join(_PROMPTS)} engines, not {backend_name!r}")
