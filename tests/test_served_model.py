"""What `mlharness serve` runs a batch through (mlharness.sut.served_model): an answer stays as computed."""
from __future__ import annotations

import numpy as np

from mlharness.specs.index import default_index
from mlharness.sut.served_model import load_served_model


def test_an_answer_is_not_changed_by_the_next_batch() -> None:
    """The null backend reuses its output buffer from batch to batch, and the server sends a batch's answers
    after the next batch may have run: each answer holds its own rows (null-routed: one-hot at the sample)."""
    index = default_index()
    served = load_served_model(index.find("model", "null-routed"), index.find("hardware", "cpu"), "null", {})
    first = served.infer([np.array([[3.0]], dtype=np.float32)])
    served.infer([np.array([[5.0]], dtype=np.float32)])
    assert int(np.argmax(first.rows[0])) == 3 and first.rows[0].sum() == 1
