"""The manifest layer's rules that mutation testing of the manifests module (tools/mutation/modules.toml)
found without a test in its selection, each as a known answer, in process: a model's attributes
(batch size, sample count, scoped settings), the framework rules' problem lines for the generative
frameworks and for generation settings elsewhere, the YAML reader's refusal of a key given twice, and
a manifest made in code (no document read). docs/notes/mutation-2026-11-27.md names the mutants."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import jsonschema
import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from mlharness.specs.manifests import HardwareManifest, known_names, load_manifest
from mlharness.specs.model_schema import FRAMEWORK_RULES
from mlharness.specs.schema_fields import Doc, nonblank, version_constraint
from mlharness.specs.validation import ManifestError, NamesOf, load_yaml, problems_from
from tests.support import run_cli

SHA = "a" * 64
MODEL: dict[str, Any] = {
    "kind": "model", "name": "tiny", "version": "1.2.3",
    "framework": {"name": "onnxruntime", "version": ">=1.0"},
    "inputs": [{"name": "x", "type": "tensor", "element_type": "float32", "shape": ["batch", 4]}],
    "outputs": [{"name": "y", "type": "tensor", "element_type": "float32", "shape": ["batch", 2]}],
    "sources": {"graph": {"uri": "model.onnx", "sha256": SHA}},
}
DEL_SOURCES = object()  # a model without sources
SCOPES = "'*' or one of SingleStream, MultiStream, Server, Offline"


def problems(tmp_path: Path, **fields: Any) -> list[str]:
    """The problem lines of the model manifest MODEL with `fields` replaced, the file's path cut off."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**MODEL, **fields}, sort_keys=False))
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    return [line.removeprefix(f"{path}: ") for line in info.value.problems]


# -- a model's attributes -----------------------------------------------------------------------------

@pytest.mark.parametrize("attributes, expected", [
    ({"max_batch_size": 0}, "attributes.max_batch_size: expected a batch size >= 1, got 0"),
    ({"max_batch_size": True}, "attributes.max_batch_size: expected a batch size >= 1, got True"),  # a bool is no count
    ({"max_batch_size": "eight"}, "attributes.max_batch_size: expected a batch size >= 1, got 'eight'"),
    ({"performance_sample_count": -5}, "attributes.performance_sample_count: expected a sample count >= 1, got -5"),
    ({"settings": 5}, "attributes.settings: expected a mapping '*'|Scenario -> {setting: value}, got 5"),
    ({"settings": {"Offlne": {}}},
     "attributes.settings.Offlne: expected '*' or a scenario name (did you mean 'Offline'?), got 'Offlne'"),
    ({"settings": {"xyz": {}}}, f"attributes.settings.xyz: expected {SCOPES}, got 'xyz'"),  # nothing close
    ({"settings": {"Server": 5}}, "attributes.settings.Server: expected a mapping of settings, got 5"),
    ({"settings": {"Offline": {"target_qpps": 1}}},
     "attributes.settings.Offline.target_qpps: expected a setting name (did you mean 'target_qps'?), "
     "got 'target_qpps'"),
    ({"settings": {"Offline": {"zzzzz": 1}}}, "attributes.settings.Offline.zzzzz: expected a setting name (not "
     "a LoadGen user.conf key or a harness key; README lists them), got 'zzzzz'"),
])
def test_a_bad_model_attribute_is_its_one_line(tmp_path: Path, attributes: dict, expected: str) -> None:
    assert problems(tmp_path, attributes=attributes) == [expected]


def test_every_bad_attribute_is_named_in_the_documents_order(tmp_path: Path) -> None:
    attributes = {"max_batch_size": 0, "settings": {"*": None, "SingleStream": {"min_duration": 1},
                                                    "Offline": {"target_qpps": 1}, "Foo": {}, "Server": 5}}
    assert problems(tmp_path, attributes=attributes) == [
        "attributes.max_batch_size: expected a batch size >= 1, got 0",
        "attributes.settings.Offline.target_qpps: expected a setting name (did you mean 'target_qps'?), "
        "got 'target_qpps'",
        f"attributes.settings.Foo: expected {SCOPES}, got 'Foo'",
        "attributes.settings.Server: expected a mapping of settings, got 5",
    ]


def test_good_attributes_are_kept_whole(tmp_path: Path) -> None:
    attributes = {"max_batch_size": 8, "performance_sample_count": 1, "my_hint": [1],
                  "settings": {"*": None, "Offline": {"target_qps": 5, "max_batch_size": 4}, "Server": {}}}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**MODEL, "attributes": attributes}, sort_keys=False))
    assert load_manifest(path).attributes == attributes


# -- what each framework needs, by the one table of rules ---------------------------------------------

@pytest.mark.parametrize("framework", ["transformers", "llama_cpp"])
def test_a_generative_model_without_weights_or_generation_names_its_framework(tmp_path: Path, framework: str) -> None:
    assert problems(tmp_path, framework={"name": framework}, sources={}) == [
        f"sources.weights: expected the model's weights {{uri, sha256}} (a GGUF file) for framework {framework}",
        f"generation: expected a mapping {{max_new_tokens, decoding, ...}} for framework {framework}",
    ]


def test_generation_settings_are_refused_for_a_tensor_model(tmp_path: Path) -> None:
    assert problems(tmp_path, generation={"max_new_tokens": 4}) == [
        "generation: expected no generation settings for framework onnxruntime (generative frameworks: "
        "transformers, llama_cpp), got 'a mapping'"]


WEIGHTS = {"uri": "w.gguf", "sha256": SHA}


FRAMEWORK_CASES = [
    ({"framework": {"name": "torch"}, "sources": {"torchscript": {"uri": "m.pt", "sha256": SHA}}}, False),
    ({"framework": {"name": "torch"}, "sources": {"module": {"factory": "m:f"}}}, False),
    ({"framework": {"name": "torch"}, "sources": {"weights": WEIGHTS}}, True),  # neither of the two it needs
    ({"framework": {"name": "onnxruntime"}, "sources": {"weights": WEIGHTS}}, True),  # no graph
    ({"generation": {"max_new_tokens": 4}}, True),  # generation settings on a tensor model
    ({"framework": {"name": "transformers"}, "sources": {"weights": WEIGHTS}, "generation": {"max_new_tokens": 4}},
     False),
    ({"framework": {"name": "llama_cpp"}, "sources": {"weights": WEIGHTS}}, True),  # no generation settings
    ({"framework": {"name": "null"}, "sources": DEL_SOURCES}, False),
]


@pytest.mark.parametrize("fields, refused", FRAMEWORK_CASES)
def test_the_written_json_schema_says_what_each_framework_needs(tmp_path: Path, fields: dict, refused: bool) -> None:
    """The same rules as the loader, in the JSON Schema `specs schema` writes for editors (an if/then each)."""
    assert run_cli("specs", "schema", "--out", str(tmp_path)) == 0
    validator = jsonschema.Draft202012Validator(json.loads((tmp_path / "model.schema.json").read_text()))
    doc = {key: value for key, value in {**MODEL, **fields}.items() if value is not DEL_SOURCES}
    assert bool(list(validator.iter_errors(doc))) is refused


@pytest.mark.parametrize("fields, refused", FRAMEWORK_CASES)
def test_the_framework_rules_written_now_say_the_same(fields: dict, refused: bool) -> None:
    """The table's if/then rules built in the test (the model class builds them once, at import, where a
    mutation run cannot reach them): the same verdicts as the written schema above."""
    validator = jsonschema.Draft202012Validator({"allOf": [rule.json_schema() for rule in FRAMEWORK_RULES]})
    doc = {key: value for key, value in {**MODEL, **fields}.items() if value is not DEL_SOURCES}
    assert bool(list(validator.iter_errors(doc))) is refused


# -- the validators the schema classes are built with, built in the test --------------------------------

def fields_model() -> type[Doc]:
    """Made in the test, not at import: a mutation run forks its test processes after collection."""
    class Fields(Doc):
        name: Annotated[str, nonblank("a non-blank name")] = "x"
        version: Annotated[str, version_constraint("a version constraint such as '>=1.17'")] = ""
        framework: Annotated[str, NamesOf("framework")] = "null"
    return Fields


@pytest.mark.parametrize("doc, lines", [
    ({"name": " "}, ["name: expected a non-blank name, got ' '"]),
    ({"version": ">=x.y"}, ["version: expected a version constraint such as '>=1.17', got '>=x.y'"]),
    ({"framework": "tensorflow"}, [f"framework: expected one of {known_names('framework')}, got 'tensorflow'"]),
    ({"name": "n", "version": ">=1.17,<2", "framework": "onnxruntime"}, []),
])
def test_the_field_validators_refuse_with_their_text(doc: dict, lines: list[str]) -> None:
    model = fields_model()
    try:
        model.model_validate(doc)
        found: list[str] = []
    except ValidationError as exc:
        found = [line.removeprefix("f: ") for line in problems_from(exc, "f", model, doc)]
    assert found == lines


def test_a_registry_field_lists_its_names_in_the_json_schema() -> None:
    assert TypeAdapter(Annotated[str, NamesOf("framework")]).json_schema()["enum"] == known_names("framework")


# -- a manifest made in code --------------------------------------------------------------------------

def test_a_manifest_located_without_a_document_has_an_empty_one() -> None:
    hardware = HardwareManifest(kind="hardware", name="h", version="1.0.0", device="cpu").located(Path("<here>"), "")
    assert hardware.doc == {} and hardware.path == Path("<here>") and hardware.sha256 == ""
    assert hardware.located(Path("x"), "s", {"a": 1}).doc == {"a": 1}


# -- a key given twice ---------------------------------------------------------------------------------

def yaml_problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "d.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_yaml(path)
    return [line.removeprefix(f"{path}: ") for line in info.value.problems]


@pytest.mark.parametrize("text, expected", [
    ("a: 1\nb: 2\na: 3\n", "line 3: key 'a' given twice (first on line 1)"),
    ("top:\n  x: 1\n\n  x: 2\n", "line 4: key 'x' given twice (first on line 2)"),
    ("5: a\n5: b\n", "line 2: key 5 given twice (first on line 1)"),
    # after a merge the keys are still checked: only the merge itself is YAML's override
    ("base: &b {a: 1}\nd:\n  <<: *b\n  c: 1\n  c: 2\n", "line 5: key 'c' given twice (first on line 4)"),
    # after an unhashable key (which the reader refuses too) the keys are still checked, and first
    ("? [x]\n: 1\nb: 2\nb: 3\n", "line 4: key 'b' given twice (first on line 3)"),
])
def test_a_key_given_twice_names_both_lines(tmp_path: Path, text: str, expected: str) -> None:
    assert yaml_problems(tmp_path, text) == [f"{expected}; YAML would keep only the last"]


def test_merges_and_keys_given_once_read_as_yaml_says(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("base: &b {a: 1, b: 2}\nmore: &m {e: 5}\nd:\n  <<: [*b, *m]\n  b: 3\n  c: 4\nself: &s {x: *b}\n")
    assert load_yaml(path) == {"base": {"a": 1, "b": 2}, "more": {"e": 5}, "d": {"a": 1, "b": 3, "c": 4, "e": 5},
                               "self": {"x": {"a": 1, "b": 2}}}


@pytest.mark.parametrize("text", [
    "r: &r {x: 1, self: *r}\n",  # a mapping that holds itself: PyYAML builds it, so does the reader
    "s: &s [1, *s]\n",
    "a: &a {x: 1}\nb: {<<: *a, y: [1, {z: 2}]}\n",
    "? [a, b]\n: 1\n",  # an unhashable key: PyYAML's own refusal
])
def test_a_document_without_a_repeated_key_reads_as_pyyamls_safe_loader_reads_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(text)
    try:
        expected = repr(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        mark = exc.problem_mark  # type: ignore[attr-defined]
        expected = f"{path}: line {mark.line + 1}: expected valid YAML, {exc.problem}"  # type: ignore[attr-defined]
    try:
        got = repr(load_yaml(path))
    except ManifestError as exc:
        got = "\n".join(exc.problems)
    assert got == expected
