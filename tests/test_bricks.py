"""Bricks (issue 13) with real ONNX Runtime on small real graphs: the decomposition reproduces the
model's tensors, nodes that are the same kernel on the same shapes share one brick (within and across
models), measurements are reused from the results database, the composition is a known sum, and
graphs that cannot be bricks are refused in one line naming the node."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlharness.bricks import compose
from mlharness.errors import UserError
from mlharness.store.result_store import ResultStore
from mlharness.sut import brick_timing as bt
from mlharness.sut import bricks as sb
from tests.support import run_cli, sha256, write_manifest

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _options(level: str = "enable_all", threads: int = 1) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = sb.ort_level(level)
    options.log_severity_level = 3
    return options


def _conv(name: str, x: str, y: str, cin: int, cout: int, seed: int) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    weights = np.random.default_rng(seed).standard_normal((cout, cin, 3, 3)).astype(np.float32)
    return (helper.make_node("Conv", [x, f"{name}_w"], [y], name=name, pads=[1, 1, 1, 1]),
            numpy_helper.from_array(weights, f"{name}_w"))


def tiny_graph(path: Path, batch: int | str = "batch") -> Path:
    """A user's ONNX graph: lift [batch, 1] to 3x8x8, three 3x3 convolutions with ReLU (the last two
    the same kernel on the same shapes, with different weights), pooling and a linear head."""
    rng = np.random.default_rng(0)
    lift = numpy_helper.from_array(rng.standard_normal((1, 192)).astype(np.float32), "lift_w")
    shape = numpy_helper.from_array(np.array([-1, 3, 8, 8], np.int64), "shape")
    head = numpy_helper.from_array(rng.standard_normal((4, 10)).astype(np.float32), "head_w")
    c1, w1 = _conv("conv1", "img", "c1", 3, 4, 1)
    c2, w2 = _conv("conv2", "r1", "c2", 4, 4, 2)
    c3, w3 = _conv("conv3", "r2", "c3", 4, 4, 3)
    nodes = [helper.make_node("MatMul", ["x", "lift_w"], ["lifted"], name="lift"),
             helper.make_node("Reshape", ["lifted", "shape"], ["img"], name="reshape"),
             c1, helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             c2, helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             c3, helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
             helper.make_node("GlobalAveragePool", ["r3"], ["pooled"], name="pool"),
             helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "head_w"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
                              initializer=[lift, shape, head, w1, w2, w3])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _decompose(graph: Path, feeds: dict, tmp_path: Path, check: dict | None = None,
               level: str = "enable_all") -> sb.Decomposition:
    providers = ["CPUExecutionProvider"]
    optimized = sb.optimized_graph(graph, _options(level), providers, tmp_path / f"{graph.stem}.opt.onnx")
    return sb.decompose(optimized, feeds, check, _options, providers, level, str(graph))


def _run_brick(brick: sb.Brick) -> list[np.ndarray]:
    session = ort.InferenceSession(brick.model_bytes, _options(sb.AS_EXECUTED), providers=["CPUExecutionProvider"])
    return session.run(None, brick.feed)


# ---- decomposition ---------------------------------------------------------------------------------

def test_every_brick_reproduces_the_models_tensors_and_the_last_is_its_output(tmp_path: Path) -> None:
    graph = tiny_graph(tmp_path / "tiny.onnx")
    x = np.arange(4, dtype=np.float32).reshape(4, 1) / 3
    decomposition = _decompose(graph, {"x": x}, tmp_path)
    expected = ort.InferenceSession(str(graph), _options("disable_all")).run(None, {"x": x})[0]
    assert sum(b.multiplicity for b in decomposition.bricks) == decomposition.node_count == len(decomposition.nodes)
    for brick in decomposition.bricks:
        outputs = _run_brick(brick)
        for info, got in zip(brick.outputs, outputs):
            assert got.shape == info.shape
            np.testing.assert_allclose(got, decomposition.intermediates[info.name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(decomposition.intermediates["y"], expected, rtol=1e-4, atol=1e-5)
    # The batch is concrete in every brick: 4 rows in, 4 rows out.
    assert all(t.shape[0] == 4 for b in decomposition.bricks for t in b.inputs if not t.weight and t.name == "x")


def test_a_real_network_decomposes_into_the_kernels_onnx_runtime_runs(tmp_path: Path) -> None:
    graph = LIGHT / "light_squeezenet.onnx"
    image = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (name,) = [i.name for i in ort.InferenceSession(str(graph), _options()).get_inputs()
               if i.name not in {init.name for init in onnx.load(graph).graph.initializer}]
    executed = _decompose(graph, {name: image}, tmp_path)
    source = onnx.load(graph)
    # ONNX Runtime fused Conv+Relu: fewer kernels than source nodes, and no Relu left on its own.
    assert executed.node_count < len(source.graph.node)
    assert "Relu" in {n.op_type for n in source.graph.node}
    assert "Relu" not in {b.op_type for b in executed.bricks}
    for brick in executed.bricks:
        for info, got in zip(brick.outputs, _run_brick(brick)):
            np.testing.assert_allclose(got, executed.intermediates[info.name], rtol=1e-4, atol=1e-4)
    # Without optimization, the bricks are the source nodes.
    plain = _decompose(graph, {name: image}, tmp_path, level="disable_all")
    assert plain.node_count == len([n for n in source.graph.node])
    assert "Relu" in {b.op_type for b in plain.bricks}


def test_same_kernel_on_same_shapes_is_one_brick_whatever_its_weights(tmp_path: Path) -> None:
    graph = tiny_graph(tmp_path / "tiny.onnx")
    x = np.ones((2, 1), np.float32)
    decomposition = _decompose(graph, {"x": x}, tmp_path, level="disable_all")
    convs = [b for b in decomposition.bricks if b.op_type == "Conv"]
    # conv1 (3 -> 4 channels) and conv2 + conv3 (4 -> 4, different weights): two bricks.
    assert sorted(b.multiplicity for b in convs) == [1, 2]
    (shared,) = [b for b in convs if b.multiplicity == 2]
    assert shared.nodes == ["conv2", "conv3"]
    relus = [b for b in decomposition.bricks if b.op_type == "Relu"]
    assert [b.multiplicity for b in relus] == [3]  # the same shape after every convolution
    # Across models: the same graph at another batch is other bricks; the same batch the same keys.
    again = _decompose(tiny_graph(tmp_path / "copy.onnx"), {"x": x}, tmp_path, level="disable_all")
    assert [b.key for b in again.bricks] == [b.key for b in decomposition.bricks]
    wider = _decompose(graph, {"x": np.ones((3, 1), np.float32)}, tmp_path, level="disable_all")
    assert not {b.key for b in wider.bricks} & {b.key for b in decomposition.bricks}


def test_the_key_is_op_attributes_and_shapes_not_names_or_values() -> None:
    a = [sb.TensorInfo("x", "float32", (1, 4, 8, 8)), sb.TensorInfo("w", "float32", (4, 4, 3, 3), weight=True)]
    renamed = [sb.TensorInfo("other", "float32", (1, 4, 8, 8)), sb.TensorInfo("w2", "float32", (4, 4, 3, 3), weight=True)]
    key = sb.brick_key("Conv", "", {"pads": [1, 1, 1, 1]}, a)
    assert sb.brick_key("Conv", "", {"pads": [1, 1, 1, 1]}, renamed) == key
    assert sb.brick_key("Conv", "", {"pads": [0, 0, 0, 0]}, a) != key
    assert sb.brick_key("Conv", "com.microsoft", {"pads": [1, 1, 1, 1]}, a) != key
    assert sb.brick_key("Conv", "", {"pads": [1, 1, 1, 1]}, [a[0], sb.TensorInfo("w", "float16", (4, 4, 3, 3), True)]) != key
    assert sb.brick_key("Conv", "", {"pads": [1, 1, 1, 1]}, [a[0], sb.TensorInfo("w", "float32", (4, 4, 3, 3))]) != key


def test_control_flow_is_refused_naming_the_node(tmp_path: Path) -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["out"])], "branch", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=branch, else_branch=branch)], "flow",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "flow.onnx"
    onnx.save(model, path)
    with pytest.raises(UserError) as caught:
        _decompose(path, {"cond": np.array(True), "x": np.ones(1, np.float32)}, tmp_path, level="disable_all")
    assert str(caught.value) == (f"{path}: node 'choose' (If): control flow (subgraph attribute 'else_branch') "
                                 "cannot be a brick; bricks are single kernels on fixed shapes")


def test_a_shape_that_depends_on_the_data_is_refused_naming_the_node(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["where"], name="find")], "data",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("where", TensorProto.INT64, [1, "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "data.onnx"
    onnx.save(model, path)
    one = {"x": np.array([1, 0, 0, 0], np.float32)}
    three = {"x": np.array([1, 2, 3, 0], np.float32)}
    with pytest.raises(UserError) as caught:
        _decompose(path, one, tmp_path, check=three, level="disable_all")
    assert str(caught.value) == (f"{path}: node 'find' (NonZero): output 'where' has shape (1, 1) for one batch "
                                 "and (1, 3) for another; a brick needs shapes that do not depend on the data")
    assert len(_decompose(path, one, tmp_path, check=dict(one), level="disable_all").bricks) == 1


# ---- timing and composition: known answers ---------------------------------------------------------

def test_median_ci_by_order_statistics() -> None:
    values = list(range(1, 101))  # n = 100: ranks 50 -+ 9.8 -> 40 and 61 (1-based)
    median, low, high = bt.median_ci(values)
    assert (median, low, high) == (50.5, 40.0, 61.0)
    assert bt.median_ci([3.0, 1.0 + 2.0, 3.0]) == (3.0, 3.0, 3.0)
    assert bt.median_ci([1.0, 2.0, 3.0]) == (2.0, 1.0, 3.0)  # tiny samples: the whole range


def test_measure_stops_when_stable_or_at_the_cap() -> None:
    import time

    # Any spread is within a tolerance of 1000x: stable at the first check, after min_repeats calls.
    steady = bt.measure(lambda: time.sleep(0.001), bt.ConfidenceRule(tolerance=1000.0, min_repeats=10, warmup_repeats=0))
    assert steady.stable and steady.repeats == 10 and steady.ci_low_ms <= steady.median_ms <= steady.ci_high_ms
    calls = []

    def erratic() -> None:  # alternating 0 and 2 ms: the median's CI never gets within 1%
        calls.append(1)
        if len(calls) % 2:
            time.sleep(0.002)

    capped = bt.measure(erratic, bt.ConfidenceRule(tolerance=0.01, min_repeats=10, warmup_repeats=0, time_cap=0.05))
    assert not capped.stable and capped.repeats >= 10 and capped.seconds >= 0.05


def _figures() -> list[compose.BrickFigures]:
    return [compose.BrickFigures("a", "Conv", "Conv 1x4", 3, median_ms=1.0, empty_ms=0.1, best_ms=0.5, best_variant="t1"),
            compose.BrickFigures("b", "Relu", "Relu 1x4", 2, median_ms=0.3, empty_ms=0.1),
            compose.BrickFigures("c", "Add", "Add 1x4", 1, median_ms=0.05, empty_ms=0.1, best_ms=0.0)]


def test_composition_is_net_median_times_multiplicity_plus_one_call() -> None:
    figures = _figures()
    # (1.0 - 0.1) * 3 + (0.3 - 0.1) * 2 + max(0.05 - 0.1, 0) * 1 + 0.1
    assert compose.estimate_ms(figures, 0.1) == pytest.approx(2.7 + 0.4 + 0.0 + 0.1)
    # best variants where measured: 0.5 * 3 + 0.2 * 2 + 0.0 + 0.1
    assert compose.lower_bound_ms(figures, 0.1) == pytest.approx(1.5 + 0.4 + 0.1)
    assert compose.error_pct(3.2, 4.0) == pytest.approx(-20.0)
    assert compose.error_pct(3.2, None) is None
    ops = compose.by_op_type(figures)
    assert [r["op_type"] for r in ops] == ["Conv", "Relu", "Add"]
    assert ops[0]["measured_share"] == pytest.approx(2.7 / 3.1) and ops[0]["gap_ms"] == pytest.approx(1.2)
    assert [f.key for f in compose.top_bricks(figures, 2)] == ["a", "b"]
    # Each variant net of the empty call at its own thread count: t1 wins though its median is larger.
    assert compose.best_variant({"t1": 0.6, "t2": 0.5}, {"1": 0.3, "2": 0.0}, {"t1": "1", "t2": "2"}) == \
        ("t1", pytest.approx(0.3))
    # The estimate's interval: each brick's larger CI side times its multiplicity, as independent errors.
    terms = [compose.Term(2, 1.0, 0.9, 1.2), compose.Term(1, 0.5, 0.45, 0.52)]
    assert compose.estimate_halfwidth(terms) == pytest.approx((0.4 ** 2 + 0.05 ** 2) ** 0.5)
    assert compose.estimate_from_terms(terms, 0.1) == pytest.approx(0.9 * 2 + 0.4 + 0.1)
    assert compose.time_to_confidence_speedup(10.0, 2.5) == 4.0
    assert compose.time_to_confidence_speedup(10.0, 0.0) is None


# ---- the command: a user's manifest, the database, reuse ---------------------------------------------

def _user_model(folder: Path, graph: Path, sample: str = "np.array([sample % 7], dtype=np.float32)") -> Path:
    """A model manifest a user writes for an ONNX graph the harness has never seen; `sample`: what its
    preprocess returns."""
    return write_manifest(folder, "tiny-onnx.yaml", f"""\
        kind: model
        name: tiny-onnx
        version: 1.0.0
        framework: {{name: onnxruntime, version: ">=1.17"}}
        dataset: null-samples
        inputs: [{{name: x, type: tensor, element_type: float32, shape: [batch, 1]}}]
        outputs: [{{name: y, type: scores, element_type: float32, shape: [batch, 10]}}]
        sources:
          graph: {{uri: "{graph}", sha256: {sha256(graph)}}}
        preprocess: |
          import numpy as np
          def preprocess(sample, ctx):
              return {sample}
        attributes:
          max_batch_size: 4
          settings: {{SingleStream: {{target_latency: 1}}, MultiStream: {{target_latency: 5}}}}
        """)


def _bricks_json(record_dir: Path) -> dict:
    return json.loads((record_dir / "bricks.json").read_text())


def _bricks_runs(results: Path) -> list[Path]:
    return sorted(results.glob("*/tiny-onnx/bricks/runs/*"))


def test_bricks_of_a_users_model_measured_then_reused_from_the_database(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"))
    results = tmp_path / "results"
    args = ("bricks", manifest, "--results-dir", results, "--time-cap", "0.05", "--no-variants", "--no-measure")
    assert run_cli(*args) == 0
    (first_dir,) = _bricks_runs(results)
    first = _bricks_json(first_dir)
    summary = first["summary"]
    assert summary["unique_bricks"] == len(first["bricks"]) > 0
    assert (summary["reused_bricks"], summary["measured_bricks"]) == (0, summary["unique_bricks"])
    assert summary["nodes"] == sum(b["multiplicity"] for b in first["bricks"])
    assert summary["measured_ms"] is None and summary["lower_bound_ms"] is None
    # The estimate's own interval: within 2% of it when the rule was met, else every brick hit its cap.
    assert summary["estimate_ci_ms"] >= 0
    if summary["estimate_stable"]:
        assert summary["estimate_ci_ms"] <= 0.02 * summary["estimate_ms"]
    for brick in first["bricks"]:
        assert brick["median_ms"] > 0 and brick["ci_low_ms"] <= brick["median_ms"] <= brick["ci_high_ms"]
        assert brick["net_ms"] == pytest.approx(max(brick["median_ms"] - summary["empty_call_ms"], 0.0))
    assert summary["estimate_ms"] == pytest.approx(
        sum(b["net_ms"] * b["multiplicity"] for b in first["bricks"]) + summary["empty_call_ms"])
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        stored = store.count_brick_measurements()
        assert stored == summary["unique_bricks"] + 1  # and the empty call, for --estimate-only
        (row,) = store.list_runs()
        assert (row["scenario"], row["mode"], row["metric_name"]) == ("bricks", "bricks", "bricks.estimate_ms")
        assert row["metric_value"] == pytest.approx(summary["estimate_ms"])
        assert json.loads(row["record_json"])["kind"] == "bricks"
    out = capsys.readouterr().out
    assert f"{summary['unique_bricks']} unique bricks, 0 reused from the database" in out

    # Again: every brick comes from the database, nothing is measured, the medians are the stored ones.
    assert run_cli(*args) == 0
    second = _bricks_json(_bricks_runs(results)[-1])
    # A brick stored unstable after only its first look (bricks.refine.reopenable) may be measured again,
    # when it weighs most in an estimate still outside its tolerance; whether any is depends on the noise.
    # Every other brick is reused, and with no such brick nothing is measured at all.
    reopenable = {b["key"] for b in first["bricks"]
                  if not b["stable"] and b["repeats"] <= bt.ConfidenceRule().min_repeats}
    reopen = {b["key"] for b in second["bricks"] if not b["reused"]}
    assert reopen <= reopenable
    assert (second["summary"]["reused_bricks"], second["summary"]["measured_bricks"]) == (
        summary["unique_bricks"] - len(reopen), len(reopen))
    assert (second["summary"]["brick_seconds"] == 0) == (not reopen) and second["summary"]["reuse_saved_seconds"] > 0
    assert ({b["key"]: b["median_ms"] for b in second["bricks"] if b["key"] not in reopen}
            == {b["key"]: b["median_ms"] for b in first["bricks"] if b["key"] not in reopen})
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        assert store.count_brick_measurements() == stored


def test_a_stored_brick_too_wide_for_this_estimate_is_measured_again_and_stored_anew(tmp_path: Path) -> None:
    """A row stored wide (its run's estimate stopped it early) is measured again when it keeps the
    estimate from its tolerance; the new row replaces it, the others stay reused."""
    import sqlite3

    manifest = _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"))
    results = tmp_path / "results"
    args = ("bricks", manifest, "--results-dir", results, "--time-cap", "0.05", "--no-variants", "--no-measure")
    assert run_cli(*args) == 0
    first = _bricks_json(_bricks_runs(results)[0])
    widest = max(first["bricks"], key=lambda b: b["total_ms"])
    with sqlite3.connect(results / "mlharness.sqlite") as conn:
        # Far wider than anything measured, so it weighs most in the estimate's interval whatever the load.
        conn.execute("UPDATE brick_measurements SET ci_low_ms = 0, ci_high_ms = median_ms * 100, "
                     "stable = 0, repeats = 10 WHERE brick_key = ?", (widest["key"],))
    assert run_cli(*args) == 0
    second = _bricks_json(_bricks_runs(results)[-1])
    summary, entries = second["summary"], {b["key"]: b for b in second["bricks"]}
    assert not entries[widest["key"]]["reused"] and summary["measured_bricks"] >= 1
    assert summary["reused_bricks"] + summary["measured_bricks"] == summary["unique_bricks"]
    assert summary["reused_bricks"] == sum(b["reused"] for b in second["bricks"]) and summary["brick_seconds"] > 0
    with sqlite3.connect(results / "mlharness.sqlite") as conn:
        run_id, high, median = conn.execute("SELECT run_id, ci_high_ms, median_ms FROM brick_measurements "
                                            "WHERE brick_key = ?", (widest["key"],)).fetchone()
    assert run_id == _bricks_runs(results)[-1].name and high < 100 * median  # the new row replaced the wide one


def test_bricks_compared_with_the_loadgen_run_and_the_lower_bound(tmp_path: Path) -> None:
    manifest = _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"))
    results = tmp_path / "results"
    assert run_cli("bricks", manifest, "--results-dir", results, "--time-cap", "0.05", "--batch", "2",
                   "--set", "min_duration=300", "--set", "min_query_count=16") == 0
    (run_dir,) = _bricks_runs(results)
    data = _bricks_json(run_dir)
    summary = data["summary"]
    measured = json.loads(next(results.glob("*/tiny-onnx/MultiStream/runs/*/run.json")).read_text())
    assert measured["run_id"] == summary["measured_run"] and measured["status"] == "ok"
    assert int(measured["settings"]["loadgen"]["samples_per_query"]) == 2 == measured["settings"]["harness"]["max_batch_size"]
    assert summary["measured_ms"] == pytest.approx(measured["performance"]["p50_latency_ns"] / 1e6)
    assert summary["error_pct"] == pytest.approx(100 * (summary["estimate_ms"] - summary["measured_ms"]) / summary["measured_ms"])
    assert summary["batch"] == 2
    # Variants: every thread count up to the CPUs, as executed and optimized; the bound is below the estimate.
    assert summary["lower_bound_ms"] <= summary["estimate_ms"]
    for brick in data["bricks"]:
        assert data["main_variant"] in brick["variants"] and len(brick["variants"]) >= 2
        assert brick["best_variant"] in brick["variants"]

    # The report: the comparison as a chart and a table, per model and per op type.
    out = tmp_path / "report"
    assert run_cli("report", "--bricks", "--out", out, "--db", results / "mlharness.sqlite") == 0
    page = (out / "index.html").read_text()
    assert "<h2>Bricks</h2>" in page and f"<td>{data['summary']['unique_bricks']}</td>" in page
    assert "<td>tiny-onnx</td>" in page and run_dir.name in page
    for name in ("bricks_estimate.png", "bricks_ops_0.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and name in page
    assert run_cli("report", "--run", run_dir.name, "--out", tmp_path / "one", "--db", results / "mlharness.sqlite") == 0
    assert "<h2>Bricks</h2>" in (tmp_path / "one" / "index.html").read_text()


def test_a_bricks_run_that_fails_is_kept_as_a_failed_run_as_a_loadgen_run_is(tmp_path: Path,
                                                                             capfd: pytest.CaptureFixture[str]) -> None:
    """A bricks run ends through the lifecycle every run does (mlharness.running.lifecycle): user code
    raising while the bricks are prepared fails the run, which is kept in failed-<run id>/ with its
    record and the traceback of what the user code raised, stored as failed, and nothing is published."""
    manifest = _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"),
                           sample="np.array([1.0 / (sample - sample)], dtype=np.float32)")  # ZeroDivisionError
    results = tmp_path / "results"
    assert run_cli("bricks", manifest, "--results-dir", results, "--time-cap", "0.05", "--no-variants",
                   "--no-measure") == 1
    (failed,) = results.glob("*/tiny-onnx/bricks/failed-*")
    record = json.loads((failed / "run.json").read_text())
    assert (record["kind"], record["status"], record["scenario"]) == ("bricks", "failed", "bricks")
    assert record["results_path"] == str(failed) and record["finished_at"]
    assert "ZeroDivisionError" in (failed / "traceback.txt").read_text()
    assert record["error_traceback"] == str(failed / "traceback.txt")
    assert "peak_rss_bytes" in record["cold_start"]  # memory use, as a failed LoadGen run records it
    assert not (failed / "owner.json").exists()
    assert not _bricks_runs(results) and not list(results.glob("*/tiny-onnx/bricks/.staging-*"))
    err = capfd.readouterr().err
    assert f"(logs kept in {failed}); traceback in {failed / 'traceback.txt'}" in err
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        (row,) = store.list_runs()
        assert (row["run_id"], row["status"]) == (record["run_id"], "failed")


def test_a_bricks_report_without_layer_benchmarks_says_so(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "empty.sqlite"
    ResultStore(db).close()
    assert run_cli("report", "--bricks", "--out", tmp_path / "r", "--db", db) == 1
    assert capfd.readouterr().err == (f"mlharness: error: {db}: no layer benchmarks (run `mlharness bricks MODEL` "
                                      "first)\n")
    assert not (tmp_path / "r").exists()


def test_a_torch_model_without_an_onnx_graph_is_refused_in_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli("bricks", "mobilenet-v2", "--backend", "torch", "--results-dir", tmp_path / "r") == 1
    assert capfd.readouterr().err == "mlharness: error: --backend torch: bricks are measured on onnxruntime only\n"
    assert not (tmp_path / "r").exists()  # refused before any run


def test_a_model_on_another_framework_is_refused_naming_its_manifest(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    from tests.support import tiny_torch_model

    manifest = write_manifest(tmp_path / "m", "tiny-cnn.yaml", tiny_torch_model())
    assert run_cli("bricks", manifest, "--results-dir", tmp_path / "r", "--no-measure") == 1
    assert capfd.readouterr().err == (f"mlharness: error: {manifest}: framework: bricks need an ONNX graph; model "
                                      "'tiny-cnn' runs on torch (write an onnxruntime manifest whose sources.graph "
                                      "converts it)\n")


def test_large_weights_are_measured_with_the_rest_of_the_model_passed_through_the_caches() -> None:
    small = sb.Brick("s", "Conv", "", {}, [sb.TensorInfo("w", "float32", (16, 16, 3, 3), weight=True)], [])
    large = sb.Brick("l", "Gemm", "", {}, [sb.TensorInfo("x", "float32", (1, 4096)),
                                           sb.TensorInfo("w", "float32", (4096, 1024), weight=True)], [], nodes=["a"])
    assert sb.weight_bytes(large) == 4096 * 1024 * 4 == 16 << 20
    decomposition = sb.Decomposition([small, large], 2, "enable_all")
    small.nodes = ["b", "c"]
    assert sb.model_weight_bytes(decomposition) == 2 * 16 * 16 * 9 * 4 + (16 << 20)
    calls: list[str] = []

    def fresh() -> None:
        calls.append("fresh")

    assert bt.evicting(fresh, small, 64 << 20) is fresh  # small weights stay cached in the model too
    wrapped = bt.evicting(fresh, large, (16 << 20) + (40 << 20))
    wrapped()
    assert calls == ["fresh"]
    evict_buffer = next(c.cell_contents for c in wrapped.__closure__ if isinstance(c.cell_contents, np.ndarray))
    assert evict_buffer.nbytes == 40 << 20 and evict_buffer.min() == 1  # the rest of the model's weights, written
    capped = bt.evicting(fresh, large, 10 << 30)
    assert next(c.cell_contents for c in capped.__closure__
                if isinstance(c.cell_contents, np.ndarray)).nbytes == bt.EVICT_CAP_BYTES


def test_the_empty_call_runs_no_node() -> None:
    """A node costs the executor something in the model too: the empty call subtracted from every brick
    must not hold one."""
    model = onnx.load_from_string(bt.empty_session_model([helper.make_opsetid("", 17)], 8))
    assert len(model.graph.node) == 0
    session = ort.InferenceSession(model.SerializeToString(), _options(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.full(1, 3.0, np.float32)})[0][0] == 3.0
    call, _, _ = bt.bound_call(session, {"x": np.full(1, 3.0, np.float32)})
    call()  # as the bricks run calls it: through a binding


class _FakeSampler:
    """A sampler whose extra calls all take its median: its interval narrows as it is extended."""

    def __init__(self, times: list[float]):
        self.times = list(times)
        self.timed = sum(times) / 1e3
        self.calls = 0

    def extend(self, count: int) -> None:
        value = float(np.median(self.times))
        self.times += [value] * count
        self.timed += value * count / 1e3
        self.calls += count


def test_the_estimate_rule_extends_the_brick_that_widens_the_interval_most() -> None:
    from mlharness.bricks.refine import refine as _refine

    wide = _FakeSampler([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])  # median 5.5, CI 1..10
    narrow = _FakeSampler([5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.01])
    bricks = {"w": sb.Brick("w", "Conv", "", {}, [], [], nodes=["a"]),
              "n": sb.Brick("n", "Conv", "", {}, [], [], nodes=["b", "c"]),
              "r": sb.Brick("r", "Relu", "", {}, [], [], nodes=["d"])}
    reused = {"r": {"median_ms": 1.0, "ci_low_ms": 0.99, "ci_high_ms": 1.01}}
    rule = bt.ConfidenceRule(tolerance=0.02, time_cap=10.0)
    halfwidth = _refine({"w": wide, "n": narrow}, reused, bricks, 0.0, rule)
    estimate = 5.5 + 2 * 5.0 + 1.0
    assert halfwidth <= 0.02 * estimate
    assert wide.calls > 0 and narrow.calls == 0  # only the brick whose interval mattered took more calls
    # A cap stops it: nothing may take more time, the interval stays wide and is reported as it is.
    capped = _FakeSampler([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    halfwidth = _refine({"w": capped}, {}, bricks, 0.0, bt.ConfidenceRule(tolerance=0.02, time_cap=0.01))
    assert capped.calls == 0 and halfwidth == pytest.approx(4.5)


def test_a_stored_brick_too_wide_for_the_estimate_is_measured_again_and_only_then() -> None:
    from mlharness.bricks.refine import refine as _refine

    bricks = {"n": sb.Brick("n", "Conv", "", {}, [], [], nodes=["a"]),
              "s": sb.Brick("s", "Relu", "", {}, [], [], nodes=["b", "c"])}
    narrow = [5.0] * 9 + [5.01]
    # A stored row another model's run left wide (it stopped early, far from its cap): this estimate's
    # interval is the row's; it is measured again, and the brick already narrow takes no more calls.
    stored = {"s": {"median_ms": 1.0, "ci_low_ms": 0.5, "ci_high_ms": 1.5, "stable": False, "repeats": 10}}
    sampled, opened = {"n": _FakeSampler(narrow)}, []

    def reopen(key: str) -> _FakeSampler:
        opened.append(key)
        return _FakeSampler([1.0] * 9 + [1.01])

    rule = bt.ConfidenceRule(tolerance=0.02, time_cap=1.0)
    fixed = dict(stored)
    halfwidth = _refine(sampled, fixed, bricks, 0.0, rule, reopen=reopen)
    assert opened == ["s"] and "s" in sampled and fixed == {}
    assert halfwidth <= 0.02 * 7.0 and sampled["n"].calls == 0
    # Without leave to measure, nothing the run can extend narrows the interval: it stops at once.
    sampled = {"n": _FakeSampler(narrow)}
    halfwidth = _refine(sampled, dict(stored), bricks, 0.0, rule)
    assert sampled["n"].calls == 0 and halfwidth == pytest.approx(2 * 0.5, rel=0.01)
    # A stored row its own run refined (more than the first look), or stable by itself, is not measured again.
    for row in ({**stored["s"], "repeats": 11}, {**stored["s"], "stable": True}):
        opened.clear()
        _refine({"n": _FakeSampler(narrow)}, {"s": row}, bricks, 0.0, rule, reopen=reopen)
        assert opened == []
