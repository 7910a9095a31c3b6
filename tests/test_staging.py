"""The query sample library's storage, driven directly (no LoadGen): LoadQuerySamples stages the
chosen samples into one contiguous array per input, rows in the order given; UnloadQuerySamples
frees them; an issued sample that was never loaded, and user code that fails or breaks the
manifest's contract, stop the run with a SampleError naming the samples and the stage."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mlharness.specs.manifests import TensorSpec
from mlharness.sut.processing import ProcessingContext
from mlharness.sut.staging import SampleError, StagedSamples

X = TensorSpec(name="x", type="tensor", element_type="float32", shape=("batch", 2))
Y = TensorSpec(name="y", type="tensor", element_type="int64", shape=("batch", "sequence"))


def staged(count: int = 10, inputs: tuple[TensorSpec, ...] = (X,), preprocess: Any = "default",
           load: Any = None) -> StagedSamples:
    """Samples 0..count-1 whose raw value is the index; the default preprocess makes [i, -i]."""
    if preprocess == "default":
        def preprocess(raw: Any, ctx: ProcessingContext) -> np.ndarray:
            return np.array([raw, -raw], dtype=np.float32)
    items = [(index, f"label-{index}") for index in range(count)]
    return StagedSamples(items, inputs, preprocess, load, ProcessingContext())


def test_rows_follow_the_order_loaded_and_hold_each_samples_values() -> None:
    samples = staged()
    samples.load_samples([7, 2, 5])
    assert samples.arrays["x"].flags.c_contiguous and samples.arrays["x"].dtype == np.float32
    np.testing.assert_array_equal(samples.arrays["x"], [[7, -7], [2, -2], [5, -5]])
    np.testing.assert_array_equal(samples.rows([5, 7, 2, 7]), [2, 0, 1, 0])
    assert samples.rows([5]).dtype == np.int64
    assert len(samples) == 10 and samples.labels()[3] == "label-3"


def test_loading_again_replaces_what_was_staged() -> None:
    samples = staged()
    samples.load_samples([1, 2])
    samples.load_samples([3])
    np.testing.assert_array_equal(samples.rows([3]), [0])
    with pytest.raises(SampleError) as info:
        samples.rows([1])
    assert info.value.indices == [1]


def test_loading_nothing_keeps_what_was_staged() -> None:
    samples = staged()
    samples.load_samples([4])
    samples.load_samples([])
    np.testing.assert_array_equal(samples.rows([4]), [0])


def test_unload_frees_the_arrays_and_every_row() -> None:
    samples = staged()
    samples.load_samples([0, 1])
    samples.unload_samples([0, 1])
    assert samples.arrays == {}
    with pytest.raises(SampleError, match=r"^samples \[0, 1\]: staging raised LookupError"):
        samples.rows([0, 1])


def test_an_issued_sample_never_loaded_names_at_most_five_of_them() -> None:
    samples = staged()
    samples.load_samples([0])
    with pytest.raises(SampleError) as info:
        samples.rows([0, 3, 4, 5, 6, 7, 8, 9])
    assert info.value.indices == [3, 4, 5, 6, 7]
    assert info.value.stage == "staging"
    assert str(info.value) == ("samples [3, 4, 5, 6, 7]: staging raised LookupError: "
                               "sample was issued but never loaded by LoadQuerySamples")
    np.testing.assert_array_equal(samples.rows([]), [])


def test_row_zero_is_a_loaded_row() -> None:
    samples = staged()
    samples.load_samples([6, 8])
    np.testing.assert_array_equal(samples.rows([6]), [0])  # row 0 is not "missing"


@pytest.mark.parametrize(("indices", "shown"), [
    ([4], "sample 4"),
    ([1, 2, 3, 4, 5, 6, 7, 8], "samples [1, 2, 3, 4, 5, 6, 7, 8]"),
    (list(range(9)), "samples [0, 1, 2, 3, 4, 5, 6, 7, ...] (9 in all)"),
])
def test_sample_error_names_the_first_samples_and_keeps_them_all(indices: list[int], shown: str) -> None:
    error = SampleError(indices, "postprocess", ValueError("bad"))
    assert str(error) == f"{shown}: postprocess raised ValueError: bad"
    assert error.indices == indices and error.stage == "postprocess"
    assert str(SampleError([2], "preprocess", "returned None")) == "sample 2: preprocess returned None"


def test_the_failing_stage_is_named_load_or_preprocess() -> None:
    def broken_load(raw: Any, ctx: ProcessingContext) -> Any:
        raise OSError("no such image")

    with pytest.raises(SampleError, match=r"^sample 3: load raised OSError: no such image$") as info:
        staged(load=broken_load).load_samples([3])
    assert isinstance(info.value.__cause__, OSError)

    def broken_preprocess(raw: Any, ctx: ProcessingContext) -> Any:
        return np.array([1 / (raw - 5), 0], np.float32)  # fails on sample 5 only

    with pytest.raises(SampleError, match=r"^sample 5: preprocess raised ZeroDivisionError"):
        staged(preprocess=broken_preprocess).load_samples([1, 5])


def test_load_feeds_preprocess_and_without_either_the_samples_are_the_arrays() -> None:
    def load(raw: Any, ctx: ProcessingContext) -> Any:
        return raw * 10

    samples = staged(load=load)
    samples.load_samples([3])
    np.testing.assert_array_equal(samples.arrays["x"], [[30, -30]])
    items = [(np.array([index, 1], np.float32), index) for index in range(3)]
    raw = StagedSamples(items, [X], None, None, ProcessingContext())
    raw.load_samples([2])
    np.testing.assert_array_equal(raw.arrays["x"], [[2, 1]])
    with pytest.raises(SampleError, match=r"^sample 0: samples returned input 'x' as int64"):
        StagedSamples([(np.array([0, 1]), 0)], [X], None, None, ProcessingContext()).load_samples([0])
    with pytest.raises(SampleError, match=r"^sample 0: load returned input 'x' as None"):
        staged(preprocess=None, load=lambda raw, ctx: None).load_samples([0])


@pytest.mark.parametrize(("value", "message"), [
    (np.zeros(2, np.float64), "returned input 'x' as float64 with shape (2,); the manifest declares "
                              "float32 [batch, 2] (sample shape (2,))"),
    (np.zeros((1, 2), np.float32), "returned input 'x' as float32 with shape (1, 2)"),
    (np.zeros(3, np.float32), "returned input 'x' as float32 with shape (3,)"),
    ([0.0, 1.0], "returned input 'x' as a list, not a numpy array"),
    ({"x": np.zeros(2, np.float32), "z": np.zeros(1)}, "returned input 'z', which is not declared; the "
                                                       "manifest declares inputs 'x', got 'x', 'z'"),
    ({}, "returned no input 'x'; the manifest declares inputs 'x', got none"),
])
def test_what_preprocess_returns_must_be_what_the_manifest_declares(value: Any, message: str) -> None:
    samples = staged(preprocess=lambda raw, ctx: value)
    with pytest.raises(SampleError) as info:
        samples.load_samples([0])
    assert str(info.value).startswith(f"sample 0: preprocess {message}")
    assert samples.arrays == {}  # nothing half-staged


def test_two_inputs_need_a_dict_and_share_symbolic_dims_within_a_sample() -> None:
    two = (Y, TensorSpec(name="mask", type="tensor", element_type="int64", shape=("batch", "sequence")))
    with pytest.raises(SampleError, match=r"^sample 0: preprocess returned int64 with shape \(4,\) for 2 inputs; the manifest declares "
                                          r"inputs 'y', 'mask': return \{input name: array\}"):
        staged(inputs=two, preprocess=lambda raw, ctx: np.zeros(4, np.int64)).load_samples([0])
    uneven = staged(inputs=two, preprocess=lambda raw, ctx: {"y": np.zeros(4, np.int64), "mask": np.zeros(3, np.int64)})
    with pytest.raises(SampleError, match=r"input 'mask' as int64 with shape \(3,\).*, and sequence is 4 in input 'y'"):
        uneven.load_samples([0])
    fine = staged(inputs=two, preprocess=lambda raw, ctx: {"mask": np.ones(4, np.int64), "y": np.full(4, raw, np.int64)})
    fine.load_samples([2, 1])
    np.testing.assert_array_equal(fine.arrays["y"], [[2] * 4, [1] * 4])
    assert fine.arrays["mask"].shape == (2, 4)


def test_staged_samples_of_an_input_share_one_shape() -> None:
    samples = staged(inputs=(Y,), preprocess=lambda raw, ctx: np.zeros(raw + 1, np.int64))
    samples.load_samples([3])  # alone, any length fits the symbolic dim
    with pytest.raises(SampleError) as info:
        samples.load_samples([3, 4])
    assert str(info.value) == ("sample 4: preprocess returned input 'y' with shape (5,), but the first staged "
                               "sample's is (4,): the staged samples of an input share one shape")
    np.testing.assert_array_equal(samples.rows([3]), [0])  # the earlier staging stays whole


def test_nothing_is_staged_before_load_samples() -> None:
    with pytest.raises(SampleError, match=r"^sample 0: staging raised LookupError"):
        staged().rows([0])


def test_the_one_sample_feed_is_a_view_and_names_a_sample_not_staged_now() -> None:
    """feed_of (the inline SingleStream path's lookup): one staged sample's inputs as a view of its
    row; a sample not staged now (before any load, left out of the last one, or unloaded) is the
    same SampleError as rows() gives, naming the sample."""
    samples = staged()
    with pytest.raises(SampleError, match=r"^sample 2: staging raised LookupError"):
        samples.feed_of(2)
    samples.load_samples([4, 2])
    feed = samples.feed_of(2)
    np.testing.assert_array_equal(feed["x"], [[2, -2]])
    assert np.shares_memory(feed["x"], samples.arrays["x"])
    with pytest.raises(SampleError) as info:
        samples.feed_of(3)
    assert info.value.indices == [3] and info.value.stage == "staging"
    samples.unload_samples([4, 2])
    with pytest.raises(SampleError, match=r"^sample 4: staging raised LookupError"):
        samples.feed_of(4)


def test_each_sample_is_loaded_and_preprocessed_once_with_the_context() -> None:
    calls: list[tuple[str, Any]] = []
    ctx = ProcessingContext(attributes={"scale": 3})

    def load(raw: Any, given: ProcessingContext) -> Any:
        calls.append(("load", raw))
        return raw * given.attributes["scale"]

    def preprocess(raw: Any, given: ProcessingContext) -> np.ndarray:
        calls.append(("preprocess", raw))
        assert given is ctx
        return np.array([raw, 0], np.float32)

    samples = StagedSamples([(i, i) for i in range(5)], [X], preprocess, load, ctx)
    samples.load_samples([4, 1, 2])
    assert calls == [("load", 4), ("preprocess", 12), ("load", 1), ("preprocess", 3), ("load", 2), ("preprocess", 6)]
    np.testing.assert_array_equal(samples.arrays["x"][:, 0], [12, 3, 6])


def test_distinct_symbolic_dims_of_one_input_may_differ() -> None:
    grid = TensorSpec(name="g", type="tensor", element_type="float32", shape=("batch", "height", "width"))
    samples = staged(inputs=(grid,), preprocess=lambda raw, ctx: np.zeros((2, 3), np.float32))
    samples.load_samples([0, 1])
    assert samples.arrays["g"].shape == (2, 2, 3)
