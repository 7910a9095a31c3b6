"""The transformers engine for generative models (issue 19): a causal LM loaded from a GGUF file
(transformers dequantizes it to fp32 with the `gguf` package), its tokenizer and chat template from the
same file, and a greedy decode loop of its own that reports every token as it is made, so the SUT can
tell LoadGen the first token's time (FirstTokenComplete) and the finished sequence's token count.

One sequence at a time (static batch 1): continuous batching is not built yet. `predict` is not the
way in: generative models run through sut.llm, never through the tensor SUT."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness.errors import UserError
from sut.backends.base import Backend

GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path, role: str = "weights") -> None:
    """A file that is not GGUF is refused in one line before transformers sees it."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != GGUF_MAGIC:
        raise UserError(f"sources.{role}: {path} is not a GGUF file (its first bytes are {head!r}, "
                        f"a GGUF file starts with {GGUF_MAGIC!r})")


class TransformersLLMBackend(Backend):
    name = "transformers"
    framework = "transformers"
    generative = True

    def load(self) -> None:
        spec = self.model.generation
        if spec is None:
            raise UserError(f"{self.model.path}: generation: the transformers backend runs generative models only")
        weights = self.sources.get("weights")
        if weights is None:
            raise UserError(f"{self.model.path}: sources.weights: expected the model's GGUF file")
        check_gguf(Path(weights))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file; never the hub
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        if self.intra_op_threads:
            torch.set_num_threads(self.intra_op_threads)
        hf_logging.disable_progress_bar()
        folder, name = str(Path(weights).parent), Path(weights).name
        # transformers' GGUF reader draws a tqdm bar of its own on stderr (not its logging's): silence it.
        import functools

        from transformers import modeling_gguf_pytorch_utils as gguf_utils

        bar = getattr(gguf_utils, "tqdm", None)
        if bar is not None:
            gguf_utils.tqdm = functools.partial(bar, disable=True)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            self.lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except (ValueError, OSError, KeyError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"sources.weights: transformers cannot load {weights}: {first}") from None
        finally:
            if bar is not None:
                gguf_utils.tqdm = bar
        self.lm.eval()
        self._torch = torch
        own_window = int(getattr(self.lm.config, "max_position_embeddings", 0) or 0)
        if spec.context_window and own_window and spec.context_window > own_window:
            raise UserError(f"{self.model.path}: generation.context_window: expected at most the model's own "
                            f"{own_window} tokens, got {spec.context_window}")
        self.context_window = spec.context_window or own_window
        eos = self.tokenizer.eos_token_id
        self.stop_ids = {int(eos)} if eos is not None else set()
        for text in spec.stop:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) != 1:
                raise UserError(f"{self.model.path}: generation.stop: expected strings that are one token each, "
                                f"got {text!r} ({len(ids)} tokens)")
            self.stop_ids.add(int(ids[0]))
        self.max_new_tokens = spec.max_new_tokens

    # prompts ---------------------------------------------------------------------------------
    def encode(self, prompt: str) -> np.ndarray:
        """The prompt's token ids (int64), in the chat template as one user turn when the manifest asks."""
        spec = self.model.generation
        if spec.chat_template:
            turns = ([{"role": "system", "content": spec.system_prompt}] if spec.system_prompt is not None else []) \
                + [{"role": "user", "content": prompt}]
            text = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(prompt)
        return np.asarray(ids, dtype=np.int64)

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

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise UserError("the transformers backend generates tokens (sut.llm); it has no one-shot predict")

    def close(self) -> None:
        self.lm = None
        self.tokenizer = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": "transformers (fp32, dequantized from GGUF)",
                "decoding": "greedy", "batching": "static, one sequence at a time",
                "context_window": getattr(self, "context_window", None),
                "max_new_tokens": getattr(self, "max_new_tokens", None)}

    @property
    def supports_batching(self) -> bool:
        return False
