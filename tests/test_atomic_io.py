"""Atomic writes: the old file survives a failed write, no temporary file is left, modes are the usual ones."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mlharness.atomic_io import write_bytes, write_text


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = write_text(tmp_path / "run.json", "old")
    with pytest.raises(TypeError):
        write_bytes(target, "text, not bytes")  # fails inside the write, after the temporary exists
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_written_files_are_readable_by_others_as_with_open(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    mode = stat.S_IMODE(os.stat(write_text(tmp_path / "a.txt", "x")).st_mode)
    assert mode == 0o666 & ~umask
