"""User-facing options no other test exercised (issue 38), continued from tests/test_cli_options_2.py:
`compare-outputs --batch-size` and `--hardware`, `bricks --time-cap`. Real torch and ONNX Runtime on
tiny graphs; every figure asserted is fixed by construction (a batch's rows, a thread count, a call
count), none by the machine's speed."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import run_cli, sha256, write_manifest
from tests.test_bricks import _user_model, tiny_graph

# ---- compare-outputs: a model whose outputs say how it was called ----------------------------------
#
# The torch side answers every sample with the rows of the batch it came in and torch's intra-op
# thread count; the ONNX side answers zeros. The report's max |diff| per output is then the largest
# batch the comparison ran and the thread count the hardware manifest set (the report itself names
# neither).

def _probe(framework: str, sources: str) -> str:
    """The probe's manifest for one framework: the same name, I/O, preprocess and batch on both sides."""
    return f"""\
    kind: model
    name: probe
    version: 1.0.0
    framework: {framework}
    dataset: null-samples
    inputs: [{{name: x, type: tensor, element_type: float32, shape: [batch, 1]}}]
    outputs:
      - {{name: rows, type: tensor, element_type: float32, shape: [batch, 1]}}
      - {{name: threads, type: tensor, element_type: float32, shape: [batch, 1]}}
    sources:
{sources}
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          return np.array([sample], dtype=np.float32)
    attributes: {{max_batch_size: 4}}
    """


TORCH_PROBE = _probe('{name: torch, version: ">=2.0"}', """\
      module:
        factory: |
          import torch

          class Probe(torch.nn.Module):
              def forward(self, x):
                  return x * 0 + x.shape[0], x * 0 + torch.get_num_threads()

          def factory(ctx):
              return Probe()""")

ONNX_PROBE = _probe("{name: onnxruntime}", '      graph: {uri: "GRAPH", sha256: SHA}')

SAMPLES = 8


def _zeros_graph(path: Path) -> Path:
    """rows = x - x and threads = x - x: zeros of the input's shape, with a symbolic batch."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "x"], ["rows"]), helper.make_node("Sub", ["x", "x"], ["threads"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 1]) for name in ("rows", "threads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def probe(specs_copy: Path, tmp_path: Path) -> Iterator[Path]:
    """The probe model's two manifests in a private specs/; torch's thread count put back afterwards
    (a hardware manifest's intra_op_threads sets it for the whole process)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    graph = _zeros_graph(tmp_path / "probe.onnx")
    write_manifest(specs_copy / "models", "probe-torch.yaml", TORCH_PROBE)
    write_manifest(specs_copy / "models", "probe-onnx.yaml",
                   ONNX_PROBE.replace("GRAPH", str(graph)).replace("SHA", sha256(graph)))
    threads = torch.get_num_threads()
    yield specs_copy
    torch.set_num_threads(threads)


def _compare(tmp_path: Path, *options: str) -> dict[str, float]:
    """compare-outputs on the probe (it fails: the sides differ by design); each model output's max |diff|."""
    report_path = tmp_path / "report.json"
    assert run_cli("compare-outputs", "probe", "--backends", "torch,onnxruntime", "--limit", str(SAMPLES),
                   "--json", report_path, *options) == 1
    report = json.loads(report_path.read_text())
    assert report["samples"] == SAMPLES and report["verdict"] == "FAIL"
    return {o["name"]: o["max_abs_diff"] for o in report["outputs"] if o["role"] == "output"}


@pytest.mark.parametrize("options, largest_batch", [
    ((), 4),  # the model's max_batch_size: 4 + 4
    (("--batch-size", "3"), 3),  # 3 + 3 + 2
    (("--batch-size", "1"), 1),  # one sample at a time
    (("--batch-size", "8"), 8),  # every sample in one batch, above max_batch_size: the flag is taken as given
])
def test_compare_outputs_batch_size_sets_the_batches_the_samples_run_in(probe: Path, tmp_path: Path,
                                                                       options: tuple[str, ...],
                                                                       largest_batch: int) -> None:
    assert _compare(tmp_path, *options)["rows"] == largest_batch


@pytest.mark.parametrize("flag, value, message", [
    ("--batch-size", "-1", "--batch-size: expected a number of samples >= 0 (0 = the model's max_batch_size), got -1"),
    ("--limit", "-2", "--limit: expected a number of samples >= 0 (0 = all), got -2"),
], ids=["batch-size", "limit"])
def test_compare_outputs_negative_batch_size_or_limit_is_refused(probe: Path, tmp_path: Path, flag: str, value: str,
                                                                 message: str,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """Both were taken as slices: --batch-size -1 compared 7 of 8 samples (-3: 15 rows, most twice),
    --limit -2 all but the last 2, each reported as a comparison of that many samples."""
    report_path = tmp_path / "report.json"
    assert run_cli("compare-outputs", "probe", "--limit", "8", flag, value, "--json", report_path) == 1
    assert capfd.readouterr() == ("", f"mlharness: error: {message}\n")
    assert not report_path.exists()


def _hardware(specs: Path, name: str, device: str = "cpu", threads: int = 0) -> Path:
    return write_manifest(specs / "hardware", f"{name}.yaml", f"""\
        kind: hardware
        name: {name}
        version: 1.0.0
        device: {device}
        intra_op_threads: {threads}
        inter_op_threads: 0
        """)


def test_compare_outputs_hardware_manifest_sets_the_backends_threads(probe: Path, tmp_path: Path) -> None:
    """Two manifests, two thread counts, each seen inside the torch module. Were the manifest not used,
    both comparisons would see the process's own count, whatever it is, and one of them would fail."""
    _hardware(probe, "three-threads", threads=3)
    _hardware(probe, "five-threads", threads=5)
    assert _compare(tmp_path, "--hardware", "three-threads")["threads"] == 3
    assert _compare(tmp_path, "--hardware", "five-threads")["threads"] == 5


def test_compare_outputs_hardware_this_machine_cannot_use_is_refused_naming_it(probe: Path, tmp_path: Path,
                                                                               capfd: pytest.CaptureFixture[str]) -> None:
    """A device no machine here has (cuda:99): one line naming the manifest and its device, no report."""
    manifest = _hardware(probe, "far-gpu", device="cuda:99")
    report_path = tmp_path / "report.json"
    assert run_cli("compare-outputs", "probe", "--backends", "torch,onnxruntime", "--limit", "2",
                   "--hardware", "far-gpu", "--json", report_path) == 1
    captured = capfd.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"mlharness: error: {manifest}: device: ") and line.endswith("got cuda:99")
    assert not report_path.exists()


def test_compare_outputs_hardware_not_found_is_refused(probe: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli("compare-outputs", "probe", "--limit", "2", "--hardware", "no-such-box") == 1
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith(f"mlharness: error: no hardware manifest named 'no-such-box' under {probe} (known: cpu, ")


# ---- bricks --time-cap ------------------------------------------------------------------------------

def _tiny_model(tmp_path: Path) -> Path:
    return _user_model(tmp_path / "m", tiny_graph(tmp_path / "tiny.onnx"))


def test_bricks_time_cap_stops_each_brick_at_its_first_sample(tmp_path: Path) -> None:
    """A cap no call can stay under (a microsecond of timed calls, where one session call takes longer):
    each brick takes its first sample (the rule's min_repeats calls) and not one call more, neither for
    its own interval nor for the estimate's; bricks.json states the cap that ran."""
    results = tmp_path / "results"
    assert run_cli("bricks", _tiny_model(tmp_path), "--results-dir", results, "--time-cap", "1e-6",
                   "--no-variants", "--no-measure", "--quiet") == 0
    (run_dir,) = sorted(results.glob("*/tiny-onnx/bricks/runs/*"))
    data = json.loads((run_dir / "bricks.json").read_text())
    assert data["rule"]["time_cap_seconds"] == 1e-6
    assert data["variant_rule"]["time_cap_seconds"] == 0.05  # a quarter of the cap, at least 50 ms
    first_sample = data["rule"]["min_repeats"]
    assert first_sample == 10
    assert data["bricks"] and data["summary"]["measured_bricks"] == len(data["bricks"])
    for brick in data["bricks"]:
        assert not brick["reused"]
        assert brick["repeats"] == first_sample, brick["label"]
        assert set(brick["variants"]) == {data["main_variant"]}  # --no-variants: nothing else measured


def test_bricks_time_cap_is_stored_with_each_run(tmp_path: Path) -> None:
    """Two runs at two caps into one results directory: each bricks.json states its own. (The second
    may measure again bricks the first left at their first 10 calls: docs/bricks.md, the confidence rule.)"""
    results = tmp_path / "results"
    manifest = _tiny_model(tmp_path)
    for cap in ("1e-6", "0.4"):
        assert run_cli("bricks", manifest, "--results-dir", results, "--time-cap", cap, "--no-variants",
                       "--no-measure", "--quiet") == 0
    first, second = (json.loads((d / "bricks.json").read_text())
                     for d in sorted(results.glob("*/tiny-onnx/bricks/runs/*")))
    assert (first["rule"]["time_cap_seconds"], second["rule"]["time_cap_seconds"]) == (1e-6, 0.4)
    assert (first["variant_rule"]["time_cap_seconds"], second["variant_rule"]["time_cap_seconds"]) == (0.05, 0.1)
    assert second["summary"]["reused_bricks"] + second["summary"]["measured_bricks"] == len(second["bricks"])


def test_bricks_time_cap_not_above_zero_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert run_cli("bricks", _tiny_model(tmp_path), "--results-dir", results, "--time-cap", "0",
                   "--no-variants", "--no-measure") == 1
    assert capfd.readouterr().err == "mlharness: error: --time-cap: expected a number of seconds > 0, got 0.0\n"
    assert not results.exists()
