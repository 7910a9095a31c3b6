"""The untuned note ("`mlharness tune` would search ...") is advice, so it is said once per model,
scenario and system under a results folder, only after the run's inputs proved good, and never
where there is nothing to tune (the null backend)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import run_cli, tiny_torch_model, write_manifest

ARGS = ("--scenario", "Offline", "--quick", "--set", "min_duration=100", "--set", "target_qps=500")


def _notes(capfd: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if "is untuned for" in line]


@pytest.fixture(autouse=True)
def _display_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHARNESS_PROGRESS", raising=False)  # the note is part of what a run says


def test_said_once_per_model_scenario_and_system(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = write_manifest(tmp_path, "tiny-cnn", tiny_torch_model())
    results = tmp_path / "results"
    assert run_cli("run", str(model), *ARGS, "--results-dir", str(results)) == 0
    assert len(_notes(capfd)) == 1
    assert run_cli("run", str(model), *ARGS, "--results-dir", str(results)) == 0
    assert _notes(capfd) == []


def test_never_before_bad_input_nor_for_the_null_backend(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    broken = tiny_torch_model().replace("return np.array([sample % 7], dtype=np.float32)", "raise ValueError('bad')")
    assert "raise ValueError('bad')" in broken
    model = write_manifest(tmp_path, "tiny-cnn", broken)
    results = tmp_path / "results"
    assert run_cli("run", str(model), *ARGS, "--results-dir", str(results)) == 1
    assert _notes(capfd) == []
    assert run_cli("run", "null", *ARGS, "--results-dir", str(results)) == 0
    assert _notes(capfd) == []
