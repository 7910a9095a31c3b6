"""Reports: HTML whose PNG plots are real images, for a sweep and for a profiled run."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from mlharness.store.result_store import ResultStore
from tests.support import run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"




def check_report(out: Path) -> list[str]:
    """Every image the HTML names exists and decodes; returns the image names."""
    from matplotlib.image import imread
    from PIL import Image

    html = (out / "index.html").read_text()
    names = re.findall(r"<img src='([^']+)'", html)
    assert names and sorted(names) == sorted(p.name for p in out.glob("*.png"))
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        with Image.open(out / name) as image:
            image.verify()
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100
        assert imread(out / name).ndim == 3
    return names


def test_sweep_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent("""\
        name: report-sweep
        quick: true
        models: ["null", no-such-model]
        scenarios: [Offline, SingleStream]
        batch_sizes: [4, 32]
        set: {Offline: {target_qps: 20000}, SingleStream: {target_latency: 0.01}}
        exclude: [{model: no-such-model, scenario: SingleStream}, {model: no-such-model, batch_size: 32}]
        """))
    results = tmp_path / "r"
    assert run_cli("sweep", grid, "--results-dir", results) == 0
    out = tmp_path / "report"
    assert run_cli("report", "--sweep", "report-sweep", "--results-dir", results, "--out", out) == 0
    names = check_report(out)
    assert {"latency-Offline.png", "latency-SingleStream.png", "throughput-vs-batch-size-Offline.png"} <= set(names)
    html = (out / "index.html").read_text()
    assert "Best configuration per scenario and model" in html
    assert "Failed cells" in html and "no-such-model" in html


def test_run_report_with_accuracy_and_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "target_qps=20000",
                   "--profile", "model", "--results-dir", results) == 0
    assert run_cli("run", "null", "--scenario", "Offline", "--mode", "accuracy", "--quick",
                   "--results-dir", results) == 0
    with ResultStore(results / "mlharness.sqlite") as store:
        accuracy_run, profiled_run = [r["run_id"] for r in store.list_runs()]
    out = tmp_path / "profiled"
    assert run_cli("report", "--run", profiled_run, "--results-dir", results, "--out", out) == 0
    assert set(check_report(out)) == {"latency-Offline.png", f"profile-{profiled_run}.png"}
    out = tmp_path / "accuracy"
    assert run_cli("report", "--run", accuracy_run, "--results-dir", results, "--out", out) == 0
    assert check_report(out) == ["accuracy.png"]


def test_report_needs_a_known_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r"
    assert run_cli("run", "null", "--scenario", "Offline", "--quick", "--set", "target_qps=20000",
                   "--results-dir", results) == 0
    assert run_cli("report", "--sweep", "nope", "--results-dir", results, "--out", tmp_path / "o") == 1
    assert "no sweep 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
