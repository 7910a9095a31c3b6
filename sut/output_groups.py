"""Offline: the outputs of several batches, held so that they are postprocessed and completed in one
call. Right after a session's run, the user's postprocess and the completion cost several times
what they cost warm, probably from cold caches (not measured apart): mobilenet-v2's top-5 of a batch
of 4 took about 200 us after a run against 44 us in a warm loop, 1.3% of the batch (docs/tuning.md).
That cost is per call, not per row, so a group of batches pays it once. Offline is judged only by when its last
sample completes, so holding results for a few batches costs nothing there.

Each batch's outputs are copied into the group's own buffers (a backend may reuse its output
buffers from one run to the next); a batch whose outputs do not fit the group's row shapes, or are
not numpy arrays, is not taken and the caller finishes the group first. The caller also answers the
held batches one by one when the postprocess fails on the group (`batches`, `disabled`)."""
from __future__ import annotations

from typing import Any

import numpy as np

# The most output bytes a group holds, whatever the rows asked for: a model with large outputs
# (segmentation maps) groups fewer rows, and never fewer than one batch.
MAX_GROUP_BYTES = 16 << 20


class OutputGroup:
    """One worker's held batches: their query ids, sample indices, and outputs row after row."""

    def __init__(self, max_rows: int):
        self.max_rows = max(1, int(max_rows))
        self.ids: list[int] = []
        self.indices: list[int] = []
        self.rows = 0
        self._buffers: dict[str, np.ndarray] = {}
        self._capacity = 0
        self._counts: list[int] = []  # rows of each held batch, in order
        # Set when the postprocess failed on a group but not on its batches one by one: from then on
        # nothing is taken and each batch is answered alone.
        self.disabled = False

    def take(self, query_ids: list[int], sample_indices: list[int], outputs: dict[str, Any]) -> bool:
        """Copy one batch's outputs in behind those held; False (nothing taken) when they do not fit:
        not numpy arrays of one row per sample, other names, row shapes or types than those held, or
        no room left. An empty group takes any batch of numpy arrays (its buffers are made to fit)."""
        count = len(query_ids)
        if self.disabled or not _rows_of(outputs, count):
            return False
        if not self._matches(outputs) or (not self.rows and count > self._capacity):
            if self.rows:
                return False
            self._allocate(outputs, count)
        if self.rows + count > self._capacity:
            return False
        for name, value in outputs.items():
            self._buffers[name][self.rows:self.rows + count] = value
        self.ids += query_ids
        self.indices += sample_indices
        self.rows += count
        self._counts.append(count)
        return True

    def outputs(self) -> dict[str, np.ndarray]:
        """The held outputs, one row per held sample (views of the group's buffers: valid until clear)."""
        return {name: buffer[:self.rows] for name, buffer in self._buffers.items()}

    def batches(self) -> list[tuple[list[int], list[int], dict[str, np.ndarray]]]:
        """The held batches one by one: (query ids, sample indices, outputs), as they were taken."""
        held, start = [], 0
        for count in self._counts:
            stop = start + count
            held.append((self.ids[start:stop], self.indices[start:stop],
                         {name: buffer[start:stop] for name, buffer in self._buffers.items()}))
            start = stop
        return held

    def clear(self) -> None:
        self.ids, self.indices, self.rows, self._counts = [], [], 0, []

    def _matches(self, outputs: dict[str, np.ndarray]) -> bool:
        if set(outputs) != set(self._buffers):
            return False
        return all(self._buffers[name].shape[1:] == value.shape[1:] and self._buffers[name].dtype == value.dtype
                   for name, value in outputs.items())

    def _allocate(self, outputs: dict[str, np.ndarray], count: int) -> None:
        row_bytes = sum(value[0].nbytes for value in outputs.values()) or 1
        self._capacity = max(count, min(self.max_rows, MAX_GROUP_BYTES // row_bytes))
        self._buffers = {name: np.empty((self._capacity, *value.shape[1:]), value.dtype)
                         for name, value in outputs.items()}


def _rows_of(outputs: dict[str, Any], count: int) -> bool:
    """Every output a numpy array with one row per sample of the batch."""
    return bool(outputs) and all(isinstance(value, np.ndarray) and value.ndim > 0 and value.shape[0] == count
                                 for value in outputs.values())
