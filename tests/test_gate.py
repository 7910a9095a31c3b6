"""Gates on real short runs of the null model: the same configuration passes, a really slower
configuration fails with a readable Markdown explanation and JUnit XML, runs from another machine
are refused."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.compare.gate import parse_rule
from harness.errors import UserError
from harness.store.result_store import ResultStore
from tests.support import run_cli

RUN = ("run", "null", "--scenario", "Offline", "--quick")




def _run_ids(results: Path) -> set[str]:
    if not (results / "mlharness.sqlite").exists():
        return set()
    with ResultStore(results / "mlharness.sqlite") as store:
        return {row["run_id"] for row in store.list_runs()}


def _run(results: Path, *extra: str) -> str:
    """One run; its id is the one the database did not have before. Not read from the folders: on a
    fast machine two runs start within the same second, and what is newest there is then a tie."""
    before = _run_ids(results)
    assert run_cli(*RUN, "--results-dir", results, *extra) == 0
    (new,) = _run_ids(results) - before
    return new


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three runs of a slower configuration (batch size 1: a Python call per sample, ~15-25x slower
    here), three baseline and three candidate runs of the same configuration, and one accuracy run.

    Baseline and candidate runs alternate, so a change in the machine's load while they run (other
    jobs on a CI host) slows both sides alike instead of making the same configuration look
    slower; the slow runs come first, so the newest performance runs are of the default one."""
    results = tmp_path_factory.mktemp("gate")
    ids: dict[str, list[str]] = {"slow": [], "baseline": [], "candidate": []}
    for _ in range(3):
        ids["slow"].append(_run(results, "--set", "max_batch_size=1", "--set", "target_qps=20000"))
    for _ in range(3):
        ids["baseline"].append(_run(results))
        ids["candidate"].append(_run(results))
    assert all(len(set(group)) == 3 for group in ids.values())
    return {"results": results, **ids, "accuracy": _run(results, "--mode", "accuracy")}


def gate(runs: dict, baseline: list[str], candidate: list[str], *extra: str) -> int:
    args = ["gate", "--results-dir", runs["results"]]
    for ref in baseline:
        args += ["--baseline", ref]
    for ref in candidate:
        args += ["--candidate", ref]
    return run_cli(*args, *extra)


def test_same_configuration_passes(runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md, junit = tmp_path / "gate.md", tmp_path / "gate.xml"
    assert gate(runs, runs["baseline"], runs["candidate"], "--rule", "offline.samples_per_second:-50%",
                "--rule", "offline.p99_latency_ns:+200%", "--markdown", md, "--junit", junit) == 0
    text = md.read_text()
    assert text.startswith("## mlharness gate: ✅ PASS") and "(n=3)" in text and "Mann-Whitney U" in text
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "0"
    # A run against itself passes any limit, and the accuracy run gates accuracy.
    assert gate(runs, runs["baseline"][:1], runs["baseline"][:1], "--rule", "offline.samples_per_second:-0%") == 0
    assert gate(runs, ["latest:model=null,mode=accuracy"], ["latest:model=null,mode=accuracy"],
                "--rule", "accuracy.top1:-0.5pt") == 0


def test_slower_configuration_fails_with_an_explanation(runs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "gate.xml"
    assert gate(runs, runs["baseline"], runs["slow"], "--match", "model,backend,scenario",
                "--rule", "offline.samples_per_second:-5%", "--junit", junit) == 1
    out = capsys.readouterr().out
    assert "❌ FAIL" in out and "### What failed" in out
    assert "offline.samples_per_second fell" in out and "allowed -5%" in out and "p=0.05" in out, out
    assert "LoadGen settings differ" in out  # target_qps differs: said, not hidden
    assert summary.read_text().startswith("earlier step\n## mlharness gate: ❌ FAIL")  # appended
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and "fell" in failure.get("message")
    # Under the default --match the batch size is part of the configuration: nothing to compare.
    assert gate(runs, runs["baseline"], runs["slow"], "--rule", "offline.samples_per_second:-5%") == 1
    assert "no configuration has offline.samples_per_second on both sides" in capsys.readouterr().out


def test_direction_and_bootstrap(runs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """With repeats the change must be both beyond the limit and significant; the reverse direction
    of a real regression is never significant."""
    assert gate(runs, runs["slow"], runs["baseline"], "--match", "model,backend,scenario",
                "--rule", "offline.samples_per_second:+5%", "--test", "bootstrap") == 1
    assert "bootstrap p=0" in capsys.readouterr().out
    assert gate(runs, runs["slow"], runs["baseline"], "--match", "model,backend,scenario",
                "--rule", "offline.samples_per_second:-5%") == 0


def test_references_by_file_folder_query_and_prefix(runs: dict, tmp_path: Path) -> None:
    results = runs["results"]
    run_json = tmp_path / "run.json"
    folder = tmp_path / "baseline"
    folder.mkdir()
    with ResultStore(results / "mlharness.sqlite") as store:
        run_json.write_text(json.dumps(store.get_run(runs["accuracy"])))
        for run_id in runs["baseline"]:
            (folder / f"{run_id}.json").write_text(json.dumps(store.get_run(run_id)))
    # The newest three performance runs: candidates and a baseline, the same configuration.
    assert gate(runs, [str(folder)], ["latest:model=null,scenario=Offline,mode=performance,n=3"],
                "--match", "model,backend,scenario", "--rule", "offline.samples_per_second:-50%") == 0
    assert gate(runs, [str(run_json)], [runs["baseline"][0][:-1]], "--match", "model,backend",
                "--rule", "offline.samples_per_second:-50%") == 1  # the accuracy run has no throughput


def test_different_systems_are_refused(runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Another machine cannot exist here: its record is this machine's run with the CPU renamed.
    with ResultStore(runs["results"] / "mlharness.sqlite") as store:
        other = store.get_run(runs["baseline"][0])
    other["system"]["cpu_model"] = "Some Other CPU"
    other["software"]["checked"]["numpy"] = "0.0.1"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    assert gate(runs, [str(path)], runs["candidate"][:1], "--rule", "offline.samples_per_second:-90%") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlharness: error: refusing to compare") and len(err.splitlines()) == 1
    assert "system.cpu_model" in err and "software.numpy" in err
    assert gate(runs, [str(path)], runs["candidate"][:1], "--rule", "offline.samples_per_second:-90%",
                "--allow-different-systems") == 0
    assert "compared across systems" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["offline.samples_per_second", "offline.samples_per_second:5%",
                                  "offline.samples_per_second:-5x", ":-5%"])
def test_bad_rules_are_one_line_errors(text: str) -> None:
    with pytest.raises(UserError, match="expected FIGURE"):
        parse_rule(text)


def test_rule_units() -> None:
    pct, pts, raw = parse_rule("a.b:-5%"), parse_rule("accuracy.top1:-0.5pt"), parse_rule("x.p99_latency_ns:+1000")
    assert pct.violated_by(pct.change(100.0, 94.0)) and not pct.violated_by(pct.change(100.0, 96.0))
    assert pts.violated_by(pts.change(0.760, 0.754)) and not pts.violated_by(pts.change(0.760, 0.756))
    assert raw.violated_by(raw.change(5000, 6001)) and not raw.violated_by(raw.change(5000, 4000))


def test_shipped_baseline_gates_itself(tmp_path: Path) -> None:
    """The CI workflow's baseline (scenarios/baselines/null-offline) is real run records that load and compare."""
    from tests.support import REPO

    baseline = REPO / "scenarios" / "baselines" / "null-offline"
    assert run_cli("gate", "--db", tmp_path / "none.sqlite", "--baseline", baseline, "--candidate", baseline,
                   "--rule", "offline.samples_per_second:-0%", "--rule", "accuracy.top1:-0pt") == 0
