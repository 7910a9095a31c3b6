"""Artifact resolution (path, file://, package://), sha256 verification, safe archive extraction."""
from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.specs.artifacts import extract, resolve
from mlharness.specs.manifests import Artifact
from tests.support import sha256


def test_plain_relative_and_file_uri(tmp_path: Path) -> None:
    blob = tmp_path / "w.bin"
    blob.write_bytes(b"weights")
    digest = sha256(blob)
    assert resolve(Artifact(uri="w.bin", sha256=digest), "m.yaml: sources.weights", tmp_path) == blob
    assert resolve(Artifact(uri=f"file://{blob}", sha256=digest), "m.yaml: sources.weights", Path("/")) == blob


def test_package_uri_finds_a_file_inside_an_installed_package(tmp_path: Path) -> None:
    # A file shipped in the pinned onnx wheel: the same bytes on every machine (unlike a converted one).
    art = Artifact(uri="package://onnx/backend/test/data/light/light_resnet50.onnx",
                   sha256="05e77a5c9c9ce0913f549a50d6ebaced5e0ff6817b61e09bae26e4c5bd9055e4")
    assert resolve(art, "where", tmp_path).name == "light_resnet50.onnx"


def test_checksum_mismatch_names_both_digests(tmp_path: Path) -> None:
    blob = tmp_path / "w.bin"
    blob.write_bytes(b"weights")
    with pytest.raises(UserError, match=r"m.yaml: sources.weights: sha256 mismatch for w.bin: expected 0{64}, got [0-9a-f]{64}"):
        resolve(Artifact(uri="w.bin", sha256="0" * 64), "m.yaml: sources.weights", tmp_path)


def test_missing_file_and_package_and_scheme(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        resolve(Artifact(uri="nope.bin", sha256="0" * 64), "where", tmp_path)
    with pytest.raises(UserError, match="package 'no_such_pkg_xyz' is not installed"):
        resolve(Artifact(uri="package://no_such_pkg_xyz/a.bin", sha256="0" * 64), "where", tmp_path)
    with pytest.raises(UserError, match="unsupported URI scheme 's3'"):
        resolve(Artifact(uri="s3://bucket/a.bin", sha256="0" * 64), "where", tmp_path)


def _tar(path: Path, members: dict[str, bytes], symlink: tuple[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink[0])
            info.type = tarfile.SYMTYPE
            info.linkname = symlink[1]
            tf.addfile(info)
    return path


def test_extract_tar_and_zip(tmp_path: Path) -> None:
    out = extract(_tar(tmp_path / "a.tgz", {"d/x.txt": b"x"}), tmp_path / "out")
    assert (out / "d" / "x.txt").read_bytes() == b"x"
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as zf:
        zf.writestr("y.txt", "y")
    assert (extract(tmp_path / "a.zip", tmp_path / "outz") / "y.txt").read_text() == "y"


@pytest.mark.parametrize("members, symlink", [
    ({"../evil.txt": b"x"}, None),
    ({"/abs/evil.txt": b"x"}, None),
    ({"ok.txt": b"x"}, ("link", "../../etc/passwd")),
])
def test_extract_refuses_members_that_escape(tmp_path: Path, members: dict, symlink: tuple | None) -> None:
    archive = _tar(tmp_path / "bad.tgz", members, symlink)
    with pytest.raises(UserError, match="outside"):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "out").exists()


def test_zip_slip_refused(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
        zf.writestr("../evil.txt", "x")
    with pytest.raises(UserError, match="outside"):
        extract(tmp_path / "bad.zip", tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()
