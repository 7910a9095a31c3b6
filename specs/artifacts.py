"""Resolve a manifest's sources to verified local files: plain paths, file://, package://<import>/<path>
and https://, each checked against its sha256 and cached under a cache directory."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tarfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable

from mlharness.errors import UserError
from mlharness.specs.manifests import Artifact


def cache_dir() -> Path:
    return Path(os.environ.get("MLHARNESS_CACHE", Path.home() / ".cache" / "mlharness"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _package_file(spec: str, where: str) -> Path:
    import_name, _, inner = spec.partition("/")
    found = importlib.util.find_spec(import_name)
    if found is None or not found.submodule_search_locations:
        raise UserError(f"{where}: package {import_name!r} is not installed (needed for package://{spec})")
    return Path(list(found.submodule_search_locations)[0]) / inner


def _download(url: str, where: str, sha256: str | None) -> Path:
    """The cached copy of `url`, downloaded once. Only a whole file (as long as the server said)
    whose sha256 is the one expected ever enters the cache: a download cut short, or one with the
    wrong content, is removed and is a UserError, so the next attempt downloads again."""
    target = cache_dir() / "downloads" / hashlib.sha256(url.encode()).hexdigest()[:16] / Path(urllib.parse.urlparse(url).path).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
            announced = response.headers.get("Content-Length")
        received = partial.stat().st_size
        # Over TLS a connection closed midway reads as a normal end of file: compare the length.
        if announced is not None and announced.isdigit() and int(announced) != received:
            raise UserError(f"{where}: cannot download {url}: the server sent {received} of {announced} bytes")
        if sha256 and (actual := sha256_file(partial)) != sha256:
            raise UserError(f"{where}: sha256 mismatch for {url}: expected {sha256}, got {actual}")
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"{where}: cannot download {url}: {exc}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    return target


_SCHEMES: dict[str, Callable[[str, str, Path, str | None], Path]] = {
    "file": lambda rest, where, base, sha256: Path(urllib.parse.unquote(rest)),
    "package": lambda rest, where, base, sha256: _package_file(rest, where),
    "https": lambda rest, where, base, sha256: _download("https://" + rest, where, sha256),
}


def locate(uri: str, where: str, base: Path, sha256: str | None = None) -> Path:
    """The local path of a URI; relative paths are relative to `base`. Only a download is checked
    here (against `sha256`, before it is cached); resolve() checks every file."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        path = Path(uri)
        return path if path.is_absolute() else base / path
    handler = _SCHEMES.get(scheme)
    if handler is None:
        raise UserError(f"{where}: unsupported URI scheme {scheme!r} in {uri!r} (use a path, file://, package:// or https://)")
    return handler(rest, where, base, sha256)


# Who makes converted artifacts (mlharness.sut.conversion registers itself): the spec layer names what a
# conversion is, the runtime layer does it, and this layer never imports the runtime.
_CONVERTER: Callable[[Artifact, str, Path], Path] | None = None


def register_converter(func: Callable[[Artifact, str, Path], Path]) -> None:
    global _CONVERTER
    _CONVERTER = func


def resolve_all(manifest: Any) -> dict[str, Path]:
    """Every source of a manifest as a verified local file, relative paths taken from its folder."""
    base = manifest.path.parent
    return {key: resolve(art, f"{manifest.path}: sources.{key}", base) for key, art in manifest.sources.items()}


def resolve(artifact: Artifact, where: str, base: Path) -> Path:
    """A verified local file for `artifact`; a missing file or a sha256 mismatch is a UserError."""
    if artifact.convert is not None:
        if _CONVERTER is None:
            raise UserError(f"{where}: a converted artifact is made by the runtime's conversions; "
                            f"import mlharness.sut.conversion before resolving it")
        return _CONVERTER(artifact, where, base)  # made by a recorded export step, cached
    path = locate(artifact.uri, where, base, artifact.sha256)
    if not path.is_file():
        raise UserError(f"{where}: {artifact.uri} not found (looked at {path})")
    if artifact.sha256:
        actual = sha256_file(path)
        if actual != artifact.sha256:
            raise UserError(f"{where}: sha256 mismatch for {artifact.uri}: expected {artifact.sha256}, got {actual}")
    return path


def extract(archive: Path, target: Path) -> Path:
    """Extract a tar or zip archive into `target`, refusing any member that would land outside it."""
    target = target.resolve()
    done = target / ".extracted"
    if done.exists():
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    def inside(name: str) -> Path:
        dest = (staging / name).resolve()
        if dest != staging.resolve() and staging.resolve() not in dest.parents:
            raise UserError(f"{archive}: member {name!r} would be extracted outside {target}")
        return dest

    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    inside(member)
                zf.extractall(staging)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                for member in tf.getmembers():
                    inside(member.name)
                    if member.issym() or member.islnk():
                        link_base = (staging / member.name).parent if member.issym() else staging
                        dest = (link_base / member.linkname).resolve()
                        if staging.resolve() not in dest.parents:
                            raise UserError(f"{archive}: link {member.name!r} points outside {target}")
                    if member.isdev():
                        raise UserError(f"{archive}: device member {member.name!r} refused")
                tf.extractall(staging)
        else:
            raise UserError(f"{archive}: not a tar or zip archive")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    done.touch()
    return target
