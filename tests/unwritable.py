"""Folders a process may not write, also where the suite runs as root (issue 38).

Root writes into a folder whatever its mode, through two capabilities: CAP_DAC_OVERRIDE (write and
search past the mode bits) and CAP_DAC_READ_SEARCH. A child started with `without_overrides()`
loses both from its capability bounding set before it executes, so the program it runs (still uid 0,
so it reads the root-owned interpreter, checkout and caches as before) gets neither: a folder whose
owner bits say r-x refuses it with EACCES, and os.access(W_OK) says so, as for any other user.
(Setting the uid to nobody instead would not do here: the interpreter lives under /root, mode 0700.)
Not root: nothing to drop, the mode bits already hold."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not between fork and exec


def _drop_overrides() -> None:
    """Runs in the child between fork and exec (Popen's preexec_fn)."""
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(errno)}")


def without_overrides() -> dict[str, Any]:
    """subprocess.Popen/run keywords for a child that the mode bits bind, root or not."""
    return {"preexec_fn": _drop_overrides} if os.geteuid() == 0 else {}


def read_only_folder(path: Path) -> Path:
    """A folder its owner (this process's user) may read and enter but not write: mode 0555."""
    path.mkdir(parents=True)
    path.chmod(0o555)
    return path
