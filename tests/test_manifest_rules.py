"""Manifest validation rule by rule, as known answers: for every kind and field, the exact one-line
problem (`FILE: field.path: expected WHAT, got VALUE`) a bad value gives, the values and defaults a
good one yields, the sha256/identity of a manifest file, the YAML reader's errors, the Checker's
primitives, the name registries and entry points. In-process (small YAML files under tmp_path), but
for one test that reads a manifest in a Python started with an ASCII locale."""
from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

import pytest
import yaml
from pydantic import AfterValidator, Field, ValidationError, model_validator

import mlharness
from mlharness.errors import UserError
from mlharness.specs import manifests, validation
from mlharness.specs.manifests import (
    CODE_REF,
    DIM_NAME,
    Artifact,
    Conversion,
    GenerationSpec,
    TensorRTOptions,
    TensorSpec,
    load_entry_point,
    load_manifest,
)
from mlharness.specs.schema import Doc
from mlharness.specs.validation import (
    NAME,
    SEMVER,
    SHA256,
    Expect,
    ManifestError,
    _short,
    load_yaml,
    problems_from,
    refuse,
    refuse_all,
)

SHA = "a" * 64
class _Delete:
    """An edit that removes the field; its repr is stable, so every xdist worker collects the same test ids."""

    def __repr__(self) -> str:
        return "DEL"


DEL = _Delete()

BASE: dict[str, dict[str, Any]] = {
    "model": {
        "kind": "model", "name": "tiny", "version": "1.2.3",
        "framework": {"name": "onnxruntime", "version": ">=1.0"},
        "inputs": [{"name": "x", "type": "tensor", "element_type": "float32", "shape": ["batch", 4]}],
        "outputs": [{"name": "y", "type": "tensor", "element_type": "float32", "shape": ["batch", 2]}],
        "sources": {"graph": {"uri": "model.onnx", "sha256": SHA}},
    },
    "dataset": {"kind": "dataset", "name": "d", "version": "1.0.0", "samples": "m:f", "sample_count": 8},
    "software": {"kind": "software", "name": "s", "version": "1.0.0", "packages": {"numpy": ">=1"}},
    "hardware": {"kind": "hardware", "name": "h", "version": "1.0.0", "device": "cpu"},
    "reference": {"kind": "reference", "name": "r", "version": "1.0.0", "backend": "null",
                  "model": {"name": "m", "version": "1.0.0"}, "dataset": {"name": "d", "version": "1.0.0"}},
}
FRAMEWORKS = str(manifests.known_names("framework"))  # the backends registry owns them (tests/test_registries.py)
ELEMENTS = "['float32', 'float16', 'float64', 'int64', 'int32', 'int8', 'uint8', 'bool']"
KINDS = "['dataset', 'hardware', 'model', 'reference', 'software']"
TRUNCATED_SHA = repr(SHA)[:57] + "..."


def _edit(doc: dict, edits: dict[str, Any]) -> dict:
    """`edits` maps dotted paths (list items by index: inputs.0.shape) to a new value, or DEL."""
    doc = copy.deepcopy(doc)
    for dotted, value in edits.items():
        *parents, last = dotted.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        key: Any = int(last) if isinstance(node, list) else last
        if value is DEL:
            del node[key]
        else:
            node[key] = value
    return doc


def write(folder: Path, kind: str, edits: dict[str, Any] | None = None, name: str | None = None) -> Path:
    path = folder / (name or f"{kind}.yaml")
    path.write_text(yaml.safe_dump(_edit(BASE[kind], edits or {}), sort_keys=False))
    return path


def problems_of(path: Path, kind: str | None = None) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest(path, kind)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def case(kind: str, edits: dict[str, Any], *lines: str) -> Any:
    return pytest.param(kind, edits, list(lines), id=f"{kind}:{','.join(edits)}={list(edits.values())!r:.40}")


CONVERT = {"from": "src.yaml", "to": "onnx"}
ERRORS = [
    # every kind: kind, name, version
    case("model", {"name": "bad name!"}, "name: expected a name of letters, digits, '.', '_' or '-', got 'bad name!'"),
    case("dataset", {"name": "-d"}, "name: expected a name of letters, digits, '.', '_' or '-', got '-d'"),
    case("model", {"name": ""},
         "name: expected a name of letters, digits, '.', '_' or '-' (required field is missing)"),
    case("software", {"name": DEL},
         "name: expected a name of letters, digits, '.', '_' or '-' (required field is missing)"),
    case("hardware", {"name": None},
         "name: expected a name of letters, digits, '.', '_' or '-' (required field is missing)"),
    case("reference", {"version": "1.2"}, "version: expected a semantic version such as 1.0.0, got '1.2'"),
    case("model", {"version": 1}, "version: expected a semantic version such as 1.0.0, got 1"),
    case("dataset", {"version": DEL}, "version: expected a semantic version such as 1.0.0 (required field is missing)"),
    # model: top level and framework
    case("model", {"output_tensors": []},
         "output_tensors: expected no such field (allowed: accuracy, attributes, dataset, description, framework, "
         "generation, inputs, kind, mlperf_benchmark, name, outputs, postprocess, preprocess, result, sources, version)"),
    case("model", {"framework": DEL}, "framework: expected a mapping {name, version} (required field is missing)"),
    case("model", {"framework": {}}, f"framework.name: expected one of {FRAMEWORKS} (required field is missing)"),
    case("model", {"framework.name": ""}, f"framework.name: expected one of {FRAMEWORKS} (required field is missing)"),
    case("model", {"framework": "onnxruntime"}, "framework: expected a mapping {name, version}, got 'onnxruntime'"),
    case("model", {"framework.vendor": "x"}, "framework.vendor: expected no such field (allowed: name, version)"),
    case("model", {"framework.name": "tensorflow"}, f"framework.name: expected one of {FRAMEWORKS}, got 'tensorflow'"),
    case("model", {"framework.name": DEL}, f"framework.name: expected one of {FRAMEWORKS} (required field is missing)"),
    case("model", {"framework.version": "=>1"}, "framework.version: expected a version constraint such as '>=1.17', "
                                                "got '=>1'"),
    case("model", {"framework.version": 1}, "framework.version: expected a version constraint such as '>=1.17', got 1"),
    # model: tensors
    case("model", {"inputs": DEL}, "inputs: expected a non-empty list of tensors (required field is missing)"),
    case("model", {"outputs": []}, "outputs: expected a non-empty list of tensors, got []"),
    case("model", {"inputs": "x"}, "inputs: expected a non-empty list of tensors, got 'x'"),
    case("model", {"inputs.0": "x"}, "inputs[0]: expected a mapping {name, type, element_type, shape, layout}, got 'x'"),
    case("model", {"outputs.0.dims": 2},
         "outputs[0].dims: expected no such field (allowed: element_type, layout, name, shape, type)"),
    case("model", {"inputs.0.name": DEL}, "inputs[0].name: expected a tensor name (required field is missing)"),
    case("model", {"outputs.0.name": ""}, "outputs[0].name: expected a tensor name (required field is missing)"),
    case("model", {"inputs.0.type": 3}, "inputs[0].type: expected a tensor type such as image, tokens, probabilities, "
                                        "got 3"),
    case("model", {"inputs.0.element_type": "float128"},
         f"inputs[0].element_type: expected one of {ELEMENTS}, got 'float128'"),
    case("model", {"outputs.0.element_type": DEL},
         f"outputs[0].element_type: expected one of {ELEMENTS} (required field is missing)"),
    case("model", {"inputs.0.shape": DEL}, "inputs[0].shape: expected a list of sizes and symbolic dims such as "
                                           "[batch, 3, 224, 224] (required field is missing)"),
    case("model", {"inputs.0.shape": "batch"}, "inputs[0].shape: expected a list of sizes and symbolic dims such as "
                                               "[batch, 3, 224, 224], got 'batch'"),
    case("model", {"inputs.0.shape.1": 0}, "inputs[0].shape[1]: expected a positive size or a symbolic dim name, got 0"),
    case("model", {"inputs.0.shape.1": -4}, "inputs[0].shape[1]: expected a positive size or a symbolic dim name, "
                                            "got -4"),
    case("model", {"inputs.0.shape.0": True}, "inputs[0].shape[0]: expected a positive size or a symbolic dim name, "
                                              "got True"),
    case("model", {"inputs.0.shape.1": "3d"}, "inputs[0].shape[1]: expected a positive size or a symbolic dim name, "
                                              "got '3d'"),
    case("model", {"inputs.0.shape.1": 1.5}, "inputs[0].shape[1]: expected a positive size or a symbolic dim name, "
                                             "got 1.5"),
    case("model", {"inputs.0.layout": 5}, "inputs[0].layout: expected a layout such as NCHW, got 5"),
    case("model", {"result": "x"}, "result: expected a mapping {name, type, element_type, shape, layout}, got 'x'"),
    case("model", {"result": {"name": "r", "element_type": "int64"}},
         "result.shape: expected a list of sizes and symbolic dims such as [batch, 3, 224, 224] "
         "(required field is missing)"),
    # model: sources
    case("model", {"sources": DEL},
         "sources: expected a mapping of sources (graph, weights, module, torchscript, files) "
         "(required field is missing)",
         "sources.graph: expected an ONNX graph {uri, sha256} for framework onnxruntime"),
    case("model", {"sources": {"weights": {"uri": "w.bin", "sha256": SHA}}},
         "sources.graph: expected an ONNX graph {uri, sha256} for framework onnxruntime"),
    case("model", {"sources.extra": {}},
         "sources.extra: expected no such field (allowed: files, graph, module, torchscript, weights)"),
    case("model", {"sources.graph": "model.onnx"}, "sources.graph: expected a mapping {uri, sha256}, got 'model.onnx'"),
    case("model", {"sources.graph": 5}, "sources.graph: expected a mapping {uri, sha256}, got 5"),
    case("model", {"sources.weights": ["w.bin"]}, "sources.weights: expected a mapping {uri, sha256}, got ['w.bin']"),
    case("model", {"sources.graph.url": "x"},
         "sources.graph.url: expected no such field (allowed: convert, sha256, transforms, uri)"),
    case("model", {"sources.graph.sha256": DEL},
         "sources.graph.sha256: expected 64 lowercase hex digits (sha256) (required field is missing)"),
    case("model", {"sources.graph.sha256": "A" * 64},
         f"sources.graph.sha256: expected 64 lowercase hex digits (sha256), got {repr('A' * 64)[:57]}..."),
    case("model", {"sources.graph.sha256": "abc"}, "sources.graph.sha256: expected 64 lowercase hex digits (sha256), "
                                                   "got 'abc'"),
    case("model", {"sources.graph.uri": DEL},
         "sources.graph.uri: expected a path, file://, package:// or https:// URI (required field is missing)"),
    case("model", {"sources.graph.uri": ""},
         "sources.graph.uri: expected a path, file://, package:// or https:// URI (required field is missing)"),
    case("model", {"sources.torchscript.uri": 3, "sources.torchscript.sha256": SHA},
         "sources.torchscript.uri: expected a path, file://, package:// or https:// URI, got 3"),
    case("model", {"sources.graph.transforms": "fold"},
         "sources.graph.transforms: expected a list of transform names, got 'fold'"),
    case("model", {"sources.graph.transforms": ["fold", 1]}, "sources.graph.transforms[1]: expected a transform name, got 1"),
    # model: converted artifacts
    case("model", {"sources.graph": {"convert": CONVERT, "sha256": SHA}},
         "sources.graph.sha256: expected no sha256 on a converted artifact (its bytes depend on the machine; "
         "the conversion's output check verifies it and the run records its sha256), got " + TRUNCATED_SHA),
    case("model", {"sources.graph": {"convert": CONVERT, "uri": "m.onnx"}},
         "sources.graph.uri: expected either uri or convert, not both, got 'm.onnx'"),
    case("model", {"sources.graph": {"convert": "src.yaml"}},
         "sources.graph.convert: expected a mapping {from, to, opset, example_dims}, got 'src.yaml'"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "dims": 1}}},
         "sources.graph.convert.dims: expected no such field (allowed: example_dims, from, opset, to)"),
    case("model", {"sources.graph": {"convert": {"to": "onnx"}}},
         "sources.graph.convert.from: expected the source model manifest's path, relative to this file "
         "(required field is missing)"),
    case("model", {"sources.graph": {"convert": {"from": "", "to": "onnx"}}},
         "sources.graph.convert.from: expected the source model manifest's path, relative to this file "
         "(required field is missing)"),
    case("model", {"sources.graph": {"convert": {"from": "src.yaml", "to": "tflite"}}},
         "sources.graph.convert.to: expected one of ['onnx'], got 'tflite'"),
    case("model", {"sources.graph": {"convert": {"from": "src.yaml"}}},
         "sources.graph.convert.to: expected one of ['onnx'] (required field is missing)"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "opset": 6}}},
         "sources.graph.convert.opset: expected an ONNX opset number between 7 and 30, got 6"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "opset": 31}}},
         "sources.graph.convert.opset: expected an ONNX opset number between 7 and 30, got 31"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "opset": "17"}}},
         "sources.graph.convert.opset: expected an ONNX opset number such as 17, got '17'"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": [2]}}},
         "sources.graph.convert.example_dims: expected a mapping symbolic dim -> example size, got [2]"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {"batch": 0, "seq": 4}}}},
         "sources.graph.convert.example_dims.batch: expected a symbolic dim name mapped to a positive size, got 0"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {"batch": -2}}}},
         "sources.graph.convert.example_dims.batch: expected a symbolic dim name mapped to a positive size, got -2"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {"batch": True}}}},
         "sources.graph.convert.example_dims.batch: expected a symbolic dim name mapped to a positive size, got True"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {"batch": "2"}}}},
         "sources.graph.convert.example_dims.batch: expected a symbolic dim name mapped to a positive size, got '2'"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {"batch": "two", "seq": [4]}}}},
         "sources.graph.convert.example_dims.batch: expected a symbolic dim name mapped to a positive size, got 'two'",
         "sources.graph.convert.example_dims.seq: expected a symbolic dim name mapped to a positive size, got [4]"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {"2d": 2}}}},
         "sources.graph.convert.example_dims.2d: expected a symbolic dim name mapped to a positive size, got 2"),
    case("model", {"sources.graph": {"convert": {**CONVERT, "example_dims": {3: 2}}}},
         "sources.graph.convert.example_dims.3: expected a symbolic dim name mapped to a positive size, got 2"),
    # model: named files, module factory, framework requirements
    case("model", {"sources.files": "tok.json"}, "sources.files: expected a mapping name -> {uri, sha256}, "
                                                 "got 'tok.json'"),
    case("model", {"sources.files.weights": {"uri": "w", "sha256": SHA}},
         "sources.files.weights: expected a file name of letters, digits and '_', not one of "
         "['graph', 'weights', 'module', 'torchscript', 'files'], got 'weights'"),
    case("model", {"sources.files.to-ken": {"uri": "w", "sha256": SHA}},
         "sources.files.to-ken: expected a file name of letters, digits and '_', not one of "
         "['graph', 'weights', 'module', 'torchscript', 'files'], got 'to-ken'"),
    case("model", {"sources.files": {"graph": {"uri": "g", "sha256": SHA}, "vocab": {"uri": "v.txt"}}},
         "sources.files.graph: expected a file name of letters, digits and '_', not one of "
         "['graph', 'weights', 'module', 'torchscript', 'files'], got 'graph'",
         "sources.files.vocab.sha256: expected 64 lowercase hex digits (sha256) (required field is missing)"),
    case("model", {"sources.files.vocab": {"uri": "v.txt"}},
         "sources.files.vocab.sha256: expected 64 lowercase hex digits (sha256) (required field is missing)"),
    case("model", {"sources.module": "m:f"}, "sources.module: expected a mapping {factory}, got 'm:f'"),
    case("model", {"sources.module": {"factory": "m:f", "weights": 1}},
         "sources.module.weights: expected no such field (allowed: factory)"),
    case("model", {"sources.module": {}},
         "sources.module.factory: expected inline Python source or module:function (required field is missing)"),
    case("model", {"sources.module": {"factory": "build it"}},
         "sources.module.factory: expected inline Python source (several lines) or module:function, got 'build it'"),
    case("model", {"framework.name": "torch", "sources": {"weights": {"uri": "w.pt", "sha256": SHA}}},
         "sources.module: expected a module factory (with weights) or sources.torchscript for framework torch"),
    # what a framework needs of the sources is checked once the fields themselves are well formed
    case("model", {"framework.name": "torch", "sources": {"module": {"factory": "m:"}}},
         "sources.module.factory: expected inline Python source (several lines) or module:function, got 'm:'"),
    # model: the other top-level fields
    case("model", {"attributes": "x"}, "attributes: expected a mapping, got 'x'"),
    case("model", {"accuracy": "top1"}, "accuracy: expected a mapping {metric, ...}, got 'top1'"),
    case("model", {"accuracy": {"k": 5}}, "accuracy.metric: expected a metric name such as topk "
                                          "(required field is missing)"),
    case("model", {"accuracy": {"metric": ""}}, "accuracy.metric: expected a metric name such as topk "
                                                "(required field is missing)"),
    case("model", {"accuracy": {"metric": 5}}, "accuracy.metric: expected a metric name such as topk, got 5"),
    case("model", {"description": 5}, "description: expected a description, got 5"),
    case("model", {"mlperf_benchmark": 5}, "mlperf_benchmark: expected an MLPerf benchmark name, got 5"),
    case("model", {"preprocess": "not a reference"},
         "preprocess: expected inline Python source (several lines) or module:function, got 'not a reference'"),
    case("model", {"postprocess": "pkg.mod:f.g"},
         "postprocess: expected inline Python source (several lines) or module:function, got 'pkg.mod:f.g'"),
    case("model", {"preprocess": 5}, "preprocess: expected inline Python source or module:function, got 5"),
    case("model", {"dataset": 5}, "dataset: expected a default dataset name, got 5"),
    # dataset
    case("dataset", {"labels": 1}, "labels: expected no such field (allowed: attributes, description, evaluation, "
                                   "generation, kind, load, name, sample_count, samples, sources, version)"),
    case("dataset", {"generation": {"max_new_tokens": 0}}, "generation.max_new_tokens: expected a positive token count, got 0"),
    case("reference", {"accuracy": {"rouge1": {"expected": 0.3, "tolerance": 0.01, "min_fraction": 0.99}}},
         "accuracy.rouge1.min_fraction: expected no min_fraction beside tolerance (one rule a metric: tolerance is "
         "two-sided, min_fraction one-sided), got 0.99"),
    case("reference", {"accuracy": {"rouge1": {"expected": 0.3, "min_fraction": 1.5}}},
         "accuracy.rouge1.min_fraction: expected a fraction > 0 and <= 1 (MLPerf's rule: 0.99), got 1.5"),
    case("dataset", {"sources": "x"}, "sources: expected a mapping name -> {uri, sha256}, got 'x'"),
    case("dataset", {"sources.images": "x"}, "sources.images: expected a mapping {uri, sha256}, got 'x'"),
    case("dataset", {"sources.images": {"uri": "i.npy", "sha256": "b" * 63}},
         f"sources.images.sha256: expected 64 lowercase hex digits (sha256), got {repr('b' * 63)[:57]}..."),
    case("dataset", {"sample_count": DEL}, "sample_count: expected a positive integer (required field is missing)"),
    case("dataset", {"sample_count": 0}, "sample_count: expected a positive integer, got 0"),
    case("dataset", {"sample_count": -3}, "sample_count: expected a positive integer, got -3"),
    case("dataset", {"sample_count": "8"}, "sample_count: expected a positive integer, got '8'"),
    case("dataset", {"sample_count": True}, "sample_count: expected a positive integer, got True"),
    case("dataset", {"sample_count": 8.0}, "sample_count: expected a positive integer, got 8.0"),
    case("dataset", {"evaluation": "top1"}, "evaluation: expected a mapping {metric, ...}, got 'top1'"),
    case("dataset", {"evaluation": {"k": 1}}, "evaluation.metric: expected a metric name (required field is missing)"),
    case("dataset", {"samples": DEL}, "samples: expected inline Python source or module:function "
                                      "(required field is missing)"),
    case("dataset", {"samples": "samples"}, "samples: expected inline Python source (several lines) or "
                                            "module:function, got 'samples'"),
    case("dataset", {"load": "m.f"}, "load: expected inline Python source (several lines) or module:function, "
                                     "got 'm.f'"),
    case("dataset", {"attributes": ["max_tokens"]}, "attributes: expected a mapping, got ['max_tokens']"),
    case("dataset", {"description": 1}, "description: expected a description, got 1"),
    # software
    case("software", {"python": "3.11"},
         "python: expected no such field (allowed: description, environment, kind, name, packages, version)"),
    case("software", {"packages": "numpy"}, "packages: expected a mapping package -> version constraint, got 'numpy'"),
    case("software", {"packages.numpy": "=>1"},
         "packages.numpy: expected a version constraint such as '==1.31.1' or '>=2.0', got '=>1'"),
    case("software", {"packages.numpy": 2},
         "packages.numpy: expected a version constraint such as '==1.31.1' or '>=2.0', got 2"),
    case("software", {"environment": "A=1"}, "environment: expected a mapping VAR -> value, got 'A=1'"),
    # hardware
    case("hardware", {"gpu": 1}, "gpu: expected no such field (allowed: cpu_affinity, description, device, "
                                 "inter_op_threads, intra_op_threads, kind, name, system, tensorrt, version)"),
    case("hardware", {"device": DEL}, "device: expected cpu or cuda:N (required field is missing)"),
    case("hardware", {"device": "gpu"}, "device: expected cpu or cuda:N, got 'gpu'"),
    case("hardware", {"device": "cuda"}, "device: expected cpu or cuda:N, got 'cuda'"),
    case("hardware", {"device": "xcpu"}, "device: expected cpu or cuda:N, got 'xcpu'"),
    case("hardware", {"device": "cuda:0x"}, "device: expected cpu or cuda:N, got 'cuda:0x'"),
    case("hardware", {"device": 0}, "device: expected cpu or cuda:N, got 0"),
    case("hardware", {"intra_op_threads": -1}, "intra_op_threads: expected a thread count >= 0 (0 = automatic), got -1"),
    case("hardware", {"inter_op_threads": -2}, "inter_op_threads: expected a thread count >= 0 (0 = automatic), got -2"),
    case("hardware", {"inter_op_threads": "2"}, "inter_op_threads: expected a thread count >= 0 (0 = automatic), "
                                                "got '2'"),
    case("hardware", {"intra_op_threads": True}, "intra_op_threads: expected a thread count >= 0 (0 = automatic), "
                                                 "got True"),
    case("hardware", {"cpu_affinity": "0-3"}, "cpu_affinity: expected a list of CPU indices, got '0-3'"),
    case("hardware", {"cpu_affinity": [0, -1]}, "cpu_affinity[1]: expected a CPU index >= 0, got -1"),
    case("hardware", {"cpu_affinity": [0, "1"]}, "cpu_affinity[1]: expected a CPU index >= 0, got '1'"),
    case("hardware", {"tensorrt": "on"}, "tensorrt: expected a mapping {enabled, fp16, engine_cache}, got 'on'"),
    case("hardware", {"device": "cuda:0", "tensorrt": {"int8": True}},
         "tensorrt.int8: expected no such field (allowed: enabled, engine_cache, fp16)"),
    case("hardware", {"tensorrt": {}}, "tensorrt.enabled: expected false on device cpu (TensorRT runs on a cuda:N "
                                       "device), got True"),
    case("hardware", {"tensorrt": {"enabled": True}}, "tensorrt.enabled: expected false on device cpu (TensorRT runs "
                                                      "on a cuda:N device), got True"),
    case("hardware", {"device": "cuda:1", "tensorrt": {"enabled": "yes"}},
         "tensorrt.enabled: expected true or false, got 'yes'"),
    case("hardware", {"device": "cuda:0", "tensorrt": {"fp16": 1}}, "tensorrt.fp16: expected true or false, got 1"),
    case("hardware", {"device": "cuda:0", "tensorrt": {"engine_cache": "  "}},
         "tensorrt.engine_cache: expected a folder for built engines (relative to this file), got '  '"),
    case("hardware", {"device": "cuda:0", "tensorrt": {"engine_cache": 5}},
         "tensorrt.engine_cache: expected a folder for built engines (relative to this file), got 5"),
    # reference
    case("reference", {"run": 1}, "run: expected no such field (allowed: accuracy, backend, dataset, description, "
                                  "kind, model, name, outputs, performance, version)"),
    case("reference", {"model": DEL}, "model: expected a mapping {name, version, sha256} (required field is missing)"),
    case("reference", {"dataset": "d@1.0.0"}, "dataset: expected a mapping {name, version, sha256}, got 'd@1.0.0'"),
    case("reference", {"model.name": 5}, "model.name: expected a manifest name, got 5"),
    case("reference", {"dataset.version": "1"}, "dataset.version: expected a semantic version, got '1'"),
    case("reference", {"model.sha256": "abc"}, "model.sha256: expected the manifest's content sha256, got 'abc'"),
    case("reference", {"backend": DEL}, "backend: expected a backend name (required field is missing)"),
    case("reference", {"backend": ""}, "backend: expected a backend name (required field is missing)"),
    case("reference", {"model.name": ""}, "model.name: expected a manifest name (required field is missing)"),
    case("reference", {"backend": 1}, "backend: expected a backend name, got 1"),
    case("reference", {"accuracy": [1]}, "accuracy: expected a mapping metric -> {expected, tolerance or min_fraction}, got [1]"),
    case("reference", {"accuracy": {"top1": {"expected": "high", "tolerance": 0.1}}},
         "accuracy.top1.expected: expected a number, got 'high'"),
    case("reference", {"accuracy": {"top1": {"expected": 0.7, "tolerance": [0.1]}}, "backend": 3},
         # in the document's order: backend comes before accuracy in the file
         "backend: expected a backend name, got 3", "accuracy.top1.tolerance: expected a number >= 0, got [0.1]"),
    case("reference", {"accuracy": {"top1": {"expected": True, "tolerance": 0.1}}},
         "accuracy.top1.expected: expected a number, got True"),
    case("reference", {"accuracy": {"top1": {"expected": 0.7}}},
         "accuracy.top1.tolerance: expected a number >= 0 (required field is missing)"),
    case("reference", {"performance": 5}, "performance: expected a mapping scenario -> figures, got 5"),
    case("reference", {"outputs": {"sample": 0}},
         "outputs: expected a list of {sample, values, atol}, got {'sample': 0}"),
    case("reference", {"outputs": [{"values": [1.0]}]}, "outputs[0].sample: expected a sample index "
                                                        "(required field is missing)"),
    case("reference", {"outputs": [{"sample": 0, "values": [1]}, {"sample": 1, "values": 1.0}]},
         "outputs[1].values: expected a list of expected values, got 1.0"),
    case("reference", {"outputs": [{"sample": "0", "values": []}]}, "outputs[0].sample: expected a sample index, "
                                                                     "got '0'"),
]


@pytest.mark.parametrize("kind, edits, expected", ERRORS)
def test_each_bad_field_gives_exactly_its_one_line_problem(tmp_path: Path, kind: str, edits: dict,
                                                          expected: list[str]) -> None:
    path = write(tmp_path, kind, edits)
    assert problems_of(path) == [f"{path}: {line}" for line in expected]


def test_problems_are_collected_not_stopped_at_the_first(tmp_path: Path) -> None:
    path = write(tmp_path, "hardware", {"device": "gpu", "intra_op_threads": -1, "cpu_affinity": "x", "extra": 1})
    assert problems_of(path) == [  # all of them, in the document's order
        f"{path}: device: expected cpu or cuda:N, got 'gpu'",
        f"{path}: intra_op_threads: expected a thread count >= 0 (0 = automatic), got -1",
        f"{path}: cpu_affinity: expected a list of CPU indices, got 'x'",
        (f"{path}: extra: expected no such field (allowed: cpu_affinity, description, device, inter_op_threads, "
        "intra_op_threads, kind, name, system, tensorrt, version)"),
    ]


# -- what a good manifest yields --------------------------------------------------------------------

def test_a_full_model_yields_every_field(tmp_path: Path) -> None:
    path = write(tmp_path, "model", {
        "description": "a tiny model", "mlperf_benchmark": "resnet", "dataset": "imagenet",
        "inputs.0.layout": "NC", "inputs.0.type": DEL, "outputs.0.shape": ["batch", "classes", 1],
        "result": {"name": "label", "type": "class", "element_type": "int64", "shape": ["batch"]},
        "sources.graph.transforms": ["fold", "fuse"],
        "sources.weights": {"uri": "w.bin", "sha256": "b" * 64},
        "sources.files": {"vocab": {"uri": "v.txt", "sha256": "c" * 64}},
        "preprocess": "import numpy\ndef preprocess(x):\n    return x\n",
        "postprocess": " pkg.mod:post ",
        "attributes": {"top": 5}, "accuracy": {"metric": "topk", "k": 1},
    })
    model = load_manifest(path)
    assert (model.kind, model.name, model.version, model.path) == ("model", "tiny", "1.2.3", path)
    assert (model.description, model.mlperf_benchmark, model.default_dataset) == ("a tiny model", "resnet", "imagenet")
    assert (model.framework, model.framework_version) == ("onnxruntime", ">=1.0")
    assert model.inputs == (TensorSpec(name="x", element_type="float32", shape=("batch", 4), layout="NC"),)
    assert model.outputs == (TensorSpec(name="y", element_type="float32", shape=("batch", "classes", 1)),)
    assert model.result == TensorSpec(name="label", type="class", element_type="int64", shape=("batch",))
    assert model.sources == {"graph": Artifact(uri="model.onnx", sha256=SHA, transforms=["fold", "fuse"]),
                             "weights": Artifact(uri="w.bin", sha256="b" * 64),
                             "vocab": Artifact(uri="v.txt", sha256="c" * 64)}
    assert model.graph_transforms == ("fold", "fuse")
    assert model.factory is None
    assert model.preprocess == "import numpy\ndef preprocess(x):\n    return x\n"
    assert model.postprocess == " pkg.mod:post "
    assert model.attributes == {"top": 5} and model.accuracy == {"metric": "topk", "k": 1}
    assert model.doc["name"] == "tiny"


def test_a_minimal_model_gets_its_defaults(tmp_path: Path) -> None:
    model = load_manifest(write(tmp_path, "model", {"framework.version": DEL}))
    assert (model.description, model.framework_version, model.mlperf_benchmark, model.default_dataset) == \
        ("", "", None, None)
    assert (model.result, model.factory, model.preprocess, model.postprocess) == (None, None, None, None)
    assert (model.graph_transforms, model.attributes, model.accuracy) == ((), {}, {})


@pytest.mark.parametrize("framework, sources, expected", [
    ("null", DEL, {}),
    ("null", {}, {}),
    ("torch", {"module": {"factory": "pkg.models:build"}, "weights": {"uri": "w.pt", "sha256": SHA}},
     {"weights": Artifact(uri="w.pt", sha256=SHA)}),
    ("torch", {"torchscript": {"uri": "m.pt", "sha256": SHA}}, {"torchscript": Artifact(uri="m.pt", sha256=SHA)}),
])
def test_what_each_framework_requires_of_sources(tmp_path: Path, framework: str, sources: Any,
                                                 expected: dict) -> None:
    model = load_manifest(write(tmp_path, "model", {"framework": {"name": framework}, "sources": sources}))
    assert model.framework == framework and model.sources == expected and model.graph_transforms == ()
    assert model.factory == ("pkg.models:build" if framework == "torch" and "module" in sources else None)


def test_an_inline_factory_of_several_lines_is_kept(tmp_path: Path) -> None:
    source = "def build():\n    return None\n"
    model = load_manifest(write(tmp_path, "model", {"framework.name": "torch", "sources": {"module": {"factory": source}}}))
    assert model.factory == source


def test_a_converted_graph_records_its_conversion(tmp_path: Path) -> None:
    convert = {"from": "../src.yaml", "to": "onnx", "opset": 17, "example_dims": {"seq": 8, "batch": 2, "n": 1}}
    model = load_manifest(write(tmp_path, "model", {"sources.graph": {"convert": convert}}))
    conversion = Conversion(source="../src.yaml", to="onnx", opset=17, example_dims={"batch": 2, "n": 1, "seq": 8})
    assert model.sources == {"graph": Artifact(convert=conversion)}
    assert list(conversion.example_dims) == ["batch", "n", "seq"]  # by name, whatever the file's order
    assert conversion.describe() == {"from": "../src.yaml", "to": "onnx", "opset": 17,
                                     "example_dims": {"batch": 2, "n": 1, "seq": 8}}


@pytest.mark.parametrize("opset", [7, 30, None])
def test_opset_bounds_are_inclusive_and_optional(tmp_path: Path, opset: int | None) -> None:
    convert = {**CONVERT, **({"opset": opset} if opset else {})}
    model = load_manifest(write(tmp_path, "model", {"sources.graph": {"convert": convert}}))
    assert model.sources["graph"].convert == Conversion(source="src.yaml", to="onnx", opset=opset)
    assert model.sources["graph"].convert.describe()["example_dims"] == {}


def test_a_good_dataset_yields_every_field(tmp_path: Path) -> None:
    load = "def load(i):\n    return i\n"
    path = write(tmp_path, "dataset", {
        "description": "d", "sources": {"images": {"uri": "i.npy", "sha256": SHA}, 7: {"uri": "x", "sha256": SHA}},
        "load": load, "sample_count": 1, "evaluation": {"metric": "topk"}, "attributes": {"max_tokens": 4}})
    dataset = load_manifest(path)
    assert (dataset.kind, dataset.name, dataset.description, dataset.samples, dataset.load) == \
        ("dataset", "d", "d", "m:f", load)
    assert dataset.sources == {"images": Artifact(uri="i.npy", sha256=SHA), "7": Artifact(uri="x", sha256=SHA)}
    assert (dataset.sample_count, dataset.evaluation, dataset.attributes) == (1, {"metric": "topk"}, {"max_tokens": 4})


def test_a_minimal_dataset_gets_its_defaults(tmp_path: Path) -> None:
    dataset = load_manifest(write(tmp_path, "dataset"))
    assert (dataset.description, dataset.sources, dataset.load, dataset.evaluation, dataset.attributes) == \
        ("", {}, None, {}, {})
    assert dataset.sample_count == 8


def test_software_packages_and_environment_become_strings(tmp_path: Path) -> None:
    software = load_manifest(write(tmp_path, "software", {
        "packages": {"numpy": ">=1,<3", "pyyaml": None, "onnx": ""}, "environment": {"OMP_NUM_THREADS": 1, "X": "y"}}))
    assert software.packages == {"numpy": ">=1,<3", "pyyaml": "", "onnx": ""}
    assert software.environment == {"OMP_NUM_THREADS": "1", "X": "y"}
    assert load_manifest(write(tmp_path, "software", {"packages": DEL}, "bare.yaml")).packages == {}
    assert load_manifest(write(tmp_path, "software", {}, "s2.yaml")).environment == {}


@pytest.mark.parametrize("edits, expected", [
    ({}, {"device": "cpu", "intra_op_threads": 0, "inter_op_threads": 0, "cpu_affinity": None, "tensorrt": None}),
    ({"device": "cuda:12", "intra_op_threads": 4, "inter_op_threads": 2, "cpu_affinity": [3, 0]},
     {"device": "cuda:12", "intra_op_threads": 4, "inter_op_threads": 2, "cpu_affinity": (3, 0), "tensorrt": None}),
    ({"intra_op_threads": 0, "cpu_affinity": [], "tensorrt": None},
     {"intra_op_threads": 0, "cpu_affinity": None, "tensorrt": None}),
    ({"tensorrt": {"enabled": False}}, {"device": "cpu", "tensorrt": TensorRTOptions(enabled=False)}),
    ({"device": "cuda:0", "tensorrt": {}}, {"tensorrt": TensorRTOptions()}),
    ({"device": "cuda:0", "tensorrt": {"fp16": True, "engine_cache": "/abs/engines"}},
     {"tensorrt": TensorRTOptions(fp16=True, engine_cache="/abs/engines")}),
])
def test_hardware_values_and_defaults(tmp_path: Path, edits: dict, expected: dict) -> None:
    hardware = load_manifest(write(tmp_path, "hardware", edits))
    assert {key: getattr(hardware, key) for key in expected} == expected


def test_a_relative_engine_cache_is_beside_the_manifest_and_home_is_expanded(tmp_path: Path) -> None:
    (tmp_path / "hw").mkdir()
    relative = load_manifest(write(tmp_path / "hw", "hardware", {"device": "cuda:0", "tensorrt": {"engine_cache": "e"}}))
    assert relative.tensorrt.engine_cache == str(tmp_path / "hw" / "e")
    home = load_manifest(write(tmp_path, "hardware", {"device": "cuda:0", "tensorrt": {"engine_cache": "~/trt"}}))
    assert home.tensorrt.engine_cache == str(Path.home() / "trt")
    assert home.tensorrt.describe() == {"enabled": True, "fp16": False, "engine_cache": str(Path.home() / "trt")}


def test_a_good_reference_yields_every_field(tmp_path: Path) -> None:
    reference = load_manifest(write(tmp_path, "reference", {
        "model.sha256": SHA, "dataset.version": "2.0.0-rc.1",
        "accuracy": {"top1": {"expected": 1, "tolerance": 0}, "top5": {"expected": 0.9, "tolerance": 0.01}},
        "performance": {"Offline": {"samples_per_second": 10}},
        "outputs": [{"sample": 0, "values": [0.5], "atol": 0.1}]}))
    assert reference.model == {"name": "m", "version": "1.0.0", "sha256": SHA}
    assert reference.dataset == {"name": "d", "version": "2.0.0-rc.1"}
    assert reference.backend == "null"
    assert reference.accuracy == {"top1": {"expected": 1.0, "tolerance": 0.0}, "top5": {"expected": 0.9, "tolerance": 0.01}}
    assert all(isinstance(v, float) for spec in reference.accuracy.values() for v in spec.values())
    assert reference.performance == {"Offline": {"samples_per_second": 10}}
    assert reference.outputs == ({"sample": 0, "values": [0.5], "atol": 0.1},)
    bare = load_manifest(write(tmp_path, "reference", {}, "bare.yaml"))
    assert (bare.accuracy, bare.performance, bare.outputs) == ({}, {}, ())
    assert bare.model == {"name": "m", "version": "1.0.0"}  # no sha256 key where the file gives none


GENERATIVE = {"framework.name": "transformers", "sources": {"weights": {"uri": "m.gguf", "sha256": SHA}}}


def test_a_generative_model_yields_its_generation_settings(tmp_path: Path) -> None:
    model = load_manifest(write(tmp_path, "model", {**GENERATIVE, "generation": {
        "max_new_tokens": 8, "chat_template": False, "system_prompt": "be brief", "stop": ["\n\n", "END"],
        "context_window": 64}}))
    assert model.generation == GenerationSpec(max_new_tokens=8, decoding="greedy", chat_template=False,
                                              system_prompt="be brief", stop=("\n\n", "END"), context_window=64)
    assert model.generation.describe() == {"max_new_tokens": 8, "decoding": "greedy", "chat_template": False,
                                           "system_prompt": "be brief", "stop": ["\n\n", "END"],
                                           "context_window": 64}
    assert model.sources["weights"] == Artifact(uri="m.gguf", sha256=SHA)
    least = load_manifest(write(tmp_path, "model", {**GENERATIVE, "generation": {"max_new_tokens": 2}}, "least.yaml"))
    assert least.generation.describe() == {"max_new_tokens": 2, "decoding": "greedy", "chat_template": True,
                                           "system_prompt": None, "stop": [], "context_window": None}
    assert load_manifest(write(tmp_path, "model", {}, "tensor.yaml")).generation is None


# -- loading: kind dispatch, sha256 and identity ----------------------------------------------------

@pytest.mark.parametrize("text, got", [
    ("kind: thing\nname: x\n", "'thing'"),
    ("kind: 5\n", "5"),
    ("name: x\n", "None"),
    ("- 1\n- 2\n", "[1, 2]"),
    ("kind: [model]\n", "['model']"),
    ("", "None"),
])
def test_an_unknown_kind_names_the_kinds(tmp_path: Path, text: str, got: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert problems_of(path) == [f"{path}: kind: expected one of {KINDS}, got {got}"]


def test_the_kind_argument_picks_the_parser(tmp_path: Path) -> None:
    path = write(tmp_path, "dataset")
    assert load_manifest(path, "dataset").kind == "dataset"
    assert problems_of(path, "hardware") == [
        f"{path}: kind: expected 'hardware', got 'dataset'",
        (f"{path}: samples: expected no such field (allowed: cpu_affinity, description, device, inter_op_threads, "
        "intra_op_threads, kind, name, system, tensorrt, version)"),
        (f"{path}: sample_count: expected no such field (allowed: cpu_affinity, description, device, "
        "inter_op_threads, intra_op_threads, kind, name, system, tensorrt, version)"),
        f"{path}: device: expected cpu or cuda:N (required field is missing)",
    ]
    with pytest.raises(ManifestError, match=r": kind: expected one of \['dataset'"):
        load_manifest(path, "datasets")


@pytest.mark.parametrize("kind", ["model", "dataset", "software", "hardware", "reference"])
def test_a_document_that_is_not_a_mapping_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("- 1\n- 2\n")
    assert problems_of(path, kind) == [f"{path}: <document>: expected a mapping with kind: {kind}, got [1, 2]"]


@pytest.mark.parametrize("kind", list(BASE))
def test_sha256_is_of_the_file_bytes_and_identity_names_the_file(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, kind)
    manifest = load_manifest(str(path))
    assert manifest.path == path and manifest.kind == kind
    assert manifest.doc == yaml.safe_load(path.read_text())
    assert manifest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest.ref == f"{manifest.name}@{manifest.version}"
    assert manifest.identity() == {"name": manifest.name, "version": manifest.version, "sha256": manifest.sha256,
                                   "path": str(path)}


def test_sha256_changes_with_any_byte_and_not_with_the_file_name(tmp_path: Path) -> None:
    first = load_manifest(write(tmp_path, "model"))
    same = load_manifest(write(tmp_path, "model", {}, "copy.yaml"))
    path = write(tmp_path, "model", {}, "commented.yaml")
    path.write_text(path.read_text() + "# a comment\n")
    commented = load_manifest(path)
    assert same.sha256 == first.sha256 and same.path != first.path
    assert commented.sha256 != first.sha256 and commented.inputs == first.inputs
    assert load_manifest(write(tmp_path, "model")) == first  # the same file loads equal


# -- the YAML reader ---------------------------------------------------------------------------------

def test_a_yaml_syntax_error_names_the_line_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("kind: model\nname: x\n  version: 1.0.0\n")
    with pytest.raises(ManifestError) as info:
        load_yaml(path)
    assert info.value.problems == [f"{path}: line 3: expected valid YAML, mapping values are not allowed here"]


def test_a_yaml_reader_error_without_a_position_is_named_yaml(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("kind: \x07model\n")
    with pytest.raises(ManifestError) as info:
        load_yaml(path)
    assert info.value.problems == [
        f"{path}: YAML: expected valid YAML, unacceptable character #x0007: special characters are not allowed"]


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError) as missing:
        load_manifest(tmp_path / "nope.yaml")
    assert str(missing.value) == f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory"
    with pytest.raises(UserError) as folder:
        load_yaml(tmp_path)
    assert str(folder.value) == f"{tmp_path}: cannot read: Is a directory"


def test_a_yaml_error_with_a_context_names_the_problem_not_the_context(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("kind: model\nname: [unclosed\n")
    with pytest.raises(ManifestError) as info:
        load_yaml(path)
    assert info.value.problems == [f"{path}: line 3: expected valid YAML, expected ',' or ']', but got '<stream end>'"]


def test_manifests_are_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("kind: software\nname: s\nversion: 1.0.0\ndescription: \"gr\u00fc\u00df\"\n", encoding="utf-8")
    code = "import sys; from mlharness.specs.manifests import load_manifest; sys.exit(load_manifest(sys.argv[1]).doc['description'] != 'gr\\u00fc\\u00df')"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": "ascii"}
    # The folder holding the mlharness package this test imported (the checkout, or a mutation run's copy,
    # where the package is mlharness/ and specs mlharness/specs/), so the child imports the same code.
    root = Path(mlharness.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=root, env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_load_yaml_returns_the_document(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("a: [1, 2]\nb: {c: ü}\n", encoding="utf-8")
    assert load_yaml(path) == {"a": [1, 2], "b": {"c": "ü"}}


# -- pydantic's errors as one-line problems (mlharness.specs.validation.problems_from) -----------------------

def _no_zero(value: int) -> int:
    if value == 0:
        refuse("a number other than 0")
    return value


class _Inner(Doc):
    expected: ClassVar[str] = "a mapping {n}"

    n: int = Field(ge=1, description="a count >= 1")


class _Outer(Doc):
    expected: ClassVar[str] = "a mapping with kind: t"

    k: str = Field(description="E")
    opt: str = Field("d", description="O")
    items: list[Annotated[int, AfterValidator(_no_zero), Expect("an item")]] = Field(default_factory=list,
                                                                                     description="a list")
    inner: _Inner | None = Field(None, description=_Inner.expected)
    keyed: dict[Annotated[str, Field(pattern="^[a-z]+$"), Expect("a lowercase key")], int] = Field(
        default_factory=dict, description="a mapping")
    renamed: int = Field(0, alias="from", description="R")
    mode: Literal["fast", "slow"] = "fast"  # no description: the expectation is the Literal's choices
    counts: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)  # ... or the plain type's
    plain: dict[int, int] = Field(default_factory=dict)  # a key without an Expect: its type says

    @model_validator(mode="after")
    def _both(self) -> "_Outer":
        if self.k == "both":
            refuse_all([(("opt",), "not 'd' when k is both", self.opt), (("inner",), "a mapping when k is both", None)])
        return self


def _problems(doc: Any) -> list[str]:
    with pytest.raises(ValidationError) as info:
        _Outer.model_validate(doc)
    return problems_from(info.value, "f.yaml", _Outer)


@pytest.mark.parametrize("doc, problems", [
    ([1, 2], ["<document>: expected a mapping with kind: t, got [1, 2]"]),
    ({}, ["k: expected E (required field is missing)"]),
    ({"k": None}, ["k: expected E (required field is missing)"]),  # `k:` with no value is absent
    ({"k": ""}, ["k: expected E (required field is missing)"]),  # empty is missing for a required field
    ({"k": 3}, ["k: expected E, got 3"]),
    ({"k": ["y" * 100]}, [f"k: expected E, got ['{'y' * 55}..."]),
    ({"k": "x", "opt": 1}, ["opt: expected O, got 1"]),
    ({"k": "x", "zz": 1, "z": 2}, ["zz: expected no such field (allowed: counts, from, inner, items, k, keyed, mode, opt, plain)",
                                   "z: expected no such field (allowed: counts, from, inner, items, k, keyed, mode, opt, plain)"]),
    ({"k": "x", "items": "1"}, ["items: expected a list, got '1'"]),
    ({"k": "x", "items": [1, "2", 0]}, ["items[1]: expected an item, got '2'", "items[2]: expected a number other than 0, got 0"]),
    ({"k": "x", "inner": 5}, ["inner: expected a mapping {n}, got 5"]),
    ({"k": "x", "inner": {}}, ["inner.n: expected a count >= 1 (required field is missing)"]),
    ({"k": "x", "inner": {"n": 0, "m": 1}}, ["inner.n: expected a count >= 1, got 0",
                                            "inner.m: expected no such field (allowed: n)"]),
    ({"k": "x", "keyed": {"ok": "1", "Bad": 2}}, ["keyed.ok: expected an integer, got '1'",
                                                  "keyed.Bad: expected a lowercase key, got 'Bad'"]),
    ({"k": "x", "from": "1"}, ["from: expected R, got '1'"]),
    ({"k": "x", "mode": "medium"}, ["mode: expected one of fast, slow, got 'medium'"]),
    ({"k": "x", "counts": [1, "2", -1]}, ["counts[1]: expected an integer, got '2'", "counts[2]: expected an integer, got -1"]),
    ({"k": "x", "plain": {"a": 1}}, ["plain.a: expected an integer, got 'a'"]),  # the key's plain type
    ({"k": "both"}, ["opt: expected not 'd' when k is both, got 'd'", "inner: expected a mapping when k is both"]),
])
def test_problems_name_the_path_what_was_expected_and_the_value(doc: Any, problems: list[str]) -> None:
    assert _problems(doc) == [f"f.yaml: {line}" for line in problems]


def test_problems_of_fields_a_document_lacks_come_after_those_it_has() -> None:
    doc = {"inner": {"n": 0}, "from": "x"}  # k is missing
    with pytest.raises(ValidationError) as info:
        _Outer.model_validate(doc)
    assert problems_from(info.value, "f", _Outer, doc) == [
        "f: inner.n: expected a count >= 1, got 0", "f: from: expected R, got 'x'",
        "f: k: expected E (required field is missing)"]


def test_an_optional_field_given_empty_keeps_it_and_none_gives_the_default() -> None:
    assert _Outer.model_validate({"k": "x", "opt": ""}).opt == ""
    assert _Outer.model_validate({"k": "x", "opt": None}).opt == "d"


def test_a_manifest_error_is_a_user_error_of_its_lines() -> None:
    error = ManifestError(["f: a: expected b", "f: c: expected d"])
    assert isinstance(error, UserError) and error.problems == ["f: a: expected b", "f: c: expected d"]
    assert str(error) == "f: a: expected b\nf: c: expected d"


@pytest.mark.parametrize("value, text", [
    ("x" * 58, repr("x" * 58)),          # 60 characters with the quotes: kept
    ("x" * 59, repr("x" * 59)[:57] + "..."),  # 61: cut to 57 and an ellipsis
    (1.5, "1.5"),
])
def test_short_keeps_60_characters(value: Any, text: str) -> None:
    assert _short(value) == text
    assert len(_short(value)) <= 60


@pytest.mark.parametrize("regex, good, bad", [
    (SEMVER, ["1.0.0", "10.20.30", "1.0.0-rc.1", "1.0.0+build.5", "0.0.1-a-b"],
     ["1.0", "v1.0.0", "1.0.0-", "1.0.0 ", "1.0.0.0", "a.b.c", "", "1.0.0-rc_1"]),
    (SHA256, ["0123456789abcdef" * 4], ["a" * 63, "a" * 65, "A" * 64, "g" * 64, " " + "a" * 63]),
    (NAME, ["a", "A-b_c.d", "9x", "resnet50-light"], ["", "-a", ".a", "_a", "a b", "a/b", "a:b", "a@1"]),
    (CODE_REF, ["m:f", "pkg.mod:func_1", "_m:_f", "a1.b2:C3"],
     ["m", "m:", ":f", "m:f.g", "1m:f", "m:1f", "m-x:f", "m:f()", "m f:g"]),
    (DIM_NAME, ["batch", "_x", "x1", "N"], ["1x", "x-y", "", "x y", "x.y"]),
])
def test_the_name_patterns(regex: Any, good: list[str], bad: list[str]) -> None:
    assert [g for g in good if not regex.match(g)] == []
    assert [b for b in bad if regex.match(b)] == []


# -- tensor specs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, sample", [
    (("batch", 3, 224, 224), (3, 224, 224)),
    (("batch",), ()),
    ((), ()),
    ((1, 3), (1, 3)),
    (("n", 3), ("n", 3)),
    ((3, "batch"), (3, "batch")),
    (("batch", "seq"), ("seq",)),
])
def test_sample_shape_drops_only_a_leading_batch(shape: tuple, sample: tuple) -> None:
    assert TensorSpec(name="x", element_type="float32", shape=shape).sample_shape() == sample


def test_tensor_shapes_keep_sizes_and_symbolic_dims(tmp_path: Path) -> None:
    model = load_manifest(write(tmp_path, "model", {"inputs.0.shape": ["batch", "seq", 1, 768],
                                                    "inputs.0.element_type": "int64"}))
    spec = model.inputs[0]
    assert spec.shape == ("batch", "seq", 1, 768) and spec.sample_shape() == ("seq", 1, 768)
    assert spec.element_type == "int64" and spec.layout is None


# -- names the runtime owns, entry points -------------------------------------------------------------

def test_known_names_asks_the_registered_source_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["a"]
    monkeypatch.setattr(validation, "_NAME_SOURCES", {})
    manifests.register_names("framework", lambda: names)
    first = manifests.known_names("framework")
    first.append("mutated")
    names.append("b")
    assert manifests.known_names("framework") == ["a", "b"]


def test_known_names_imports_the_owner_that_registers_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rules_test_owner.py").write_text(
        "from mlharness.specs.manifests import register_names\nregister_names('widget', lambda: ['w1', 'w2'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(validation.NAME_OWNERS, "widget", "rules_test_owner")
    monkeypatch.setattr(validation, "_NAME_SOURCES", {})
    monkeypatch.delitem(sys.modules, "rules_test_owner", raising=False)
    assert manifests.known_names("widget") == ["w1", "w2"]
    sys.modules.pop("rules_test_owner", None)


def test_a_registered_framework_name_is_accepted_by_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(validation._NAME_SOURCES, "framework", lambda: ["null", "myfw"])
    model = load_manifest(write(tmp_path, "model", {"framework.name": "myfw"}))
    assert model.framework == "myfw"
    path = write(tmp_path, "model", {}, "ort.yaml")
    assert problems_of(path) == [f"{path}: framework.name: expected one of ['null', 'myfw'], got 'onnxruntime'"]


def test_entry_points_are_by_name_and_not_loaded() -> None:
    found = manifests.entry_points("console_scripts")
    assert "pytest" in found
    assert isinstance(found["pytest"], importlib.metadata.EntryPoint) and found["pytest"].name == "pytest"
    assert manifests.entry_points("mlharness.no-such-group") == {}


# A real plugin distribution, as tests/test_registries.py installs one: a package beside a `*.dist-info`
# folder (METADATA, entry_points.txt) on sys.path, which is what `pip install` leaves and what
# importlib.metadata reads. Its entry points are in a group of this test's own.
PLUGIN_GROUP = "mlharness.rules-test"
PLUGIN_ENTRY_POINTS = f"""
[{PLUGIN_GROUP}]
builtin = mlh_rules_plugin.good:thing
extra = mlh_rules_plugin.good:thing
more = mlh_rules_plugin.good:other
missing = mlh_rules_plugin.missing:Backend
runtime = mlh_rules_plugin.raises_runtime:Backend
value = mlh_rules_plugin.raises_value:Backend
"""
PLUGIN_MODULES = {
    "__init__": "",
    "good": "thing = object()\nother = object()\n",
    "raises_runtime": "raise RuntimeError('first line\\nsecond line')\n",
    "raises_value": "raise ValueError()\n",
}


@pytest.fixture
def plugin_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The distribution mlh-rules-plugin 2.1.0 installed in a folder on sys.path (for this test only);
    its entry_points.txt, which a test may rewrite."""
    site = tmp_path / "site"
    package = site / "mlh_rules_plugin"
    package.mkdir(parents=True)
    for name, source in PLUGIN_MODULES.items():
        (package / f"{name}.py").write_text(source)
    dist = site / "mlh_rules_plugin-2.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlh-rules-plugin\nVersion: 2.1.0\n")
    (dist / "entry_points.txt").write_text(PLUGIN_ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    yield dist / "entry_points.txt"
    for module in [m for m in sys.modules if m == "mlh_rules_plugin" or m.startswith("mlh_rules_plugin.")]:
        del sys.modules[module]


def test_plugin_entry_points_leave_out_builtins_and_are_read_once(plugin_dist: Path) -> None:
    plugins = manifests.PluginEntryPoints(PLUGIN_GROUP, {"builtin": object()})
    assert plugins.group == PLUGIN_GROUP
    # read at the first call, not when the registry is made
    plugin_dist.write_text(PLUGIN_ENTRY_POINTS + "late = mlh_rules_plugin.good:other\n")
    found = plugins()
    assert {name: (ep.value, ep.dist.name) for name, ep in found.items()} == {
        "extra": ("mlh_rules_plugin.good:thing", "mlh-rules-plugin"),
        "more": ("mlh_rules_plugin.good:other", "mlh-rules-plugin"),
        "missing": ("mlh_rules_plugin.missing:Backend", "mlh-rules-plugin"),
        "runtime": ("mlh_rules_plugin.raises_runtime:Backend", "mlh-rules-plugin"),
        "value": ("mlh_rules_plugin.raises_value:Backend", "mlh-rules-plugin"),
        "late": ("mlh_rules_plugin.good:other", "mlh-rules-plugin")}
    assert not [m for m in sys.modules if m.startswith("mlh_rules_plugin")]  # nothing imported
    # then kept: the installed entry points change, the registry's do not
    plugin_dist.write_text(f"[{PLUGIN_GROUP}]\nother = mlh_rules_plugin.good:thing\n[mlharness.rules-none]\n"
                           f"new = mlh_rules_plugin.good:thing\n")
    assert sorted(manifests.entry_points(PLUGIN_GROUP)) == ["other"]
    assert plugins() is found and sorted(plugins()) == ["extra", "late", "missing", "more", "runtime", "value"]


def test_an_empty_plugin_group_is_kept_too(plugin_dist: Path) -> None:
    empty = manifests.PluginEntryPoints("mlharness.rules-none", {})
    assert empty() == {}
    plugin_dist.write_text(PLUGIN_ENTRY_POINTS + "[mlharness.rules-none]\nnew = mlh_rules_plugin.good:thing\n")
    assert sorted(manifests.entry_points("mlharness.rules-none")) == ["new"]
    assert empty() == {}


@pytest.mark.parametrize("name, message", [
    ("missing", "ModuleNotFoundError: No module named 'mlh_rules_plugin.missing'"),
    ("runtime", "RuntimeError: first line"),
    ("value", "ValueError: "),
])
def test_an_entry_point_that_cannot_load_is_one_line(plugin_dist: Path, name: str, message: str) -> None:
    ep = manifests.entry_points(PLUGIN_GROUP)[name]
    with pytest.raises(UserError) as info:
        load_entry_point(ep)
    assert str(info.value) == (f"entry point {PLUGIN_GROUP}:{name} = {ep.value} (from mlh-rules-plugin 2.1.0) "
                               f"cannot be loaded: {message}")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_an_entry_point_without_a_distribution_is_named_unknown(plugin_dist: Path) -> None:
    """An EntryPoint made by hand, not read from an installed distribution, has no dist."""
    ep = importlib.metadata.EntryPoint("bare", "mlh_rules_plugin.raises_runtime:Backend", "g")
    assert ep.dist is None
    with pytest.raises(UserError) as info:
        load_entry_point(ep)
    assert str(info.value) == ("entry point g:bare = mlh_rules_plugin.raises_runtime:Backend (from an unknown "
                               "distribution) cannot be loaded: RuntimeError: first line")


def test_an_entry_point_loads_its_object(plugin_dist: Path) -> None:
    found = manifests.entry_points(PLUGIN_GROUP)
    thing, other = load_entry_point(found["extra"]), load_entry_point(found["more"])
    import mlh_rules_plugin.good

    assert thing is mlh_rules_plugin.good.thing and other is mlh_rules_plugin.good.other
    real = importlib.metadata.EntryPoint("join", "os.path:join", "g")
    import os.path

    assert load_entry_point(real) is os.path.join
    with pytest.raises(UserError, match=r"^entry point g:bad = no_such_module_xyz:f \(from an unknown distribution\) "
                                        r"cannot be loaded: ModuleNotFoundError: No module named 'no_such_module_xyz'$"):
        load_entry_point(importlib.metadata.EntryPoint("bad", "no_such_module_xyz:f", "g"))


# -- one type per kind: built in code as from a file (mlharness.sut.conversion builds its CPU hardware) --

@pytest.mark.parametrize("made, expected", [
    (lambda: TensorSpec(name="x", element_type="float32", shape=[1]),
     {"type": "tensor", "layout": None, "shape": (1,)}),
    (lambda: Artifact(uri="u", sha256=SHA), {"convert": None, "transforms": None}),
    (lambda: Conversion(source="a.yaml", to="onnx"), {"opset": None, "example_dims": {}}),
    (lambda: TensorRTOptions(), {"enabled": True, "fp16": False, "engine_cache": None}),
    (lambda: manifests.HardwareManifest(**BASE["hardware"]), {
        "device": "cpu", "intra_op_threads": 0, "inter_op_threads": 0, "cpu_affinity": None, "tensorrt": None,
        "path": Path(), "sha256": "", "doc": {}}),
])
def test_built_in_code_with_its_defaults(made: Any, expected: dict) -> None:
    built = made()
    assert {key: getattr(built, key) for key in expected} == expected


def test_the_runtime_names_are_the_schema_types() -> None:
    from mlharness.specs import schema

    assert (manifests.ModelManifest, manifests.DatasetManifest, manifests.SoftwareManifest,
            manifests.HardwareManifest, manifests.ReferenceLog, manifests.Manifest) == \
        (schema.ModelDoc, schema.DatasetDoc, schema.SoftwareDoc, schema.HardwareDoc, schema.ReferenceDoc,
         schema.ManifestDoc)
    assert (TensorSpec, GenerationSpec, TensorRTOptions, Artifact, Conversion) == \
        (schema.Tensor, schema.Generation, schema.TensorRT, schema.Artifact, schema.Conversion)


def test_a_manifest_is_frozen_and_its_field_names_are_not_file_keys(tmp_path: Path) -> None:
    model = load_manifest(write(tmp_path, "model"))
    with pytest.raises(ValidationError):
        model.name = "other"  # type: ignore[misc]
    inner_name = {"framework": DEL, "framework_section": {"name": "onnxruntime"}}  # a field's own name, not the file's
    with pytest.raises(ManifestError, match=r"framework_section: expected no such field"):
        load_manifest(write(tmp_path, "model", inner_name, "inner.yaml"))


def test_a_manifest_compares_without_its_document() -> None:
    bare = manifests.SoftwareManifest(**BASE["software"])
    one = bare.located(Path("p.yaml"), SHA, {})
    assert one == bare.located(Path("p.yaml"), SHA, {"other": 1})
    assert one != bare.located(Path("q.yaml"), SHA, {}) and one != bare.located(Path("p.yaml"), "b" * 64, {})
    assert one != manifests.SoftwareManifest(**{**BASE["software"], "version": "1.0.1"}).located(Path("p.yaml"), SHA)
    assert "doc" not in repr(one) and one.identity() == {"name": "s", "version": "1.0.0", "sha256": SHA,
                                                         "path": "p.yaml"}


def test_a_manifest_that_is_not_utf8_is_a_one_line_error(tmp_path: Path) -> None:
    from mlharness.specs.validation import ManifestError, load_yaml

    path = tmp_path / "latin1.yaml"
    path.write_bytes("kind: model\nname: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ManifestError) as caught:
        load_yaml(path)
    assert str(caught.value) == f"{path}: byte 21: expected UTF-8 text, got b'\\xe9'"
