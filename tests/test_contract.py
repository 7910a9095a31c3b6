"""The manifest is the contract: what preprocess stages and what postprocess returns must be what
the model manifest declares (element type, rank, fixed dims, symbolic dims agreeing within a
sample), or the run fails with one line naming the sample, the stage, the tensor, declared and got.
Real LoadGen runs of the null backend through the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import read_run, run_cli, write_manifest

MODEL = """\
    kind: model
    name: contract
    version: 1.0.0
    framework: {name: "null"}
    dataset: null-samples
    inputs:
      - {name: input_ids, type: tokens, element_type: int64, shape: [batch, sequence]}
      - {name: mask, type: mask, element_type: float32, shape: [batch, sequence, 2]}
    outputs:
      - {name: hidden, type: hidden_states, element_type: float32, shape: [batch, sequence, 3]}
    %(result)s
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          ids = np.full(4, sample, np.int64)
          mask = np.ones((4, 2), np.float32)
          if sample == 3:
              %(bad)s
          return {"input_ids": ids, "mask": mask}
    postprocess: |
      import numpy as np
      def postprocess(outputs, ctx):
          hidden = outputs["hidden"]
          return %(post)s
    attributes:
      max_batch_size: 8
      dims: {sequence: 4}
      settings: {Offline: {target_qps: 2000}, SingleStream: {target_latency: 0.001}}
    """

GOOD = {"result": "", "bad": "pass", "post": "hidden"}
TOP1_RESULT = "result: {name: top1, type: class_indices, element_type: int64, shape: [1]}"
TOP1 = {"result": TOP1_RESULT, "post": "hidden[:, 0, :].argmax(axis=1)[:, None].astype(np.int64)"}

SINGLE_INPUT = """\
    kind: model
    name: contract
    version: 1.0.0
    framework: {name: "null"}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: scores, type: scores, element_type: float32, shape: [batch, 10]}]
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          if sample == 3:
              return %(bad)s
          return np.array([sample], dtype=np.float32)
    attributes:
      max_batch_size: 8
      settings: {Offline: {target_qps: 2000}}
    """


def _run(results: Path, scenario: str = "Offline") -> int:
    return run_cli("run", "contract", "--scenario", scenario, "--quick", "--set", "min_duration=200",
                   "--results-dir", results)


def _failure(results: Path, scenario: str, capfd: pytest.CaptureFixture[str]) -> str:
    """The failed run's error from its run.json, checked to be the one line printed on stderr."""
    failed = list(results.glob(f"*/contract/{scenario}/failed-*/run.json"))
    assert len(failed) == 1, failed
    record = json.loads(failed[0].read_text())
    assert record["status"] == "failed"
    error = record["error"]
    assert "\n" not in error
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("mlharness: error:")]
    assert len(err) == 1 and error in err[0], err
    return error


@pytest.mark.parametrize("bad, got", [
    ("np.array([sample], dtype=np.float64)", "float64 with shape (1,)"),
    ("np.zeros((3, 7), np.float32)", "float32 with shape (3, 7)"),
    ("np.zeros((2,), np.float32)", "float32 with shape (2,)"),
    ("np.float32(sample)", "float32 with shape ()"),
    ("None", "None"),
    ("[float(sample)]", "a list, not a numpy array"),
], ids=["float64", "shape-3x7", "shape-2", "scalar", "none", "list"])
def test_preprocess_result_must_be_the_declared_input(tmp_path: Path, specs_copy: Path, bad: str, got: str,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "contract.yaml", SINGLE_INPUT % {"bad": bad})
    assert _run(tmp_path) == 1
    assert _failure(tmp_path, "Offline", capfd) == (
        f"sample 3: preprocess returned input 'x' as {got}; "
        "the manifest declares float32 [batch, 1] (sample shape (1,))")


def test_preprocess_missing_an_input(tmp_path: Path, specs_copy: Path, capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "contract.yaml",
                   MODEL % {**GOOD, "bad": 'return {"input_ids": ids}'})
    assert _run(tmp_path) == 1
    assert _failure(tmp_path, "Offline", capfd) == (
        "sample 3: preprocess returned no input 'mask'; the manifest declares inputs 'input_ids', 'mask', "
        "got 'input_ids'")


def test_preprocess_returning_one_array_for_several_inputs(tmp_path: Path, specs_copy: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "contract.yaml", MODEL % {**GOOD, "bad": "return ids"})
    assert _run(tmp_path) == 1
    assert _failure(tmp_path, "Offline", capfd) == (
        "sample 3: preprocess returned int64 with shape (4,) for 2 inputs; the manifest declares inputs "
        "'input_ids', 'mask': return {input name: array}")


def test_preprocess_returning_an_undeclared_input(tmp_path: Path, specs_copy: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "contract.yaml",
                   MODEL % {**GOOD, "bad": 'return {"input_ids": ids, "mask": mask, "masks": mask}'})
    assert _run(tmp_path) == 1
    assert _failure(tmp_path, "Offline", capfd) == (
        "sample 3: preprocess returned input 'masks', which is not declared; the manifest declares inputs "
        "'input_ids', 'mask', got 'input_ids', 'mask', 'masks'")


def test_symbolic_dims_must_agree_across_the_inputs_of_a_sample(tmp_path: Path, specs_copy: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "contract.yaml",
                   MODEL % {**GOOD, "bad": "mask = np.ones((5, 2), np.float32)"})
    assert _run(tmp_path) == 1
    assert _failure(tmp_path, "Offline", capfd) == (
        "sample 3: preprocess returned input 'mask' as float32 with shape (5, 2); the manifest declares "
        "float32 [batch, sequence, 2] (sample shape (sequence, 2)), and sequence is 4 in input 'input_ids' "
        "of the same sample")


@pytest.mark.parametrize("result, post, got, declared", [
    ("", "hidden.astype(np.float64)", "float64 with shape ({n}, 4, 3)",
     "float32 [batch, sequence, 3] (row shape (sequence, 3))"),
    ("", "hidden[:, :, :2]", "float32 with shape ({n}, 4, 2)",
     "float32 [batch, sequence, 3] (row shape (sequence, 3))"),
    (TOP1_RESULT, "hidden[:, 0, :].argmax(axis=1).astype(np.int64)", "int64 with shape ({n},)",
     "int64 [1] (row shape (1,))"),
    (TOP1_RESULT, "hidden[:, 0, :1]", "float32 with shape ({n}, 1)", "int64 [1] (row shape (1,))"),
], ids=["float64", "fixed-dim", "rank", "dtype-vs-result"])
@pytest.mark.parametrize("scenario", ["Offline", "SingleStream"])
def test_postprocess_result_must_be_the_declared_result(tmp_path: Path, specs_copy: Path, scenario: str,
                                                        result: str, post: str, got: str, declared: str,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    write_manifest(specs_copy / "models", "contract.yaml", MODEL % {**GOOD, "result": result, "post": post})
    assert _run(tmp_path, scenario) == 1
    error = _failure(tmp_path, scenario, capfd)
    which, _, rest = error.partition(": ")
    # the batch's samples: one in SingleStream, a whole batch (max_batch_size 8) in Offline
    indices = [int(which.split()[1])] if which.startswith("sample ") else json.loads(which.removeprefix("samples "))
    assert len(indices) == (1 if scenario == "SingleStream" else 8), error
    name = "top1" if result else "hidden"
    assert rest == (f"postprocess returned result {name!r} as {got.format(n=len(indices))}; "
                    f"the manifest declares {declared}")


@pytest.mark.parametrize("variant, scenario", [(GOOD, "Offline"), ({**GOOD, **TOP1}, "SingleStream")],
                         ids=["symbolic-result-Offline", "declared-result-SingleStream"])
def test_the_declared_contract_runs(tmp_path: Path, specs_copy: Path, variant: dict, scenario: str) -> None:
    """Symbolic dims agreeing within each sample, and results with a symbolic or only fixed dims: accepted."""
    write_manifest(specs_copy / "models", "contract.yaml", MODEL % variant)
    assert _run(tmp_path, scenario) == 0
    assert read_run(tmp_path, "contract", scenario)["status"] == "ok"
