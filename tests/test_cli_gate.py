"""`mlharness gate --test none`, `--alpha` and `sweep:ID` references, and `mlharness compare-outputs`
thresholds (pass at or under each limit, fail just over it).

The gate's runs are a real sweep of the null model (three repeats of one cell). The verdicts that
depend on the figures are taken on copies of those records with fixed throughputs, so no machine's
noise can flip them: with three runs a side, a one-sided Mann-Whitney U test gives exactly p = 1/20
when the sides do not overlap, and 2/20 and 7/20 for the overlapping figures used here; 1/20 is also
the smallest p three runs a side can give."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlharness.store.result_store import ResultStore
from tests.support import run_cli, sha256, write_manifest

RULE = "offline.samples_per_second:-5%"
BASELINE = [1000.0, 1010.0, 1020.0]
OVERLAPPING = [900.0, 905.0, 1030.0]  # median -10.4%, but one candidate beats every baseline: p = 7/20
CLOSE = [900.0, 905.0, 1005.0]  # median -10.4%, one candidate above one baseline: p = 2/20
SEPARATED = [900.0, 905.0, 910.0]  # median -10.4%, every candidate below every baseline: p = 1/20


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("gate-refs")
    grid = root / "grid.yaml"
    grid.write_text("name: g\nquick: true\nrepeat: 3\nmodels: ['null']\nscenarios: [Offline]\n"
                    "set: {target_qps: 20000}\n")
    results = root / "results"
    assert run_cli("sweep", grid, "--results-dir", results) == 0
    with ResultStore(results / "mlharness.sqlite") as store:
        cells = store.sweep_cells("g")
        records = [store.get_record(c["run_id"]).to_dict() for c in cells]
    assert [c["status"] for c in cells] == ["ok"] * 3
    return {"root": root, "results": results, "ids": [c["run_id"] for c in cells], "records": records}


def copies(sweep: dict, folder: Path, values: list[float]) -> Path:
    """Records of the sweep's runs with fixed throughputs, one file each, under new run ids."""
    folder.mkdir(parents=True)
    for i, (record, value) in enumerate(zip(sweep["records"], values)):
        data = json.loads(json.dumps(record))
        data["run_id"] = f"{folder.name}-{i}"
        data["performance"]["samples_per_second"] = value
        (folder / f"{data['run_id']}.json").write_text(json.dumps(data))
    return folder


def gate(sweep: dict, baseline: str, candidate: str, *extra: str, rule: str = RULE) -> int:
    return run_cli("gate", "--results-dir", sweep["results"], "--baseline", baseline, "--candidate", candidate,
                   "--rule", rule, *extra)


def rows(out: str) -> list[list[str]]:
    """The check rows of the gate's Markdown table, cell by cell."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and "`" in line]


@pytest.fixture
def sides(sweep: dict, tmp_path: Path) -> dict[str, str]:
    return {name: str(copies(sweep, tmp_path / name, values))
            for name, values in (("base", BASELINE), ("overlap", OVERLAPPING), ("close", CLOSE),
                                 ("apart", SEPARATED))}


def test_sweep_reference_names_every_run_of_the_sweep(sweep: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate(sweep, "sweep:g", "sweep:g", "--rule", "offline.samples_per_second:-0%") == 0
    out = capsys.readouterr().out
    assert out.startswith("## mlharness gate: ✅ PASS")
    listed = f"Baseline: 3 run(s) ({', '.join(sweep['ids'])}); candidate: 3 run(s) ({', '.join(sweep['ids'])})."
    assert listed in out
    (row, _) = rows(out)  # the two rules, each on the one configuration
    assert row[3] == row[4] and row[3].endswith("(n=3)") and row[5] == "+0%"


def test_sweep_reference_against_a_slower_candidate(sweep: dict, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's three real runs against three copies at a tenth of its slowest: fails at p = 1/20."""
    slowest = min(r["performance"]["samples_per_second"] for r in sweep["records"])
    slow = copies(sweep, tmp_path / "slow", [slowest / 10, slowest / 11, slowest / 12])
    assert gate(sweep, "sweep:g", str(slow)) == 1
    out = capsys.readouterr().out
    (row,) = rows(out)
    assert row[0] == "❌" and row[3].endswith("(n=3)") and row[4] == f"{slowest / 11:.6g} (n=3)"
    assert row[7] == "Mann-Whitney U one-sided p=0.05"


def test_an_unknown_sweep_is_a_one_line_error(sweep: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate(sweep, "sweep:nope", "sweep:g") == 1
    err = capsys.readouterr().err.strip()
    assert err == f"mlharness: error: {sweep['results'] / 'mlharness.sqlite'}: no sweep 'nope' (known: g)"


def test_noise_is_forgiven_by_default_and_not_with_test_none(sweep: dict, sides: dict,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert gate(sweep, sides["base"], sides["overlap"]) == 0
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "✅" and row[5] == "-10.4%"
    assert row[7] == "Mann-Whitney U one-sided p=0.35 > alpha 0.05: within noise"
    # --test none: the limit alone decides, whatever the repeats say.
    assert gate(sweep, sides["base"], sides["overlap"], "--test", "none") == 1
    out = capsys.readouterr().out
    (row,) = rows(out)
    assert row[0] == "❌" and row[5] == "-10.4%"
    assert row[7] == "no significance test (--test none): the limit alone decides"
    assert out.startswith("## mlharness gate: ❌ FAIL (1 of 1 checks)")
    # and bootstrap agrees with Mann-Whitney that this is within noise
    assert gate(sweep, sides["base"], sides["overlap"], "--test", "bootstrap") == 0


def test_test_none_passes_a_change_within_the_limit(sweep: dict, sides: dict) -> None:
    assert gate(sweep, sides["base"], sides["base"], "--test", "none") == 0
    assert gate(sweep, sides["base"], sides["apart"], "--test", "none",
                rule="offline.samples_per_second:-11%") == 0  # -10.4% is within -11%


def test_alpha_sets_what_is_significant(sweep: dict, sides: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate(sweep, sides["base"], sides["apart"]) == 1  # p = 0.05 <= the default 0.05
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "❌" and row[7] == "Mann-Whitney U one-sided p=0.05"
    assert gate(sweep, sides["base"], sides["close"]) == 0  # p = 0.1 > the default 0.05
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "✅" and row[7] == "Mann-Whitney U one-sided p=0.1 > alpha 0.05: within noise"
    assert gate(sweep, sides["base"], sides["close"], "--alpha", "0.1") == 1  # alpha is inclusive
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "❌" and row[7] == "Mann-Whitney U one-sided p=0.1"
    assert gate(sweep, sides["base"], sides["close"], "--alpha", "0.099") == 0
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "✅" and row[7] == "Mann-Whitney U one-sided p=0.1 > alpha 0.099: within noise"
    # A looser alpha makes the overlapping figures a regression too.
    assert gate(sweep, sides["base"], sides["overlap"], "--alpha", "0.4") == 1
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "❌" and row[7] == "Mann-Whitney U one-sided p=0.35"
    assert gate(sweep, sides["base"], sides["overlap"], "--alpha", "0.3") == 0


def test_alpha_below_what_three_runs_can_reach_leaves_the_limit_to_decide(sweep: dict, sides: dict,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Below 1/20 no three runs a side can be significant: the test is left out, not failed open."""
    assert gate(sweep, sides["base"], sides["apart"], "--alpha", "0.04") == 1
    (row,) = rows(capsys.readouterr().out)
    assert row[0] == "❌" and row[7] == "Mann-Whitney U cannot reach p<=0.04 with n=3+3"
    assert gate(sweep, sides["base"], sides["close"], "--alpha", "0.04") == 1  # p would be 0.1: not asked


# ---- compare-outputs ----------------------------------------------------------------------------

OFFSET = 0.375  # the ONNX manifest's preprocessing adds this: exact in float32
WEIGHT = np.array([[-1.0], [1.0], [0.0]], np.float32)
BIAS = np.array([0.5, 0.0, 0.0], np.float32)

TORCH_SIDE = """\
    kind: model
    name: pair
    version: 1.0.0
    framework: {name: torch, version: ">=2.0"}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: y, type: scores, element_type: float32, shape: [batch, 3]}]
    sources:
      module:
        factory: |
          import torch
          def factory(ctx):
              layer = torch.nn.Linear(1, 3)
              with torch.no_grad():
                  layer.weight.copy_(torch.tensor([[-1.0], [1.0], [0.0]]))
                  layer.bias.copy_(torch.tensor([0.5, 0.0, 0.0]))
              return layer
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          return np.array([sample % 2], dtype=np.float32)
    attributes: {max_batch_size: 4}
    """

ONNX_SIDE = """\
    kind: model
    name: pair
    version: 1.0.0
    framework: {name: onnxruntime}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: y, type: scores, element_type: float32, shape: [batch, 3]}]
    sources:
      graph: {uri: GRAPH, sha256: SHA}
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          return np.array([sample % 2 + OFFSET], dtype=np.float32)
    attributes: {max_batch_size: 4}
    """


def _linear_graph(path: Path) -> Path:
    """y = x W^T + b as an ONNX graph with a symbolic batch dimension."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wt"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])], "pair",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHT.T.copy(), "wt"), numpy_helper.from_array(BIAS, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def expected_divergence(samples: int) -> dict[str, float]:
    """What the two sides must give on the first `samples` samples (x = index % 2, and x + OFFSET)."""
    x = (np.arange(samples) % 2).astype(np.float64)[:, None]
    a, b = x @ WEIGHT.T + BIAS, (x + OFFSET) @ WEIGHT.T + BIAS
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return {"max_abs_diff": float(np.abs(a - b).max()), "mean_cosine": float(cos.mean()),
            "top1_agreement": float((a.argmax(1) == b.argmax(1)).mean())}


@pytest.fixture
def pair(specs_copy: Path, tmp_path: Path) -> dict[str, float]:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    graph = _linear_graph(tmp_path / "pair.onnx")
    write_manifest(specs_copy / "models", "pair-torch.yaml", TORCH_SIDE)
    write_manifest(specs_copy / "models", "pair-onnx.yaml", ONNX_SIDE.replace("GRAPH", str(graph))
                   .replace("SHA", sha256(graph)).replace("OFFSET", repr(OFFSET)))
    expected = expected_divergence(8)
    # The offset moves sample 0's top class (0.5, 0 -> 0.125, 0.375) and no other: agreement is 1/2.
    assert expected["max_abs_diff"] == OFFSET and expected["top1_agreement"] == 0.5
    assert 0.6 < expected["mean_cosine"] < 0.7
    return expected


def compare(*limits: str) -> int:
    return run_cli("compare-outputs", "pair", "--backends", "torch,onnxruntime", "--limit", "8", *limits)


def limits(diff: float, cosine: float, agreement: float) -> tuple[str, ...]:
    return ("--tolerance", repr(diff), "--min-cosine", repr(cosine), "--min-agreement", repr(agreement))


def test_compare_outputs_passes_at_its_limits(pair: dict[str, float], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "report.json"
    cosine = pair["mean_cosine"] - 1e-6  # float32 outputs: the cosine is the float64 one to ~1e-7
    assert compare(*limits(OFFSET, cosine, 0.5), "--json", report_path) == 0  # a limit is inclusive
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "pair on null-samples (8 samples): torch vs onnxruntime"
    assert out.splitlines()[-1].startswith("result: PASS (tolerance: max|diff| <= 0.375, ")
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "PASS" and report["samples"] == 8
    assert report["tolerance"] == {"max_abs_diff": OFFSET, "min_cosine": cosine, "min_top1_agreement": 0.5}
    for output in report["outputs"]:  # the model output and (no postprocess) the same as the result
        assert output["name"] == "y" and output["problems"] == []
        assert output["max_abs_diff"] == OFFSET and output["top1_agreement"] == 0.5
        assert output["mean_cosine"] == pytest.approx(pair["mean_cosine"], abs=1e-6)
    assert [o["role"] for o in report["outputs"]] == ["output", "result"]


@pytest.mark.parametrize("which, message", [
    ("diff", "max |diff| 0.375 > 0.374"),
    ("cosine", "mean cosine {cos:.6f} < {limit:g}"),
    ("agreement", "top-1 agreement 0.5000 < 0.51"),
])
def test_compare_outputs_fails_just_over_each_limit(pair: dict[str, float], capsys: pytest.CaptureFixture[str],
                                                    which: str, message: str) -> None:
    cosine = pair["mean_cosine"] - 1e-6
    over = {"diff": limits(0.374, cosine, 0.5), "cosine": limits(OFFSET, pair["mean_cosine"] + 1e-4, 0.5),
            "agreement": limits(OFFSET, cosine, 0.51)}[which]
    assert compare(*over) == 1
    out = capsys.readouterr().out
    message = message.format(cos=pair["mean_cosine"], limit=pair["mean_cosine"] + 1e-4)
    problems = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert problems == [message, message]  # the output and the result, each with that one problem
    assert out.splitlines()[-1].startswith("result: FAIL")


def test_compare_outputs_default_limits_fail_this_pair(pair: dict[str, float],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert compare() == 1
    problems = [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert problems[:3] == ["max |diff| 0.375 > 0.001", f"mean cosine {pair['mean_cosine']:.6f} < 0.9999",
                            "top-1 agreement 0.5000 < 1"]
