"""The model zoo (issue 39): image classifiers in families whose layers repeat, within a model (ResNet's
blocks) and across a family's members, as DLBricks' own suite. Each member is a plain-torch
architecture (mlharness.sut.architectures) with seeded random weights, so its latency is real and
its outputs mean nothing: performance only, and every manifest says so.

Nothing large is committed: `build` writes a member's two small manifests (the torch source and the
ONNX Runtime model a user can copy), exports the graph through the project's own conversion (with its
numeric check against torch and its provenance) into the cache's `converted/` folder, and pins the
file's sha256 in the ONNX manifest."""
from __future__ import annotations

import difflib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mlharness.atomic_io import write_text
from mlharness.errors import UserError
from mlharness.specs import artifacts
from mlharness.specs.manifests import Artifact, Conversion
from mlharness.sut.conversion import convert
from mlharness.sut.processing import compile_function

SEED = 0  # every member's weights: the same bytes on every build
OPSET = 17
DATASET = "synthetic-images"  # 256x256 RGB, deterministic: performance runs need no files
_ARCH = "mlharness.sut.architectures"


@dataclass(frozen=True)
class ZooMember:
    name: str
    family: str
    factory: str  # `module:function`, called with a context whose attributes are `options` and the seed
    options: tuple[tuple[str, Any], ...]
    image_size: int = 224  # every member is 224x224; a copy at another size (dataclasses.replace) builds too

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (1, 3, self.image_size, self.image_size)

    @property
    def attributes(self) -> dict[str, Any]:
        return {**dict(self.options), "seed": SEED}


def _members() -> tuple[ZooMember, ...]:
    members = [ZooMember(f"resnet-{d}", "resnet", f"{_ARCH}.resnet:resnet", (("depth", d),)) for d in (18, 34, 50, 101, 152)]
    members += [ZooMember("resnext-50-32x4d", "resnet", f"{_ARCH}.resnet:resnet",
                          (("depth", 50), ("groups", 32), ("width_per_group", 4))),
                ZooMember("wide-resnet-50-2", "resnet", f"{_ARCH}.resnet:resnet", (("depth", 50), ("width_per_group", 128)))]
    members += [ZooMember(f"vgg-{d}{'-bn' if bn else ''}", "vgg", f"{_ARCH}.vgg:vgg", (("depth", d), ("batch_norm", bn)))
                for bn in (False, True) for d in (11, 13, 16, 19)]
    members += [ZooMember(f"mobilenet-v2-{w}", "mobilenet-v2", f"{_ARCH}.mobilenet_v2:mobilenet_v2", (("width_mult", w),))
                for w in (0.35, 0.5, 0.75, 1.0, 1.4)]
    members += [ZooMember(f"densenet-{d}", "densenet", f"{_ARCH}.densenet:densenet", (("depth", d),))
                for d in (121, 161, 169, 201)]
    members += [ZooMember(f"squeezenet-{v}", "squeezenet", f"{_ARCH}.squeezenet:squeezenet", (("version", v),))
                for v in ("1.0", "1.1")]
    members += [ZooMember(f"shufflenet-v2-x{w}", "shufflenet-v2", f"{_ARCH}.shufflenet_v2:shufflenet_v2", (("width", w),))
                for w in ("0.5", "1.0", "1.5", "2.0")]
    members.append(ZooMember("googlenet", "googlenet", f"{_ARCH}.googlenet:googlenet", ()))
    return tuple(members)


ZOO = _members()


def families() -> list[str]:
    return list(dict.fromkeys(m.family for m in ZOO))


def member(name: str) -> ZooMember:
    found = {m.name: m for m in ZOO}.get(name)
    if found is None:
        close = difflib.get_close_matches(name, [m.name for m in ZOO], n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(m.name for m in ZOO)})"
        raise UserError(f"zoo: no member named {name!r}{hint}")
    return found


def build_module(zoo_member: ZooMember, seed: int = SEED) -> Any:
    """The member's torch module in eval mode, as its manifest's factory makes it (at another seed if asked)."""
    factory = compile_function(zoo_member.factory, "factory", f"zoo member {zoo_member.name}")
    return factory(SimpleNamespace(attributes={**zoo_member.attributes, "seed": seed})).eval()


def zoo_dir() -> Path:
    """Where `build` writes manifests by default: beside the converted graphs, in the cache."""
    return artifacts.cache_dir() / "zoo"


@dataclass(frozen=True)
class Built:
    member: ZooMember
    manifest: Path  # the ONNX Runtime model manifest, ready for `mlharness run` and `mlharness bricks`
    source_manifest: Path  # the torch manifest the graph is converted from
    graph: Path
    sha256: str
    provenance: Path
    reused: bool  # the cached graph was verified and used as is
    seconds: float


def build(zoo_member: ZooMember, out: Path | None = None, force: bool = False) -> Built:
    """Write the member's manifests into `out` (default: the cache's zoo folder) and convert its graph
    (or verify the cached one). The conversion's cache key covers the torch manifest and the
    architecture's file, so another `out` reuses the same graph and an edited architecture converts again."""
    folder = Path(out) if out is not None else zoo_dir()
    folder.mkdir(parents=True, exist_ok=True)
    source_path = write_text(folder / f"{zoo_member.name}-torch.yaml", torch_manifest(zoo_member))
    graph = Artifact(convert=Conversion(source=source_path.name, to="onnx", opset=OPSET, example_dims={"batch": 1}))
    started = time.perf_counter()
    done = convert(graph, f"{source_path}: zoo member {zoo_member.name}", folder, force=force)
    seconds = time.perf_counter() - started
    manifest_path = write_text(folder / f"{zoo_member.name}.yaml",
                               onnx_manifest(zoo_member, done.path, done.sha256, source_path.name, done.provenance_path))
    return Built(zoo_member, manifest_path, source_path, done.path, done.sha256, done.provenance_path, done.reused, seconds)


# -- manifests ----------------------------------------------------------------------------------------

def _tensors(size: int) -> str:
    return f"""\
inputs:
  - name: image
    type: image
    element_type: float32
    shape: [batch, 3, {size}, {size}]
    layout: NCHW
outputs:
  - name: logits
    type: scores
    element_type: float32
    shape: [batch, 1000]
"""


def torch_manifest(zoo_member: ZooMember) -> str:
    return f"""\
kind: model
name: {zoo_member.name}
version: 1.0.0
description: >
  Zoo member {zoo_member.name} ({zoo_member.family} family) in plain torch, with seeded
  random weights (seed {SEED}): performance only, its outputs mean nothing. The source of
  {zoo_member.name}.yaml's ONNX graph, written by `mlharness zoo build {zoo_member.name}`.
framework:
  name: torch
  version: ">=2.0"
dataset: {DATASET}
{_tensors(zoo_member.image_size)}sources:
  module:
    factory: {zoo_member.factory}
attributes: {json.dumps(zoo_member.attributes)}
"""


def onnx_manifest(zoo_member: ZooMember, graph: Path, sha256: str, source: str, provenance: Path) -> str:
    size = zoo_member.image_size
    return f"""\
kind: model
name: {zoo_member.name}
version: 1.0.0
description: >
  Zoo member {zoo_member.name} ({zoo_member.family} family) for ONNX Runtime, with seeded
  random weights (seed {SEED}): PERFORMANCE ONLY. Its outputs mean nothing and it declares no
  accuracy. The graph was exported from {source} by the project's torch-to-ONNX conversion,
  checked against torch; its provenance is beside it ({provenance.name}). The sha256 pins this
  machine's export: on another machine, rebuild with `mlharness zoo build {zoo_member.name}`.
  Input: the synthetic images, resized and center-cropped to {size}x{size}, ImageNet mean/std.
framework:
  name: onnxruntime
  version: ">=1.17"
dataset: {DATASET}
{_tensors(size)}result:
  name: top5
  type: class_indices
  element_type: int64
  shape: [5]
sources:
  graph:
    uri: {graph.as_uri()}
    sha256: {sha256}
preprocess: |
  import numpy as np
  from PIL import Image

  MEAN = np.array([0.485, 0.456, 0.406], np.float32)
  STD = np.array([0.229, 0.224, 0.225], np.float32)
  CROP = {size}
  RESIZE = CROP * 256 // 224

  def preprocess(image, ctx):
      # image: HxWx3 uint8 RGB. Shorter side to RESIZE (bilinear), center crop CROP, scale to [0, 1],
      # normalise with the ImageNet mean/std, HWC -> CHW.
      picture = Image.fromarray(image)
      w, h = picture.size
      scale = RESIZE / min(w, h)
      picture = picture.resize((max(CROP, round(w * scale)), max(CROP, round(h * scale))), Image.BILINEAR)
      w, h = picture.size
      left, top = (w - CROP) // 2, (h - CROP) // 2
      crop = np.asarray(picture.crop((left, top, left + CROP, top + CROP)), np.float32) / 255.0
      return ((crop - MEAN) / STD).transpose(2, 0, 1)
postprocess: |
  import numpy as np

  def postprocess(outputs, ctx):
      scores = outputs["logits"]
      # top-5 class indices, best first, one row per sample (meaningless here: the weights are random)
      top = np.argpartition(-scores, 5, axis=1)[:, :5]
      order = np.take_along_axis(scores, top, axis=1).argsort(axis=1, kind="stable")[:, ::-1]
      return np.take_along_axis(top, order, axis=1).astype(np.int64)
attributes:
  max_batch_size: 1
  family: {zoo_member.family}
"""
