"""`mlharness report --site`: a static site over a real database (runs, a profiled run, an accuracy run
against a reference, a failed run, a sweep, a layer benchmark), its links and content checked as files,
then rendered in a real headless Chromium: screenshots of the run list, a run page and a comparison,
the pages' content after their JavaScript ran, and no request leaving the machine."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mlharness.store.result_store import ResultStore
from tests.support import REPO, copy_specs, failing_null_model, run_cli, sha256, write_manifest

PNG = b"\x89PNG\r\n\x1a\n"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
# Set to a folder (docs/site) to keep the screenshots: SITE_SCREENSHOTS_DIR=docs/site pytest tests/test_site.py
SCREENSHOTS_ENV = "SITE_SCREENSHOTS_DIR"


def _tiny_onnx_model(specs: Path, folder: Path) -> None:
    """A two-MatMul ONNX graph and its model manifest, for a layer benchmark of a second or so."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
               (("w1", (1, 16)), ("w2", (16, 10)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "tiny.onnx"
    save(model, path)
    write_manifest(specs / "models", "tiny-onnx.yaml", f"""\
        kind: model
        name: tiny-onnx
        version: 1.0.0
        framework: {{name: onnxruntime}}
        dataset: null-samples
        inputs: [{{name: x, type: tensor, element_type: float32, shape: [batch, 1]}}]
        outputs: [{{name: y, type: scores, element_type: float32, shape: [batch, 10]}}]
        sources:
          graph: {{uri: "{path}", sha256: {sha256(path)}}}
        preprocess: |
          import numpy as np
          def preprocess(sample, ctx):
              return np.array([sample % 7], dtype=np.float32)
        attributes:
          max_batch_size: 4
          settings: {{SingleStream: {{target_latency: 1}}}}
        """)


def _null_reference(specs: Path) -> None:
    from mlharness.specs.manifests import load_manifest

    model, dataset = load_manifest(specs / "models" / "null.yaml"), load_manifest(specs / "datasets" / "null-samples.yaml")
    write_manifest(specs / "references", "null-ref.yaml", f"""\
        kind: reference
        name: null-on-null-samples
        version: 1.0.0
        model: {{name: "null", version: 1.0.0, sha256: {model.sha256}}}
        dataset: {{name: null-samples, version: 1.0.0, sha256: {dataset.sha256}}}
        backend: "null"
        accuracy:
          top1: {{expected: 0.5, tolerance: 0.01}}
        """)


GRID = """\
    name: site-sweep
    quick: true
    models: ["null"]
    scenarios: [Offline]
    batch_sizes: [4, 16]
    threads: [1, 2]
    set: {target_qps: 20000}
    """


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("site")
    results = root / "results"
    with pytest.MonkeyPatch.context() as patch:
        specs = copy_specs(root / "specs")
        patch.setenv("MLHARNESS_SPECS", str(specs))
        write_manifest(specs / "models", "flaky.yaml", failing_null_model(postprocess_calls=5))
        _null_reference(specs)
        _tiny_onnx_model(specs, root)
        quick = ("--scenario", "Offline", "--quick", "--results-dir", results)
        assert run_cli("run", "null", *quick, "--set", "target_qps=20000", "--profile", "model") == 0
        assert run_cli("run", "null", *quick, "--mode", "accuracy") == 0
        assert run_cli("run", "flaky", *quick, "--set", "min_duration=300") == 1
        (root / "grid.yaml").write_text(textwrap.dedent(GRID))
        assert run_cli("sweep", root / "grid.yaml", "--results-dir", results) == 0
        assert run_cli("bricks", "tiny-onnx", "--results-dir", results, "--time-cap", "0.05", "--no-variants",
                       "--set", "min_duration=300", "--set", "min_query_count=16") == 0
    with ResultStore(results / "mlharness.sqlite", create=False) as store:
        rows = [dict(r) for r in store.list_runs()]
    out = root / "site"
    assert run_cli("report", "--site", out, "--results-dir", results) == 0
    ids = {"profiled": next(r["run_id"] for r in rows if r["model"] == "null" and r["mode"] == "performance"
                            and r["sweep_id"] is None),
           "accuracy": next(r["run_id"] for r in rows if r["mode"] == "accuracy"),
           "failed": next(r["run_id"] for r in rows if r["status"] == "failed"),
           "bricks": next(r["run_id"] for r in rows if r["scenario"] == "bricks"),
           "cells": sorted(r["run_id"] for r in rows if r["sweep_id"] == "site-sweep")}
    return {"out": out, "rows": rows, "ids": ids}


def _page(out: Path, run_id: str) -> str:
    return (out / "runs" / f"{run_id}.html").read_text()


def test_every_link_resolves_inside_the_site_and_nothing_points_off_the_machine(site: dict) -> None:
    out = site["out"]
    pages = sorted(out.rglob("*.html"))
    assert len(pages) == len(site["rows"]) + 4  # a page per run, index, compare, bricks, the sweep
    for page in pages:
        text = page.read_text()
        assert not re.search(r"(?i)\b(?:https?|wss?|ftp):", text), page
        for link in re.findall(r"(?:href|src)=['\"]([^'\"#]+)", text):
            assert not link.startswith(("/", "//")) and ":" not in link, (page, link)
            assert (page.parent / link).resolve().is_file(), (page, link)
            assert (page.parent / link).resolve().is_relative_to(out.resolve()), (page, link)
    for image in out.rglob("*.png"):
        assert image.read_bytes().startswith(PNG)


def test_pages_hold_what_each_run_recorded(site: dict) -> None:
    out, ids = site["out"], site["ids"]
    index = (out / "index.html").read_text()
    assert all(f"runs/{r['run_id']}.html" in index for r in site["rows"])
    for name in ("model", "scenario", "system", "status"):
        assert f"data-filter='{name}'" in index

    profiled = _page(out, ids["profiled"])
    # settings with the layer that set each: the preset, the command line, the model manifest
    assert re.search(r"<td>min_duration</td><td class='n'>250</td><td>preset:quick</td>|"
                     r"<td>min_duration</td><td>250</td><td>preset:quick</td>", profiled)
    assert "<td>target_qps</td><td>20000</td><td>cli</td>" in profiled
    assert f"{ids['profiled']}/latency-Offline.png" in profiled and "Cold start and memory" in profiled
    assert f"{ids['profiled']}/profile/timeline.json" in profiled
    assert json.loads((out / "runs" / ids["profiled"] / "profile" / "timeline.json").read_text())

    accuracy = _page(out, ids["accuracy"])
    assert "accuracy-vs-reference.png" in accuracy and "null-on-null-samples@1.0.0" in accuracy
    assert "<td>top1</td><td class='n'>0.5</td><td class='n'>0.01</td><td class='n'>0.5</td><td>PASS</td>" in accuracy

    failed = _page(out, ids["failed"])
    assert "<span class='failed'>failed</span>" in failed and "postprocess raised RuntimeError: postprocess blew up" in failed
    assert "failed-" + ids["failed"] in failed and "not a result" in failed

    sweep = (out / "sweeps" / "site-sweep.html").read_text()
    (heatmap,) = re.findall(r"src='(site-sweep/heatmap-[^']+)'", sweep)
    assert (out / "sweeps" / heatmap).stat().st_size > 10_000
    assert all(f"../runs/{run_id}.html" in sweep for run_id in ids["cells"])

    bricks = (out / "bricks.html").read_text()
    assert "tiny-onnx" in bricks and "bricks/bricks_estimate.png" in bricks
    assert "Bricks (layer benchmark)" in _page(out, ids["bricks"])


# ---- in a real browser ----------------------------------------------------------------------------------


def _browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def _chromium(tmp_path: Path, url: str, *args: str) -> tuple[str, list[str]]:
    """Run headless Chromium on url (host names resolve nowhere); its stdout and the http(s)/ws requests
    the page made (from Chromium's net log: requests whose top frame is a file:// page)."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium binary (chromium, chromium-browser, google-chrome) on PATH: `make setup` installs "
                    "Debian's chromium where apt-get is available and it runs as root")
    log = tmp_path / f"net-{len(list(tmp_path.glob('net-*')))}.json"
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--virtual-time-budget=3000", f"--log-net-log={log}", *args, url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    text = log.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("}") else text + "]}")["events"]
    requested = sorted({e["params"]["url"] for e in events if isinstance(e.get("params"), dict)
                        and "file://" in str(e["params"].get("network_isolation_key", ""))
                        and not str(e["params"].get("url", "")).startswith(("file:", "data:"))})
    return done.stdout, requested


def _screenshot(tmp_path: Path, url: str, name: str, size: str = "1400,1000") -> Path:
    shot = tmp_path / name
    _, requested = _chromium(tmp_path, url, f"--screenshot={shot}", f"--window-size={size}")
    assert requested == [], requested
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == tuple(int(x) for x in size.split(","))
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert colours is None or len(colours) > 50  # not a blank page
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(keep) / name)
    return shot


def test_the_net_log_sees_a_page_that_fetches_off_the_machine(tmp_path: Path) -> None:
    """The check below is only worth something if it catches a page that does fetch."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><img src='https://example.com/x.png'><script src='http://cdn.example.org/a.js'>"
                   "</script></body></html>")
    _, requested = _chromium(tmp_path, bad.as_uri(), "--dump-dom")
    assert requested == ["http://cdn.example.org/a.js", "https://example.com/x.png"]


def test_site_in_chromium(site: dict, tmp_path: Path) -> None:
    out, ids = site["out"], site["ids"]
    index = (out / "index.html").as_uri()
    # the run list with a filter and a sort given in the address (as the page keeps them)
    dom, requested = _chromium(tmp_path, index + "#status=failed", "--dump-dom")
    assert requested == []
    visible = [row for row in re.findall(r"<tr ([^>]*)>", dom) if "data-status" in row and " hidden" not in row]
    assert len(visible) == 1 and ids["failed"] in dom and "1 of " in dom
    dom, _ = _chromium(tmp_path, index + "#figure=coldstart.peak_rss_bytes&sort=16-", "--dump-dom")
    rss = [float(v) for v in re.findall(r'<td class="n" data-v="([0-9.e+-]+)">[^<]*</td></tr>', dom)]
    assert len(rss) == len(site["rows"]) and rss == sorted(rss, reverse=True)

    compare = (out / "compare.html").as_uri() + "#" + ",".join(ids["cells"][:2])
    dom, requested = _chromium(tmp_path, compare, "--dump-dom")
    assert requested == []
    dom = dom.partition('id="comparison"')[2].partition("<script")[0]  # what the script rendered, not its data
    assert "Comparable: the same system and framework versions." in dom
    assert "offline.samples_per_second (samples/s)" in dom and "harness.max_batch_size" not in dom
    assert "harness.intra_op_threads" in dom  # the two cells differ in threads
    dom, _ = _chromium(tmp_path, (out / "compare.html").as_uri() + f"#{ids['cells'][0]},{ids['failed']}", "--dump-dom")
    assert "did not finish (failed)" in dom

    _screenshot(tmp_path, index, "run-list.png", "1800,900")
    _screenshot(tmp_path, (out / "runs" / f"{ids['profiled']}.html").as_uri(), "run-page.png", "1400,1600")
    _screenshot(tmp_path, compare, "comparison.png", "1400,1400")
    _screenshot(tmp_path, (out / "sweeps" / "site-sweep.html").as_uri(), "sweep.png", "1400,1100")


def test_site_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("report", "--site", tmp_path / "s", "--results-dir", tmp_path / "none") == 1
    assert "no results database here" in capsys.readouterr().err and not (tmp_path / "s").exists()
    run_cli("results", "import", "--results-dir", tmp_path / "r", REPO / "scenarios" / "baselines" / "null-offline")
    (tmp_path / "file").write_text("")
    assert run_cli("report", "--site", tmp_path / "file", "--results-dir", tmp_path / "r") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'file'}: not a folder" in err
    assert run_cli("report", "--run", "x", "--results-dir", tmp_path / "r") == 1
    assert "--out DIR: needed with --run" in capsys.readouterr().err
