"""A GGUF file unpacked once for transformers, in the artifact cache.

transformers reads a GGUF file by parsing its metadata in Python, element by element (the tokenizer's
49,152-entry vocabulary among it), once for the tokenizer, once for the config and once for the weights,
then dequantizes every tensor: 25 s of a 28 s load for smollm2-135m's 90 MB file on a 2-core machine, in
every run. The first load saves what transformers made (the tokenizer's files; the fp32 model as
safetensors) in `$MLHARNESS_CACHE/gguf-unpacked/`, and later loads read that (about 3 s). The tensors are
the ones the GGUF load gives, saved and read back unchanged.

An entry is keyed by the GGUF file's sha256 and the versions of the packages that unpacked it, made in a
folder of its own and renamed into place whole (two processes unpacking at once keep one), and reused
only while its files' sha256 match what was recorded when it was made; otherwise it is unpacked again."""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from mlharness.atomic_io import FOLDER_MODE
from mlharness.errors import UserError
from mlharness.specs import artifacts

FORMAT = 1  # bump when what an entry holds changes
_PROVENANCE = "provenance.json"


def load_tokenizer(weights: Path) -> Any:
    """The GGUF file's tokenizer (transformers' AutoTokenizer), from its unpacked entry."""
    from transformers import AutoTokenizer

    def unpack(out: Path) -> None:
        _from_gguf(AutoTokenizer, weights).save_pretrained(out)

    return AutoTokenizer.from_pretrained(str(_entry(weights, "tokenizer", ("transformers", "gguf"), unpack)))


def load_model(weights: Path) -> Any:
    """The GGUF file's causal LM dequantized to fp32 (transformers' AutoModelForCausalLM), from its
    unpacked entry."""
    import torch
    from transformers import AutoModelForCausalLM

    def unpack(out: Path) -> None:
        lm = _from_gguf(AutoModelForCausalLM, weights, dtype=torch.float32)
        # The GGUF quantizer marks the model as not serializable; its tensors are plain fp32 by now.
        lm.hf_quantizer = None
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        lm.save_pretrained(out)

    folder = _entry(weights, "model", ("transformers", "gguf", "torch", "safetensors"), unpack)
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)


def _from_gguf(auto: Any, weights: Path, **kwargs: Any) -> Any:
    """transformers' own GGUF load, with the tqdm bar its GGUF reader draws on stderr switched off."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        return auto.from_pretrained(str(weights.parent), gguf_file=weights.name, **kwargs)
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar


def _entry(weights: Path, part: str, packages: tuple[str, ...], unpack: Callable[[Path], None]) -> Path:
    """The verified folder of `part` for `weights`: the cached one, or unpacked now."""
    material = {"format": FORMAT, "part": part, "gguf_sha256": artifacts.sha256_file(weights),
                "packages": {name: importlib.metadata.version(name) for name in packages}}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    root = artifacts.cache_dir() / "gguf-unpacked"
    folder = root / f"{weights.stem}-{part}-{key[:16]}"
    if _verified(folder, key):
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
        os.chmod(staging, FOLDER_MODE)  # mkdtemp's folder is its owner's alone; the cache may be shared
    except OSError as exc:
        raise UserError(f"{root}: cannot unpack {weights.name} into the artifact cache ($MLHARNESS_CACHE): "
                        f"{exc.strerror or exc}") from None
    try:
        unpack(staging)  # transformers' own errors (a damaged file) go to the caller as they are
        _publish(staging, folder, {**material, "key": key, "source": str(weights)})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _publish(staging: Path, folder: Path, provenance: dict[str, Any]) -> None:
    """The unpacked files in `staging` become the entry `folder`, whole, with their sha256 recorded."""
    try:
        files = {p.name: artifacts.sha256_file(p) for p in sorted(staging.iterdir())}
        (staging / _PROVENANCE).write_text(json.dumps({**provenance, "files": files}, indent=2))
        if _verified(folder, provenance["key"]):  # another process made it meanwhile: keep that one
            return
        if folder.exists():  # a damaged entry: moved aside whole, then removed
            aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-damaged-", dir=folder.parent))
            os.replace(folder, aside / "entry")
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(staging, folder)
        except OSError:  # another process put its entry there first: keep that one
            if not _verified(folder, provenance["key"]):
                raise
    except OSError as exc:
        raise UserError(f"{folder}: cannot write the unpacked GGUF into the artifact cache ($MLHARNESS_CACHE): "
                        f"{exc.strerror or exc}") from None


def _verified(folder: Path, key: str) -> bool:
    """The entry is whole: its provenance names this key and every file it lists has its sha256."""
    try:
        provenance = json.loads((folder / _PROVENANCE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(provenance, dict) or provenance.get("key") != key:
        return False
    files = provenance.get("files")
    if not isinstance(files, dict) or not files:
        return False
    try:
        return all(artifacts.sha256_file(folder / name) == sha for name, sha in files.items())
    except OSError:
        return False
