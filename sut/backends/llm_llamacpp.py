"""The llama.cpp engine for generative models (issue 19): the GGUF file run by llama.cpp itself through
llama-cpp-python (`llama_cpp.Llama`, built from source by `make setup`, docs/llm.md), with the weights as
the file stores them (Q4_1 here; the transformers engine dequantizes them to fp32). The tokenizer is the
model's own (llama.cpp's vocabulary from the GGUF file) and the chat template is the GGUF's own
`tokenizer.chat_template`, rendered by llama-cpp-python's Jinja2 chat formatter (the same Jinja settings
as transformers'), so a prompt becomes the same token ids as on the transformers engine.

Greedy decoding (llama.cpp's greedy sampler: temperature 0), one token per `Llama.generate` step, each
reported as it is made so the SUT can call FirstTokenComplete at the first. The KV cache is cleared
before every sequence: llama-cpp-python would otherwise reuse the previous prompt's matching prefix
(the chat template's system turn), which would make a sample's time and even its tokens depend on the
sample before it.

One sequence at a time: llama-cpp-python's high-level API holds one sequence per context (its
`Llama` object has one token history and one sampler), so it offers no parallel sequences usable from
Python; there is no `open_batch`, and the token SUT runs this engine sequentially in every scenario."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mlharness.errors import UserError
from mlharness.sut.backends.base import Backend
from mlharness.sut.backends.llm_transformers import (
    chat_template_failure,
    chat_turns,
    gguf_weights,
    reader_reason,
    stop_token_ids,
)

# What llama-cpp-python raises for a file llama.cpp cannot open (the engine and the client tokenizer).
LLAMA_CPP_READ_ERRORS = (ValueError, RuntimeError, OSError)
SEED = 0  # fixed; greedy decoding draws no random numbers, but nothing is left to a random seed


class LlamaCppLLMBackend(Backend):
    name = "llama_cpp"
    framework = "llama_cpp"
    generative = True

    def load(self) -> None:
        weights = gguf_weights(self)
        spec = self.model.generation
        import jinja2
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        # intra_op_threads (the hardware manifest's, or the run's --set) for the decode steps and the prompt
        # alike; 0 leaves llama-cpp-python's defaults (half the CPUs decode, all of them prefill).
        threads = self.intra_op_threads or None
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(weights), n_ctx=int(spec.context_window or 0),  # 0: the model's own window
                n_threads=threads, n_threads_batch=threads, seed=SEED, logits_all=False, verbose=False)
        except LLAMA_CPP_READ_ERRORS as exc:
            raise UserError(f"sources.weights: llama.cpp cannot load {weights}: {reader_reason(exc)}") from None
        except jinja2.TemplateError as exc:  # Llama compiles every chat template in the file's metadata
            raise chat_template_failure(self, weights, exc, "llama.cpp compiles it when it opens the file, "
                                                            "asked for or not") from None
        self.threads = {"decode": int(self.llm.context_params.n_threads),
                        "prompt": int(self.llm.context_params.n_threads_batch)}
        own_window = int(self.llm._model.n_ctx_train())
        if spec.context_window and own_window and spec.context_window > own_window:
            raise UserError(f"{self.model.path}: generation.context_window: expected at most the model's own "
                            f"{own_window} tokens, got {spec.context_window}")
        # The manifest's window when it sets one (llama.cpp may pad its context beyond it), else the model's.
        self.context_window = int(spec.context_window or self.llm.n_ctx())
        self.template = None
        if spec.chat_template:
            text = self.llm.metadata.get("tokenizer.chat_template")
            if not text:
                raise UserError(f"sources.weights: {weights} has no tokenizer.chat_template, and "
                                f"{self.model.path} asks for the chat template (generation.chat_template: true)")
            vocab = self.llm._model
            try:
                self.template = Jinja2ChatFormatter(
                    template=text, eos_token=vocab.token_get_text(self.llm.token_eos()),
                    bos_token=vocab.token_get_text(self.llm.token_bos()), add_generation_prompt=True)
            except Exception as exc:  # noqa: BLE001 - the template is the file's code: jinja compiles it here
                raise chat_template_failure(self, weights, exc) from None
            self.weights = weights
            self._chat_text("probe")  # one that compiles but will not render fails here too
        self.stop_ids = stop_token_ids(self, int(self.llm.token_eos()),
                                       lambda text: self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        self.max_new_tokens = spec.max_new_tokens

    # prompts ---------------------------------------------------------------------------------
    def encode(self, prompt: str) -> np.ndarray:
        """The prompt's token ids (int64), in the chat template as one user turn when the manifest asks;
        special tokens written in the text (<|im_start|>) are parsed as such, as transformers does."""
        if self.template is not None:
            text = self._chat_text(prompt)
            ids = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        else:  # the model's own BOS/EOS flags decide what is added
            ids = self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        return np.asarray(ids, dtype=np.int64)

    def _chat_text(self, prompt: str) -> str:
        try:
            return self.template(messages=chat_turns(self.model.generation, prompt)).prompt
        except Exception as exc:  # noqa: BLE001 - the template is the file's code: jinja's errors
            raise chat_template_failure(self, self.weights, exc) from None

    def decode(self, ids: np.ndarray) -> str:
        return self.llm.detokenize([int(i) for i in ids], special=False).decode("utf-8", errors="replace")

    # generation ------------------------------------------------------------------------------
    def generate(self, prompt_ids: np.ndarray, on_token: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Greedy decoding of one sequence: prefill the prompt, then one token per step, until a stop token
        (kept, and counted) or max_new_tokens. `on_token(token_id, position)` is called as each token is
        chosen (position 0 is the first). Returns the generated ids (int64)."""
        llm = self.llm
        out = np.empty(self.max_new_tokens, dtype=np.int64)
        count = 0
        llm.reset()  # no prefix reuse from the previous sequence (see the module's docstring)
        steps = llm.generate([int(t) for t in prompt_ids], top_k=1, temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for token in steps:
                out[count] = token
                if on_token is not None:
                    on_token(int(token), count)
                count += 1
                if token in self.stop_ids or count >= self.max_new_tokens:
                    break
        finally:
            steps.close()
        return out[:count]

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise UserError("the llama_cpp backend generates tokens (mlharness.sut.llm); it has no one-shot predict")

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.close()

    def describe(self) -> dict[str, Any]:
        import llama_cpp

        return {**super().describe(), "engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, "
                                                f"weights as stored in the GGUF file)",
                "threads": getattr(self, "threads", None), "decoding": "greedy",
                "batching": "one sequence at a time (llama-cpp-python's Llama holds one sequence)",
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                "context_window": getattr(self, "context_window", None),
                "max_new_tokens": getattr(self, "max_new_tokens", None)}

    @property
    def supports_batching(self) -> bool:
        return False
