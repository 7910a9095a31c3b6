"""The manifest's own tokenizer without its engine, for a run against an LLM server: the server returns
text, and the client counts that text's tokens (its count beside the server's `usage`), turns it into the
token ids LoadGen's accuracy log holds, and decodes them again to score it. The tokenizer is the one the
manifest's framework reads from the GGUF file: llama.cpp's vocabulary alone (`vocab_only`, no weights)
for a llama_cpp manifest, transformers' tokenizer converted from the GGUF for a transformers one."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from mlharness.errors import UserError
from mlharness.specs.manifests import ModelManifest
from mlharness.sut.backends.llm_llamacpp import LLAMA_CPP_READ_ERRORS
from mlharness.sut.backends.llm_transformers import GGUF_READ_ERRORS, check_gguf, reader_reason


class TextTokenizer:
    def __init__(self, name: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 eos_text: str = "", eos_id: int | None = None):
        self.name, self.eos_text = name, eos_text  # eos_text: the end-of-sequence token as text (<|im_end|>)
        self.eos_id = eos_id
        self._encode, self._decode = encode, decode

    def encode(self, text: str) -> np.ndarray:
        """The text's token ids (int64): no beginning-of-sequence token, special tokens written in the
        text (<|im_end|>) parsed as such."""
        return np.asarray(self._encode(text), dtype=np.int64)

    def decode(self, ids: np.ndarray) -> str:
        return self._decode([int(i) for i in ids])


def load_text_tokenizer(model: ModelManifest, sources: dict[str, Any]) -> TextTokenizer:
    weights = sources.get("weights")
    if weights is None:
        raise UserError(f"{model.path}: sources.weights: expected the model's GGUF file (its tokenizer)")
    check_gguf(Path(weights))
    if model.framework == "llama_cpp":
        import llama_cpp

        try:
            with _native_stderr_silenced():  # llama.cpp warns of a context window it is not given (a vocabulary has none)
                vocab = llama_cpp.Llama(model_path=str(weights), vocab_only=True, verbose=False)
        except LLAMA_CPP_READ_ERRORS as exc:
            raise UserError(f"sources.weights: llama.cpp cannot read the vocabulary of {weights}: "
                            f"{reader_reason(exc)}") from None
        return TextTokenizer(f"llama.cpp {llama_cpp.__version__} (vocabulary of {Path(weights).name})",
                             lambda text: vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True),
                             lambda ids: vocab.detokenize(ids, special=False).decode("utf-8", errors="replace"),
                             vocab._model.token_get_text(vocab.token_eos()) if vocab.token_eos() >= 0 else "",
                             vocab.token_eos() if vocab.token_eos() >= 0 else None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file; never the hub
    import transformers

    from mlharness.sut.llm import gguf_unpacked

    try:
        tokenizer = gguf_unpacked.load_tokenizer(Path(weights))
    except GGUF_READ_ERRORS as exc:
        raise UserError(f"sources.weights: transformers cannot read the tokenizer of {weights}: "
                        f"{reader_reason(exc)}") from None
    return TextTokenizer(f"transformers {transformers.__version__} (tokenizer of {Path(weights).name})",
                         lambda text: tokenizer.encode(text, add_special_tokens=False),
                         lambda ids: tokenizer.decode(ids, skip_special_tokens=True), tokenizer.eos_token or "",
                         tokenizer.eos_token_id)


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 on /dev/null for the block: native code writes there past Python's sys.stderr."""
    import sys

    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
