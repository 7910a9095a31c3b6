"""Atomic writes: write to a temporary file in the same folder, fsync, then rename over the target."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

# mkstemp creates files readable by the owner only; results are shared, so give them the mode an
# ordinary open() would (0666 less the umask). The umask is read once: setting it is process-wide.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK
FOLDER_MODE = 0o777 & ~_UMASK  # what an ordinary mkdir() gives, for folders made by mkdtemp (owner only)


def write_bytes(path: Path | str, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _FILE_MODE)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path | str, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: Path | str, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def move_file(src: Path | str, dst: Path | str) -> Path:
    """Move a finished file into place; a rename when on the same filesystem, else copy then rename."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError:
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        src.unlink()
    return dst
