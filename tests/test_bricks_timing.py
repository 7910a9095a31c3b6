"""How a brick is timed (issue 39, item 2), with real ONNX Runtime: its calls go through an IOBinding
made once, so a call writes into outputs allocated once and reads the inputs in place; and a sampler
says where its wall time went."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlharness.sut import brick_timing as bt
from mlharness.sut import bricks as sb


def _depthwise_session() -> ort.InferenceSession:
    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 1, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1, 1, 1])], "dw",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                              initializer=[weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = sb.ort_level(sb.AS_EXECUTED)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_a_bound_call_writes_into_outputs_allocated_once_and_reads_its_inputs_in_place() -> None:
    session = _depthwise_session()
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    call, inputs, outputs = bt.bound_call(session, {"x": x})
    assert inputs["x"] is not x and np.array_equal(inputs["x"], x)  # a copy: the caller's array is left alone
    output = outputs["y"]
    address = output.ctypes.data
    output.fill(np.nan)
    call()
    np.testing.assert_allclose(output, session.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert outputs["y"] is output and output.ctypes.data == address  # the same memory, written in place
    inputs["x"][...] = 0  # the kernel reads the bound array: no bias, so zeros in give zeros out
    call()
    assert not output.any()


def test_fresh_inputs_are_written_back_whole_into_the_bound_memory_before_each_call() -> None:
    session = _depthwise_session()
    x = np.random.default_rng(2).standard_normal((1, 8, 16, 16)).astype(np.float32)
    call, rewrite = bt.fresh_bound_call(session, {"x": x})
    bound, output = rewrite.inputs, rewrite.outputs["y"]
    addresses = {name: array.ctypes.data for name, array in bound.items()}
    expected = session.run(None, {"x": x})[0]
    bound["x"][...] = 0  # as if something had overwritten the kernel's input
    call()
    assert not output.any()  # the binding reads that memory: zeros in, zeros out (the Conv has no bias)
    rewrite()
    assert np.array_equal(bound["x"], x)
    assert {name: array.ctypes.data for name, array in bound.items()} == addresses  # the same memory
    call()
    np.testing.assert_allclose(output, expected, rtol=1e-6, atol=1e-6)


def test_a_sampler_says_where_its_wall_time_went() -> None:
    sampler = bt.Sampler(lambda: time.sleep(0.002), lambda: time.sleep(0.001), setup_seconds=0.5,
                         warmup_repeats=2, warmup_seconds=0.0)
    sampler.extend(5)
    phases = sampler.phases
    assert set(phases) == {"setup", "warmup", "prepare", "timed", "loop"}
    assert phases["setup"] == 0.5 and phases["warmup"] >= 2 * 0.003
    assert phases["prepare"] >= 5 * 0.001 and phases["timed"] >= 5 * 0.002
    assert phases["timed"] == pytest.approx(sampler.timed)
    assert sum(phases.values()) == pytest.approx(sampler.seconds) and phases["loop"] >= -1e-9
    sampler.release()
    assert sampler.call is None and len(sampler.times) == 5


def _counting() -> tuple[list[int], Callable[[], None]]:
    made = [0]

    def call() -> None:
        made[0] += 1
    return made, call


def test_warm_up_ends_at_its_call_cap_before_its_seconds() -> None:
    # An hour of warm-up seconds: only the cap can end it, whatever the machine's speed.
    made, call = _counting()
    bt.Sampler(call, warmup_repeats=3, warmup_seconds=3600.0, warmup_max_calls=100)
    assert made[0] == 100
    made, call = _counting()  # the cap never cuts the repeats
    bt.Sampler(call, warmup_repeats=5, warmup_seconds=3600.0, warmup_max_calls=2)
    assert made[0] == 5
    made, call = _counting()  # no seconds: the repeats alone, cap or none
    bt.Sampler(call, warmup_repeats=4, warmup_seconds=0.0, warmup_max_calls=None)
    assert made[0] == 4


def test_measure_warms_up_by_the_rules_call_cap() -> None:
    made, call = _counting()
    rule = bt.ConfidenceRule(tolerance=1000.0, min_repeats=10, warmup_repeats=3, warmup_seconds=3600.0, warmup_max_calls=40)
    measurement = bt.measure(call, rule)
    assert measurement.repeats == 10 and made[0] == 40 + 10
    made, call = _counting()  # what a bricks run opens each brick's sampler with (Prepared.open_sampler)
    bt.Sampler.by_rule(call, rule)
    assert made[0] == 40
    assert bt.ConfidenceRule().describe()["warmup_max_calls"] == bt.ConfidenceRule().warmup_max_calls > 0
