"""Artifacts that are fetched or made: https downloads from a local HTTPS server with a throwaway
self-signed certificate (first resolve downloads, the second reuses the cache, a checksum mismatch
is a one-line error leaving nothing in the cache), and `mlharness convert` (--force converts again;
an export whose output check fails is a one-line error leaving no half-written artifact)."""
from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import ssl
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlharness.errors import UserError
from mlharness.specs.artifacts import resolve
from mlharness.specs.manifests import Artifact
from tests.support import linear_torch_model, run_cli, scenario_root, write_manifest

PAYLOAD = b"weights over https\n" * 64
WHERE = "m.yaml: sources.weights"


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a throwaway certificate (and the cryptography package is not "
                    "installed either)")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


class Server:
    """An HTTPS server on 127.0.0.1 serving a folder, counting the requests per path."""

    def __init__(self, root: Path, cert: Path, key: Path):
        self.root, self.requests = root, []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(server.root), **kwargs)

            def do_GET(self) -> None:
                server.requests.append(self.path)
                if self.path.startswith("/truncated/"):  # promises more bytes than it sends, then hangs up
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(PAYLOAD)))
                    self.end_headers()
                    self.wfile.write(PAYLOAD[:100])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def count(self, name: str) -> int:
        return self.requests.count(f"/{name}")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("https")
    cert, key = _certificate(root)
    (root / "files").mkdir()
    running = Server(root / "files", cert, key)
    running.cert = cert
    yield running
    running.close()


@pytest.fixture
def trusted(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process (and the runs it spawns) trusts the server's certificate; a cache of the test's own."""
    monkeypatch.setenv("SSL_CERT_FILE", str(server.cert))
    cache = tmp_path / "cache"
    monkeypatch.setenv("MLHARNESS_CACHE", str(cache))
    return cache


def serve(server: Server, name: str, data: bytes = PAYLOAD) -> tuple[str, str]:
    (server.root / name).write_bytes(data)
    return server.url(name), hashlib.sha256(data).hexdigest()


def cached_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "downloads").rglob("*") if p.is_file()) if cache.exists() else []


def test_first_resolve_downloads_and_the_second_reuses_the_cache(server: Server, trusted: Path) -> None:
    url, digest = serve(server, "first.bin")
    path = resolve(Artifact(uri=url, sha256=digest), WHERE, Path("/"))
    assert server.count("first.bin") == 1
    assert path.is_relative_to(trusted / "downloads") and path.name == "first.bin"
    assert path.read_bytes() == PAYLOAD and cached_files(trusted) == [path]  # no .part left beside it
    again = resolve(Artifact(uri=url, sha256=digest), WHERE, Path("/"))
    assert again == path and server.count("first.bin") == 1  # no second request
    # Another cache is another download.
    (trusted / "downloads").rename(trusted / "elsewhere")
    assert resolve(Artifact(uri=url, sha256=digest), WHERE, Path("/")) == path and server.count("first.bin") == 2


def test_a_checksum_mismatch_is_one_line_and_leaves_nothing_in_the_cache(server: Server, trusted: Path) -> None:
    url, digest = serve(server, "mismatch.bin")
    wrong = "0" * 64
    with pytest.raises(UserError) as caught:
        resolve(Artifact(uri=url, sha256=wrong), WHERE, Path("/"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{WHERE}: sha256 mismatch for {url}: expected {wrong}, got {digest}")
    assert server.count("mismatch.bin") == 1
    assert cached_files(trusted) == []


def test_a_failed_download_leaves_no_partial_file(server: Server, trusted: Path) -> None:
    url = server.url("missing.bin")
    with pytest.raises(UserError) as caught:
        resolve(Artifact(uri=url, sha256="0" * 64), WHERE, Path("/"))
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: cannot download {url}: HTTP Error 404") and "\n" not in message
    assert cached_files(trusted) == []


def test_a_download_cut_short_leaves_nothing_in_the_cache(server: Server, trusted: Path) -> None:
    url = server.url("truncated/cut.bin")
    with pytest.raises(UserError) as caught:
        resolve(Artifact(uri=url, sha256=hashlib.sha256(PAYLOAD).hexdigest()), WHERE, Path("/"))
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: ") and url in message and "\n" not in message
    assert server.count("truncated/cut.bin") == 1
    assert cached_files(trusted) == []


def test_an_untrusted_certificate_is_refused(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SSL_CERT_FILE the self-signed certificate is not trusted: verification is on."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "no-certs"))
    monkeypatch.setenv("MLHARNESS_CACHE", str(tmp_path / "cache"))
    url, digest = serve(server, "untrusted.bin")
    with pytest.raises(UserError, match=r"cannot download .*CERTIFICATE_VERIFY_FAILED"):
        resolve(Artifact(uri=url, sha256=digest), WHERE, Path("/"))
    assert cached_files(tmp_path / "cache") == []




def test_a_run_downloads_its_weights_once(server: Server, trusted: Path, specs_copy: Path, tmp_path: Path) -> None:
    """Weights over https in a model manifest: the first run downloads them, the second takes the cache,
    and both score top-1 1.0 with them (x = label: class 0 scores 0.5 - x, class 1 scores x)."""
    torch = pytest.importorskip("torch")
    layer = torch.nn.Sequential(torch.nn.Linear(1, 3))
    with torch.no_grad():
        layer[0].weight.copy_(torch.tensor([[-1.0], [1.0], [0.0]]))
        layer[0].bias.copy_(torch.tensor([0.5, 0.0, 0.0]))
    local = tmp_path / "tiny.pt"
    torch.save(layer.state_dict(), local)
    url, digest = serve(server, "tiny.pt", local.read_bytes())
    write_manifest(specs_copy / "models", "https-torch.yaml",
                   linear_torch_model("https-torch", sources=f"weights: {{uri: {url}, sha256: {digest}}}"))
    for number in (1, 2):
        results = tmp_path / f"r{number}"
        assert run_cli("run", "https-torch", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                       "--results-dir", results) == 0
        record = json.loads((scenario_root(results, "https-torch", "Offline") / "run.json").read_text())
        assert record["accuracy"]["values"]["top1"] == 1.0
        assert server.count("tiny.pt") == 1
    assert [p.name for p in cached_files(trusted)] == ["tiny.pt"]


# ---- conversions ----------------------------------------------------------------------------------

SOURCE = """\
    kind: model
    name: conv
    version: 1.0.0
    framework: {name: torch, version: ">=2.0"}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: y, type: scores, element_type: float32, shape: [batch, 3]}]
    sources:
      module:
        factory: |
          import torch
          class Scaled(torch.nn.Module):
              def __init__(self):
                  super().__init__()
                  torch.manual_seed(0)
                  self.linear = torch.nn.Linear(1, 3)
              def forward(self, x):
                  return self.linear(x) * SCALE
          def factory(ctx):
              return Scaled()
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          return np.array([sample % 2], dtype=np.float32)
    attributes: {max_batch_size: 4}
    """

TARGET = """\
    kind: model
    name: conv
    version: 1.0.0
    framework: {name: onnxruntime}
    dataset: null-samples
    inputs: [{name: x, type: tensor, element_type: float32, shape: [batch, 1]}]
    outputs: [{name: y, type: scores, element_type: float32, shape: [batch, 3]}]
    sources:
      graph:
        convert: {from: conv-torch.yaml, to: onnx, opset: 17}
    preprocess: |
      import numpy as np
      def preprocess(sample, ctx):
          return np.array([sample % 2], dtype=np.float32)
    attributes: {max_batch_size: 4}
    """


def conversion_pair(specs: Path, scale: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    write_manifest(specs / "models", "conv-torch.yaml", SOURCE.replace("SCALE", scale))
    write_manifest(specs / "models", "conv-onnx.yaml", TARGET)


def printed(out: str) -> dict[str, str]:
    """The `  key : value` lines of `mlharness convert`'s report, and its state line."""
    found = {}
    for line in out.splitlines():
        if line.startswith("conv [onnxruntime] sources.graph: "):
            found["state"] = line.rpartition(": ")[2]
        elif line.startswith("  ") and " : " in line:
            key, _, value = line.strip().partition(" : ")
            found[key.strip()] = value.strip()
    return found


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLHARNESS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_convert_force_converts_again(specs_copy: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conversion_pair(specs_copy, "1.0")
    assert run_cli("convert", "conv", "--backend", "onnxruntime") == 0
    first = printed(capsys.readouterr().out)
    assert first["state"] == "converted"
    graph, provenance = Path(first["file"]), Path(first["provenance"])
    assert graph.is_relative_to(cache / "converted") and first["sha256"] == hashlib.sha256(graph.read_bytes()).hexdigest()
    made = (graph.stat().st_ino, provenance.stat().st_ino, provenance.read_text())
    # Without --force the verified cached file is used as it is.
    assert run_cli("convert", "conv", "--backend", "onnxruntime") == 0
    second = printed(capsys.readouterr().out)
    assert second["state"] == "cached (verified)" and second["file"] == first["file"]
    assert (graph.stat().st_ino, provenance.stat().st_ino, provenance.read_text()) == made
    # --force: exported again into the same place, with a new provenance.
    assert run_cli("convert", "conv", "--backend", "onnxruntime", "--force") == 0
    third = printed(capsys.readouterr().out)
    assert third["state"] == "converted" and third["file"] == first["file"] and "check" in third
    assert graph.stat().st_ino != made[0] and provenance.stat().st_ino != made[1]
    assert third["sha256"] == hashlib.sha256(graph.read_bytes()).hexdigest()
    assert graph.with_name(graph.name + ".sha256").read_text().split()[0] == third["sha256"]
    assert sorted(p.name for p in graph.parent.iterdir()) == sorted(
        [graph.name, graph.name + ".sha256", graph.name + ".provenance.json"])  # nothing else left behind


def factory_module() -> str:
    """SOURCE's inline factory as a module of its own that takes SCALE from its package's `scale`."""
    source = textwrap.dedent(SOURCE)
    inline = source[source.index("factory: |\n") + len("factory: |\n"):source.index("preprocess:")]
    return "from .scale import SCALE\n" + textwrap.dedent(inline)


def test_editing_a_module_the_factory_imports_converts_again(specs_copy: Path, cache: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A `module:function` factory whose scale comes from another module of its package, as the zoo's
    architectures take their initialisation from mlharness.sut.architectures: editing that module
    alone converts again, into another cache entry; editing a module the factory does not import
    keeps the cached graph."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    package = tmp_path / "code" / "convpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text("SCALE = 1.0\n")
    (package / "unrelated.py").write_text("X = 1\n")
    (package / "net.py").write_text(factory_module())
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    source = textwrap.dedent(SOURCE)
    source = source[:source.index("    factory: |")] + "    factory: convpkg.net:factory\n" + source[source.index("preprocess:"):]
    write_manifest(specs_copy / "models", "conv-torch.yaml", source)
    write_manifest(specs_copy / "models", "conv-onnx.yaml", TARGET)

    def convert() -> dict[str, str]:
        for name in ("convpkg", "convpkg.net", "convpkg.scale", "convpkg.unrelated"):
            monkeypatch.delitem(sys.modules, name, raising=False)  # the export imports the files as they are now
        assert run_cli("convert", "conv", "--backend", "onnxruntime") == 0
        return printed(capsys.readouterr().out)

    first = convert()
    assert first["state"] == "converted"
    (package / "unrelated.py").write_text("X = 2\n")
    assert convert()["state"] == "cached (verified)"
    (package / "scale.py").write_text("SCALE = 2.0\n")
    edited = convert()
    assert edited["state"] == "converted" and edited["file"] != first["file"]


def test_a_failing_export_check_is_one_line_and_leaves_no_artifact(specs_copy: Path, cache: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A module that reads its batch size as a Python int: the exporter bakes the example's size (2)
    into the graph, and the check at another size (3) finds outputs 3/2 of the module's."""
    conversion_pair(specs_copy, "int(x.shape[0])")
    assert run_cli("convert", "conv", "--backend", "onnxruntime") == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and captured.out == ""
    assert err.startswith(f"mlharness: error: {specs_copy / 'models' / 'conv-torch.yaml'}: the ONNX export "
                          "disagrees with the torch module on output 'y': max |diff| ")
    assert err.endswith("at dims {'batch': 3}")
    (folder,) = (cache / "converted").iterdir()
    assert list(folder.iterdir()) == []  # no graph, no partial file, no sha256, no provenance
    # And a run of the ONNX manifest fails the same way, with nothing left to pick up.
    assert run_cli("run", "conv", "--backend", "onnxruntime", "--scenario", "Offline", "--quick",
                   "--results-dir", specs_copy.parent / "r") == 1
    assert "the ONNX export disagrees with the torch module on output 'y'" in capsys.readouterr().err
    assert list(folder.iterdir()) == []
