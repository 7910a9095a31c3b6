"""Registries are the one source of names, and third-party packages add to them through entry points
(`mlharness.backends`, `mlharness.metrics`, `mlharness.tracers`). The plugin here is a real
distribution on sys.path: its package beside a `*.dist-info` folder (METADATA, entry_points.txt),
which is what `pip install` leaves and what importlib.metadata reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mlharness  # first: the harness package imports the spec layer
from mlharness.running import metrics
from mlharness.specs.manifests import known_names, load_manifest
from mlharness.specs.validation import ManifestError
from tests.support import REPO, read_run, scenario_root, write_manifest

PLUGIN_BACKEND = '''
import numpy as np

from mlharness.sut.backends.base import Backend


class DemoBackend(Backend):
    """Zeros of the declared outputs, like the null backend, and says it is the plugin."""

    name = "demo"

    def load(self):
        dims = self.model.attributes.get("dims", {})
        self.shapes = {spec.name: tuple(int(dims.get(d, 1)) if isinstance(d, str) else d for d in spec.sample_shape())
                       for spec in self.model.outputs}
        self.dtypes = {spec.name: np.dtype(spec.element_type) for spec in self.model.outputs}

    def predict(self, inputs):
        batch = len(next(iter(inputs.values())))
        return {name: np.zeros((batch, *shape), self.dtypes[name]) for name, shape in self.shapes.items()}

    def describe(self):
        return {**super().describe(), "plugin": "mlh-plugin-demo"}
'''

PLUGIN_METRIC = '''
from mlharness.running.metrics import MetricResult


def answered(outputs, labels, params):
    """How many samples answered: enough to show the metric ran by name."""
    return MetricResult({"answered": float(len(outputs))}, f"answered={len(outputs)}", {})
'''

PLUGIN_TRACER = '''
from mlharness.profiling.tracer import LevelResult, Tracer


class BatchCounter(Tracer):
    level = "batches"

    def start(self):
        self.count = 0

    def batch(self, times):
        self.count += 1

    def collect(self, window):
        return LevelResult(self.level, "ok", summary={"batches_seen": self.count})
'''

ENTRY_POINTS = '''
[mlharness.backends]
demo = mlh_plugin_demo.backend:DemoBackend
broken = mlh_plugin_demo.missing:Backend

[mlharness.metrics]
answered = mlh_plugin_demo.metric:answered
broken = mlh_plugin_demo.missing:metric

[mlharness.tracers]
batches = mlh_plugin_demo.tracer:BatchCounter
broken = mlh_plugin_demo.missing:Tracer
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed plugin distribution `mlh-plugin-demo` 0.1."""
    root = tmp_path_factory.mktemp("site")
    package = root / "mlh_plugin_demo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in (("backend", PLUGIN_BACKEND), ("metric", PLUGIN_METRIC), ("tracer", PLUGIN_TRACER)):
        (package / f"{name}.py").write_text(source)
    dist = root / "mlh_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlh-plugin-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


DEMO_MODEL = """\
kind: model
name: demo-model
version: 1.0.0
framework:
  name: demo
dataset: null-samples
sources: {}
inputs:
  - {name: x, type: tensor, element_type: float32, shape: [batch, 1]}
outputs:
  - {name: scores, type: scores, element_type: float32, shape: [batch, 10]}
preprocess: |
  import numpy as np

  def preprocess(sample, ctx):
      return np.array([sample], dtype=np.float32)
attributes:
  max_batch_size: 64
  performance_sample_count: 64
  settings:
    Offline: {target_qps: 1000000}
accuracy:
  metric: answered
"""


def _cli(site: Path | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)] if site else [str(REPO)])
    return subprocess.run([sys.executable, "-m", "mlharness.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _python(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_plugin_backend_metric_and_tracer_run(site: Path, tmp_path: Path) -> None:
    """One accuracy-then-performance run of the plugin backend, scored by the plugin metric and
    profiled by the plugin tracer; the plugin's broken entry points are never loaded."""
    model = write_manifest(tmp_path, "demo-model.yaml", DEMO_MODEL)
    results = tmp_path / "results"
    done = _cli(site, "run", str(model), "--backend", "demo", "--software", "null", "--scenario", "Offline",
                "--mode", "submission", "--quick", "--profile", "harness,batches", "--results-dir", str(results),
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = read_run(results, "demo-model", "Offline")
    assert record["status"] == "ok" and record["backend"] == "demo"
    assert record["backend_info"]["plugin"] == "mlh-plugin-demo"
    assert record["accuracy"]["metric"] == "answered" and record["accuracy"]["values"]["answered"] > 0
    assert record["profile"]["levels"] == {"harness": "ok", "batches": "ok"}
    summary = json.loads((scenario_root(results, "demo-model", "Offline") / "profile" / "summary.json").read_text())
    assert summary["batches"]["batches_seen"] > 0


def test_a_manifest_naming_the_plugin_framework_validates(site: Path, tmp_path: Path) -> None:
    model = write_manifest(tmp_path, "demo-model.yaml", DEMO_MODEL)
    assert _cli(site, "specs", "validate", str(model), cwd=tmp_path).returncode == 0
    without = _cli(None, "specs", "validate", str(model), cwd=tmp_path)
    assert without.returncode == 1
    assert without.stderr.strip().splitlines() == [
        f"{model}: framework.name: expected one of ['onnxruntime', 'torch', 'null', 'transformers', 'llama_cpp'], got 'demo'"]


def test_names_come_from_entry_points_without_loading_them(site: Path, tmp_path: Path) -> None:
    done = _python(site, """
        import sys
        import mlharness
        from mlharness.running import metrics
        from mlharness.specs.manifests import known_names
        from mlharness import profiling
        print(known_names("framework"), metrics.names(), profiling.levels())
        print(metrics.get_metric("answered", "test").__name__, profiling.parse_levels("batches"))
        print(sorted(m for m in sys.modules if m.startswith("mlh_plugin_demo.")))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    names, used, imported = done.stdout.strip().splitlines()
    assert names == ("['onnxruntime', 'torch', 'null', 'transformers', 'llama_cpp', 'demo', 'broken'] ['answered', 'broken', 'pearson_pairs', "
                     "'spearman_pairs', 'topk'] ['harness', 'model', 'framework', 'python', 'system', 'batches', "
                     "'broken']")
    assert used == "answered ['batches']"
    assert imported == "['mlh_plugin_demo.metric', 'mlh_plugin_demo.tracer']"  # what was used, nothing else


def test_a_broken_entry_point_is_one_line_when_used(site: Path, tmp_path: Path) -> None:
    model = write_manifest(tmp_path, "demo-model.yaml", DEMO_MODEL)
    expected = ("mlharness: error: entry point mlharness.{group}:broken = mlh_plugin_demo.missing:{attr} "
                "(from mlh-plugin-demo 0.1) cannot be loaded: ModuleNotFoundError: No module named "
                "'mlh_plugin_demo.missing'")
    backend = _cli(site, "run", str(model), "--backend", "broken", "--software", "null", "--scenario", "Offline",
                   "--quick", "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
    assert backend.returncode == 1
    assert backend.stderr.strip().splitlines() == [expected.format(group="backends", attr="Backend")]
    tracer = _cli(site, "run", str(model), "--scenario", "Offline", "--quick", "--profile", "broken", cwd=tmp_path)
    assert tracer.returncode == 1
    assert tracer.stderr.strip().splitlines() == [expected.format(group="tracers", attr="Tracer")]
    metric = _python(site, """
        import mlharness
        from mlharness.errors import UserError
        from mlharness.running.metrics import get_metric
        try:
            get_metric("broken", "test")
        except UserError as exc:
            print("mlharness: error:", exc)
    """, tmp_path)
    assert metric.stdout.strip().splitlines() == [expected.format(group="metrics", attr="metric")]


def test_a_name_registered_at_runtime_is_valid_in_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No closed tuple: the spec layer asks the registries, so what they hold is what validates."""
    from mlharness import profiling
    from mlharness.profiling.tracer import Tracer
    from mlharness.sut import backends, conversion

    model = write_manifest(tmp_path, "m.yaml", DEMO_MODEL.replace("name: demo\n", "name: extra_fw\n"))
    with pytest.raises(ManifestError, match=r"framework.name: expected one of \[.*'llama_cpp'\], got 'extra_fw'"):
        load_manifest(model)
    monkeypatch.setitem(backends._REGISTRY, "extra_fw", "nowhere:Backend")
    assert load_manifest(model).framework == "extra_fw"
    assert "extra_fw" in known_names("framework")

    converted = write_manifest(tmp_path, "c.yaml", DEMO_MODEL.replace(
        "sources: {}", "sources:\n  graph:\n    convert: {from: m.yaml, to: tflite}").replace("name: demo\n",
                                                                                          "name: onnxruntime\n"))
    with pytest.raises(ManifestError, match=r"convert.to: expected one of \['onnx'\], got 'tflite'"):
        load_manifest(converted)
    monkeypatch.setitem(conversion._EXPORTERS, ("torch", "tflite"), conversion._EXPORTERS[("torch", "onnx")])
    assert load_manifest(converted).sources["graph"].convert.to == "tflite"

    class Extra(Tracer):
        level = "extra"

    with pytest.raises(mlharness.UserError, match="--profile: expected a comma list of harness, .*, got 'extra'"):
        profiling.parse_levels("extra")
    monkeypatch.setitem(mlharness.profiling.registry._TRACERS, "extra", Extra)  # the registry lives in mlharness.profiling.registry
    assert profiling.parse_levels("full")[-1] == "extra" and profiling.tracer_class("extra") is Extra

    with pytest.raises(mlharness.UserError, match="metric: expected one of"):
        metrics.get_metric("extra", "here")
    monkeypatch.setitem(metrics._METRICS, "extra", len)
    assert metrics.get_metric("extra", "here") is len and "extra" in metrics.names()
