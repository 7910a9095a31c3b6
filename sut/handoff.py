"""Moving tensors between the stages: gather staged samples into a batch, and complete LoadGen
queries with responses that point into one batch output buffer.

Two implementations share this interface: the C extension `mlharness.sut._native` (default when built)
and the pure-Python one below (baseline and equivalence reference). `MLHARNESS_HANDOFF=python`
forces the Python one.

Where copies happen, end to end (CPU):
- staging -> batch: one row memcpy per sample into a reused batch buffer (`gather`); a batch of one
  is a slice of the staged array, no copy at all.
- batch -> framework: nothing but the buffer protocol is needed. ONNX Runtime wraps a contiguous
  numpy array of the input's element type without copying, both in `session.run(feed)` and in
  `io_binding.bind_cpu_input(name, array)`; `io_binding.bind_output(name, "cpu", 0, dtype, shape,
  array.ctypes.data)` makes ORT write straight into a pre-allocated numpy array (the array must
  outlive `run_with_iobinding`). torch: `torch.from_numpy(array)` and `torch.from_dlpack(array)`
  share memory; `tensor.numpy()` on a CPU tensor shares it back. ORT's `session.run` outputs are
  numpy arrays over ORT-owned memory (no copy). On CUDA, staging buffers would be page-locked and
  device buffers bound through IOBinding (`bind_input(name, "cuda", ...)`); not built or tested here.
- framework -> LoadGen: `complete` builds responses holding pointers into the result rows; LoadGen
  reads the bytes only inside QuerySamplesComplete (accuracy log, TEST01), so the buffer is pinned
  for exactly that long and released when the call returns.
"""
from __future__ import annotations

import os
from typing import Protocol, Sequence

import numpy as np


class Handoff(Protocol):
    name: str

    def gather(self, staged: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        """out[i] = staged[rows[i]] for every i; `out` is C-contiguous with len(rows) rows of
        staged's element type. A row outside [0, len(staged)) raises IndexError naming it."""

    def complete(self, query_ids: Sequence[int], results: np.ndarray) -> None:
        """Complete query_ids[i] with the bytes of results[i] (row i = bytes [i*stride, (i+1)*stride),
        stride = results.nbytes // len(query_ids)); results must stay alive (the caller holds it)
        until this returns, since LoadGen reads response bytes only inside the call."""


class PythonHandoff:
    name = "python"

    def __init__(self) -> None:
        import mlperf_loadgen as lg

        self._lg = lg

    def gather(self, staged: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        rows = np.asarray(rows)
        # np.take counts negative rows from the end; a negative sample row is a bug, as in the C one.
        if rows.size and rows.min() < 0:
            position = int(np.argmax(rows < 0))
            raise IndexError(f"row {int(rows[position])} (position {position}) is out of bounds "
                             f"for {len(staged)} staged samples")
        np.take(staged, rows, axis=0, out=out)

    def complete(self, query_ids: Sequence[int], results: np.ndarray) -> None:
        lg = self._lg
        count = len(query_ids)
        if count == 0:
            return
        if not results.flags.c_contiguous:
            raise ValueError("results must be C-contiguous")
        if results.nbytes % count:
            raise ValueError(f"results has {results.nbytes} bytes, not a whole number of rows for {count} query ids")
        base = results.ctypes.data
        stride = results.nbytes // count
        responses = [lg.QuerySampleResponse(qid, base + i * stride, stride) for i, qid in enumerate(query_ids)]
        lg.QuerySamplesComplete(responses)


HANDOFF_ENV, ISSUE_ENV = "MLHARNESS_HANDOFF", "MLHARNESS_ISSUE"  # the user's way to choose either


def handoff_from_environment() -> str:
    """$MLHARNESS_HANDOFF (default native), read where a run is submitted: the run request carries it."""
    return os.environ.get(HANDOFF_ENV) or "native"


def issue_path_from_environment() -> str:
    """$MLHARNESS_ISSUE (default native), read where a run is submitted: the run request carries it."""
    return os.environ.get(ISSUE_ENV) or "native"


def load_handoff(preference: str | None = None) -> Handoff:
    """The native handoff when built and not overridden, else the Python one. A run passes its
    request's choice; without one, $MLHARNESS_HANDOFF decides (benchmarks and tests build SUTs directly)."""
    choice = (preference or handoff_from_environment()).lower()
    if choice == "native":
        try:
            from mlharness.sut import _native  # type: ignore[attr-defined]
        except ImportError:
            return PythonHandoff()
        return _native.NativeHandoff()
    if choice == "python":
        return PythonHandoff()
    from mlharness.errors import UserError

    raise UserError(f"MLHARNESS_HANDOFF={choice!r}: expected 'native' or 'python'")


def load_issue_queue(scenario: str, preference: str | None = None) -> tuple[object | None, str]:
    """(queue, why) for LoadGen's issue path: a mlharness.sut._native.IssueQueue for Server (LoadGen's C SUT fills
    it without the GIL) unless MLHARNESS_ISSUE=python or the extension cannot reach LoadGen's C
    interface; else (None, why) and the SUT is called through the Python binding. Other scenarios
    always use the binding: SingleStream runs inline, Offline issues once, MultiStream rarely."""
    choice = (preference or issue_path_from_environment()).lower()
    if choice not in ("native", "python"):
        from mlharness.errors import UserError

        raise UserError(f"MLHARNESS_ISSUE={choice!r}: expected 'native' or 'python'")
    if scenario != "Server":
        return None, f"python (the native issue path serves Server; this is {scenario})"
    if choice == "python":
        return None, "python (MLHARNESS_ISSUE=python)"
    try:
        from mlharness.sut import _native  # type: ignore[attr-defined]
    except ImportError:
        return None, "python (the C extension mlharness.sut._native is not built)"
    try:
        return _native.IssueQueue(), "native"
    except RuntimeError as exc:
        return None, f"python ({exc})"
