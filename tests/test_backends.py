"""Backends: the registry, ONNX Runtime batching after the symbolic_batch transform, PyTorch from a
factory + state dict and from TorchScript, null; and `import mlharness` without any framework."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.specs.manifests import load_manifest
from mlharness.sut import backends
from tests.support import REPO, linear_torch_model, read_run, run_cli, sha256, write_manifest


def test_harness_imports_without_frameworks() -> None:
    code = ("import sys, harness, mlharness.cli, mlharness.running.runner, mlharness.sut.runtime, sut.system_under_test;"
            "bad = [m for m in ('torch', 'onnxruntime', 'onnx', 'transformers') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_registry_rejects_unknown_backend() -> None:
    assert backends.names()[:3] == ["onnxruntime", "torch", "null"]
    with pytest.raises(UserError, match="--backend: expected one of onnxruntime, torch, null"):
        backends.backend_class("tensorflow")


def _load(model_path: Path, backend: str, hardware: str = "cpu.yaml"):
    from mlharness.sut.runtime import resolve_sources

    model = load_manifest(model_path)
    hw = load_manifest(REPO / "specs" / "hardware" / hardware)
    instance = backends.create(backend, model=model, sources=resolve_sources(model), hardware=hw, options={})
    instance.load()
    return instance


def test_onnxruntime_batch_equals_single_samples() -> None:
    backend = _load(REPO / "specs" / "models" / "resnet50-light.yaml", "onnxruntime")
    assert backend.supports_batching
    batch = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
    together = backend.predict({"gpu_0/data_0": batch})["gpu_0/softmax_1"]
    alone = np.concatenate([backend.predict({"gpu_0/data_0": batch[i:i + 1]})["gpu_0/softmax_1"] for i in range(3)])
    assert together.shape == (3, 1000)
    # A tolerance, not equality: batched kernels may sum in another order (and do, on other CPUs).
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-6)




@pytest.fixture
def torch_weights(tmp_path: Path) -> Path:
    torch = pytest.importorskip("torch")
    layer = torch.nn.Sequential(torch.nn.Linear(1, 3))
    with torch.no_grad():
        layer[0].weight.copy_(torch.tensor([[-1.0], [1.0], [0.0]]))
        layer[0].bias.copy_(torch.tensor([0.5, 0.0, 0.0]))
    path = tmp_path / "tiny.pt"
    torch.save(layer.state_dict(), path)
    return path


def test_torch_factory_with_state_dict_runs_accuracy(tmp_path: Path, specs_copy: Path, torch_weights: Path) -> None:
    weights = f"weights: {{uri: {torch_weights}, sha256: {sha256(torch_weights)}}}"
    write_manifest(specs_copy / "models", "tiny-torch.yaml", linear_torch_model("tiny-torch", sources=weights, target_qps=5000))
    # x = label (0 or 1): class 0 scores 0.5 - x, class 1 scores x, so argmax is the label: top-1 must be 1.0
    assert run_cli("run", "tiny-torch", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path / "r") == 0
    record = read_run(tmp_path / "r", "tiny-torch", "Offline")
    assert record["accuracy"]["values"]["top1"] == 1.0
    assert record["backend_info"]["torch"].startswith("2.")


def test_torch_weights_that_do_not_fit_are_a_clear_error(tmp_path: Path, specs_copy: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    wrong = tmp_path / "wrong.pt"
    torch.save(torch.nn.Linear(2, 3).state_dict(), wrong)
    weights = f"weights: {{uri: {wrong}, sha256: {sha256(wrong)}}}"
    write_manifest(specs_copy / "models", "tiny-torch.yaml", linear_torch_model("tiny-torch", sources=weights, target_qps=5000))
    assert run_cli("run", "tiny-torch", "--scenario", "Offline", "--quick", "--results-dir", tmp_path / "r") == 1
    err = capsys.readouterr().err
    assert "tiny-torch.yaml: sources.weights: state dict does not fit the module" in err


def test_torchscript_source(tmp_path: Path, specs_copy: Path, torch_weights: Path) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.Linear(1, 3))
    module.load_state_dict(torch.load(torch_weights))
    scripted = tmp_path / "tiny.ts"
    torch.jit.script(module).save(str(scripted))
    text = linear_torch_model("tiny-torch", sources=f"torchscript: {{uri: {scripted}, sha256: {sha256(scripted)}}}",
                              target_qps=5000)
    write_manifest(specs_copy / "models", "tiny-torch.yaml", text)
    assert run_cli("run", "tiny-torch", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", tmp_path / "r") == 0
    assert read_run(tmp_path / "r", "tiny-torch", "Offline")["accuracy"]["values"]["top1"] == 1.0


def test_null_backend_runs_any_model_declared_outputs(tmp_path: Path) -> None:
    assert run_cli("run", "resnet50-light", "--backend", "null", "--scenario", "Offline", "--quick",
                   "--set", "min_duration=200", "--results-dir", tmp_path) == 0
    record = read_run(tmp_path, "resnet50-light", "Offline")
    assert record["backend"] == "null" and record["status"] == "ok"


def test_cuda_hardware_without_a_gpu_is_refused(tmp_path: Path) -> None:
    """No GPU here: selecting the CUDA manifest must fail clearly instead of silently using the CPU.
    The CUDA / TensorRT provider path itself needs a GPU and is not exercised on this machine."""
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDAExecutionProvider (a GPU build): the refusal cannot happen here")
    with pytest.raises(UserError, match="cuda:0 needs onnxruntime with CUDAExecutionProvider"):
        _load(REPO / "specs" / "models" / "resnet50-light.yaml", "onnxruntime", "cuda0.yaml")
