"""The settings rules that mutation testing of the settings module (tools/mutation/modules.toml) found
without a test in its selection, each as a known answer, in process: the tuned layer of build_settings,
a preset looked up under the request's scenarios folder, the message of a choice setting, where presets
are found ($MLHARNESS_SCENARIOS, the shipped ones whatever it says, a broken install), and a preset's
problems in its document's order. docs/notes/mutation-2026-11-27.md names the mutants."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

import mlharness.scenarios
from mlharness.errors import UserError
from mlharness.running.presets import load_preset, scenarios_from_environment, shipped_scenarios
from mlharness.running.settings import build_settings
from mlharness.specs.validation import ManifestError

RUN = {"scenario": "Offline", "mode": "performance", "conf_model": "m", "model_name": "rn"}


def test_the_tuned_layer_sits_between_the_model_and_the_presets() -> None:
    settings = build_settings(**RUN, model_hints={"*": {"workers": 1, "min_duration": 5}},
                              tuned={"workers": 2, "target_qps": 40.5}, tuned_where="tuned tune-7")
    assert settings.layers == ["model", "tuned"]
    assert settings.harness == {"workers": 2} and settings.loadgen == {"min_duration": "5", "target_qps": "40.5"}
    assert settings.origin == {"workers": "tuned", "min_duration": "model", "target_qps": "tuned"}
    assert settings.where == {"workers": "tuned tune-7", "min_duration": "model rn: attributes.settings: *",
                              "target_qps": "tuned tune-7"}


def test_a_tuned_setting_says_where_it_came_from_by_default() -> None:
    assert build_settings(**RUN, tuned={"workers": 3}).where == {"workers": "tuned"}
    with pytest.raises(UserError) as info:
        build_settings(**RUN, tuned={"workerz": 3})
    assert str(info.value) == "tuned: unknown setting 'workerz' (did you mean 'workers'?)"


def test_no_tuned_layer_without_a_tuned_configuration() -> None:
    assert build_settings(**RUN, tuned={}).layers == []


def test_a_preset_name_is_looked_up_under_the_requests_scenarios_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHARNESS_SCENARIOS", raising=False)
    (tmp_path / "mine.yaml").write_text("settings:\n  Offline: {min_duration: 9}\n")
    settings = build_settings(**RUN, presets=["mine"], scenarios_root=tmp_path)
    assert settings.layers == ["preset:mine"] and settings.loadgen == {"min_duration": "9"}
    assert settings.where == {"min_duration": f"{tmp_path / 'mine.yaml'}: Offline"}


def test_a_choice_setting_names_its_choices() -> None:
    with pytest.raises(UserError) as info:
        build_settings(**RUN, overrides=["graph_optimization=most"])
    assert str(info.value) == ("--set graph_optimization=most: graph_optimization: expected one of all, extended, "
                               "basic, disable_all, got 'most'")


def test_the_environments_scenarios_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(tmp_path))
    assert scenarios_from_environment() == tmp_path
    monkeypatch.setenv("MLHARNESS_SCENARIOS", "")
    assert scenarios_from_environment() is None
    monkeypatch.delenv("MLHARNESS_SCENARIOS")
    assert scenarios_from_environment() is None


def test_the_shipped_presets_whatever_the_environment_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLHARNESS_SCENARIOS", str(tmp_path))
    assert shipped_scenarios() == Path(mlharness.scenarios.__file__).parent


def test_shipped_presets_that_cannot_be_found_say_which_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(package: str) -> None:
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(UserError) as info:
        shipped_scenarios()
    assert str(info.value) == ("the scenarios shipped with mlharness cannot be found (No module named "
                               "'mlharness.scenarios'): reinstall mlharness (in a checkout: pip install -e .) "
                               "or set $MLHARNESS_SCENARIOS")


def test_a_presets_problems_follow_its_document(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("settings:\n  Offlin: {min_duration: 1}\ndescription: 5\n")
    with pytest.raises(ManifestError) as info:
        load_preset(str(path))
    assert [line.removeprefix(f"{path}: ").partition(":")[0] for line in info.value.problems] == \
        ["settings.Offlin", "description"]
