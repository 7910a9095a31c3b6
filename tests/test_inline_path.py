"""The inline one-sample path (SingleStream, issue 17): a staged sample's inputs are views of its row
made once per load, and the null backend's outputs cost a lookup; what they return must still be
each sample's own values, and an unloaded sample is still refused by name."""
from __future__ import annotations

import numpy as np
import pytest

from mlharness.sut.staging import SampleError
from tests.test_staging import staged


def test_feed_of_is_the_samples_row_as_a_view_of_the_staged_arrays() -> None:
    samples = staged(10)
    samples.load_samples([7, 2, 5])
    for index in (7, 2, 5):
        feed = samples.feed_of(index)
        (name,) = feed
        row = int(samples.rows([index])[0])
        assert feed[name].shape == (1, *samples.arrays[name].shape[1:])
        np.testing.assert_array_equal(feed[name][0], samples.arrays[name][row])
        assert np.shares_memory(feed[name], samples.arrays[name])  # no copy
    with pytest.raises(SampleError) as caught:
        samples.feed_of(3)  # issued but never loaded
    assert caught.value.indices == [3] and caught.value.stage == "staging"


def test_feed_of_follows_every_load_and_unload() -> None:
    samples = staged(10)
    samples.load_samples([1, 2])
    before = samples.feed_of(2)
    samples.load_samples([2, 9])
    after = samples.feed_of(2)
    (name,) = after
    assert not np.shares_memory(after[name], before[name])  # the new load's arrays
    np.testing.assert_array_equal(after[name][0], samples.arrays[name][0])
    with pytest.raises(SampleError):
        samples.feed_of(1)  # loaded before, not now
    samples.unload_samples([2, 9])
    with pytest.raises(SampleError):
        samples.feed_of(2)


def test_null_outputs_follow_the_batch_size_and_a_caller_cannot_spoil_them() -> None:
    from mlharness.sut import backends
    from mlharness.specs.index import default_index

    index = default_index()
    model = next(m for m in index.named("model", "null"))
    backend = backends.create("null", model=model, sources={}, hardware=index.find("hardware", "cpu"), options={})
    backend.load()
    one = backend.predict({"x": np.zeros((1, 1), np.float32)})
    four = backend.predict({"x": np.zeros((4, 1), np.float32)})
    (name,) = one
    assert one[name].shape[0] == 1 and four[name].shape[0] == 4
    assert not one[name].any() and not four[name].any()
    one.pop(name)  # a postprocess that changes the dict it was given
    again = backend.predict({"x": np.zeros((1, 1), np.float32)})
    assert list(again) == [name] and again[name].shape[0] == 1
    bigger = backend.predict({"x": np.zeros((2048, 1), np.float32)})  # the buffers grow: no stale views
    assert bigger[name].shape[0] == 2048 and backend.predict({"x": np.zeros((4, 1), np.float32)})[name].shape[0] == 4
