"""Which files a `module:function` factory's code is (mlharness.sut.factory_code), the conversion
cache's key for a factory module: the module and the modules of its own package it imports."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlharness.sut.factory_code import factory_code_files, factory_code_sha256

REPO = Path(__file__).resolve().parents[1]


def test_a_zoo_architecture_is_its_file_and_the_shared_initialisation() -> None:
    assert factory_code_files("mlharness.sut.architectures.resnet") == {
        "mlharness.sut.architectures.resnet": REPO / "sut" / "architectures" / "resnet.py",
        "mlharness.sut.architectures": REPO / "sut" / "architectures" / "__init__.py"}  # init_weights
    assert list(factory_code_files("mlharness.sut.architectures.squeezenet")) == [
        "mlharness.sut.architectures.squeezenet"]  # it initialises its own weights


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """codepkg/: a factory module importing, in each way Python allows, modules of its own package."""
    root = tmp_path / "codepkg"
    (root / "layers").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "net.py": "import numpy\nfrom . import blocks\nfrom .layers.conv import make\n"
                  "def factory(ctx):\n    import codepkg.late\n    return make()\n",
        "blocks.py": "from ..outside import x\nfrom .helpers import *\n",  # the first climbs above the top: skipped
        "helpers.py": "",
        "late.py": "",
        "unused.py": "",
        "layers/__init__.py": "from .common import WIDTH\n",
        "layers/common.py": "WIDTH = 3\n",
        "layers/conv.py": "from codepkg.layers import WIDTH\ndef make():\n    return WIDTH\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "codepkg" or m.startswith("codepkg.")]:
        monkeypatch.delitem(sys.modules, name)
    return root


def test_every_import_form_is_followed_within_the_package_and_nothing_else(package: Path) -> None:
    found = factory_code_files("codepkg.net")
    assert sorted(found) == ["codepkg", "codepkg.blocks", "codepkg.helpers", "codepkg.late", "codepkg.layers",
                             "codepkg.layers.common", "codepkg.layers.conv", "codepkg.net"]
    assert found["codepkg.layers.common"] == package / "layers" / "common.py"
    assert "codepkg.net" not in sys.modules  # read, not imported


def test_the_digest_changes_with_an_imported_module_and_only_then(package: Path) -> None:
    before = factory_code_sha256("codepkg.net")
    (package / "unused.py").write_text("X = 1\n")
    assert factory_code_sha256("codepkg.net") == before
    (package / "layers" / "common.py").write_text("WIDTH = 4\n")
    assert factory_code_sha256("codepkg.net") != before


def test_a_module_without_a_source_file_has_no_digest() -> None:
    assert factory_code_sha256("no_such_module_here") is None
    assert factory_code_files("sys") == {}  # built in
