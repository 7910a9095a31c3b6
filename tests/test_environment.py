"""Software manifests checked against what is installed; hardware recorded beside the detected system."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.records.run_record import RUN_SCHEMA_VERSION
from mlharness.running.system import check_software, detect_system, system_name
from mlharness.specs.manifests import load_manifest
from tests.support import read_run, run_cli, write_manifest


def test_installed_versions_satisfy_the_shipped_software_manifests() -> None:
    from tests.support import REPO

    for name in ("onnxruntime", "null", "torch"):
        checked = check_software(load_manifest(REPO / "specs" / "software" / f"{name}.yaml"))
        assert checked and all(checked.values())


@pytest.mark.parametrize("packages, message", [
    ("{numpy: '<1.0'}", "packages.numpy: expected numpy<1.0, installed "),
    ("{no-such-dist-xyz: '>=1'}", "packages.no-such-dist-xyz: expected no-such-dist-xyz>=1 installed, it is not"),
])
def test_mismatch_is_a_one_line_error(tmp_path: Path, packages: str, message: str) -> None:
    path = write_manifest(tmp_path, "sw.yaml", f"kind: software\nname: sw\nversion: 1.0.0\npackages: {packages}\n")
    with pytest.raises(UserError, match=message):
        check_software(load_manifest(path))


def test_run_refuses_a_software_mismatch_before_writing_anything(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    sw = write_manifest(tmp_path, "sw.yaml", "kind: software\nname: sw\nversion: 1.0.0\npackages: {numpy: '<1.0'}\n")
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--software", sw,
                   "--results-dir", tmp_path / "r") == 1
    assert "sw.yaml: packages.numpy: expected numpy<1.0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_detected_system_and_hardware_are_recorded(tmp_path: Path) -> None:
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--results-dir", tmp_path) == 0
    record = read_run(tmp_path, "null", "Offline")
    system = detect_system()
    assert record["system_name"] == system_name(system)
    assert record["system"]["logical_cpus"] == system["logical_cpus"]
    assert record["hardware"]["name"] == "cpu" and record["hardware"]["device"] == "cpu"
    assert record["software"]["versions"]["mlcommons-loadgen"]
    assert record["schema_version"] == RUN_SCHEMA_VERSION and record["kind"] == "loadgen" and len(record["model"]["sha256"]) == 64


def test_unknown_model_and_dataset_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "nope", "--scenario", "Offline", "--results-dir", tmp_path) == 1
    assert run_cli("run", "null", "--dataset", "nope", "--scenario", "Offline", "--results-dir", tmp_path) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("mlharness: error: no model manifest named 'nope'")
    assert err[1].startswith("mlharness: error: no dataset manifest named 'nope'")
