"""Gates on real short runs of the null model. Every verdict here holds on any machine under any
load: a regression is a model that sleeps 100 ms per batch (tests/data/null-slow.yaml, hundreds of
times slower, not a few percent), runs of the same configuration are held to limits only a tenfold
slowdown would break, and the "no change" verdict compares identical runs. Also: readable Markdown
and JUnit XML, references by file, folder, query and prefix, runs from another machine refused."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mlharness.compare.gate import parse_rule
from mlharness.errors import UserError
from mlharness.store.result_store import ResultStore
from tests.support import NULL_OFFLINE, REPO, null_offline_pair, run_cli, run_new

SLOW = REPO / "tests" / "data" / "null-slow.yaml"
THROUGHPUT = "offline.samples_per_second"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three runs of the slowed null model, one of the null model with other harness settings, then
    three baseline and three candidate runs of the null model (alternating, so a change in the
    machine's load touches both sides) and an accuracy run. The newest three performance runs are
    candidate 1, baseline 2 and candidate 2."""
    results = tmp_path_factory.mktemp("gate")
    ids: dict[str, list[str]] = {"slow": [run_new(results, SLOW, "--scenario", "Offline", "--quick")
                                          for _ in range(3)]}
    other = run_new(results, *NULL_OFFLINE, "--set", "max_batch_size=512")
    pair = null_offline_pair(results)
    ids["baseline"], ids["candidate"] = [pair["performance"]], []
    for i in range(3):
        ids["candidate"].append(run_new(results, *NULL_OFFLINE))
        if i < 2:
            ids["baseline"].append(run_new(results, *NULL_OFFLINE))
    return {"results": results, **ids, "other": other, "accuracy": pair["accuracy"]}


def _p(text: str, test: str = "Mann-Whitney U one-sided") -> float:
    """The p value the gate printed for its only check (in the table, and again for a failure)."""
    (found,) = set(re.findall(rf"{test} p=([0-9.e+-]+)", text))
    return float(found)


def _listed(text: str, side: str) -> set[str]:
    """The run ids the Markdown lists for a side ("Baseline" or "candidate")."""
    match = re.search(rf"{side}: \d+ run\(s\) \(([^)]*)\)", text)
    assert match, text
    return set(match[1].split(", "))


def gate(runs: dict, baseline: list[str], candidate: list[str], *extra: str) -> int:
    args = ["gate", "--results-dir", runs["results"]]
    for ref in baseline:
        args += ["--baseline", ref]
    for ref in candidate:
        args += ["--candidate", ref]
    return run_cli(*args, *extra)


def test_same_configuration_passes(runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Limits only a tenfold change breaks (on the median, and significant: all three candidate runs
    below all three baseline runs), so the verdict does not depend on the machine's load."""
    md, junit = tmp_path / "gate.md", tmp_path / "gate.xml"
    assert gate(runs, runs["baseline"], runs["candidate"], "--rule", f"{THROUGHPUT}:-90%",
                "--rule", "offline.p99_latency_ns:+900%", "--markdown", md, "--junit", junit) == 0
    text = md.read_text()
    assert text.startswith("## mlharness gate: ✅ PASS") and text.count("(n=3)") == 4 and "Mann-Whitney U" in text
    assert _listed(text, "Baseline") == set(runs["baseline"]) and _listed(text, "candidate") == set(runs["candidate"])
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "0" and suite.get("errors") == "0"
    assert capsys.readouterr().out == text  # the same Markdown on stdout


def test_identical_runs_pass_with_no_change(runs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The "no change" verdict: the same runs on both sides pass a limit of 0, the change is exactly
    0, and the one-sided test of a sample against itself gives p >= 1/2 (never significant)."""
    assert gate(runs, runs["baseline"], runs["baseline"], "--rule", f"{THROUGHPUT}:-0%",
                "--rule", "offline.p99_latency_ns:+0%") == 0
    out = capsys.readouterr().out
    assert out.startswith("## mlharness gate: ✅ PASS") and out.count("| +0% |") == 2
    p_values = [float(p) for p in re.findall(r"Mann-Whitney U one-sided p=([0-9.]+)", out)]
    assert len(p_values) == 2 and all(0.5 <= p <= 1 for p in p_values), out
    # One run against itself: the limit alone decides, and a change of 0 is within any limit.
    assert gate(runs, runs["baseline"][:1], runs["baseline"][:1], "--rule", f"{THROUGHPUT}:-0%") == 0
    assert "fewer than 2 runs on a side: the limit alone decides" in capsys.readouterr().out
    # The accuracy run against itself: accuracy is a figure like any other (no timing in it at all).
    assert gate(runs, ["latest:model=null,mode=accuracy"], ["latest:model=null,mode=accuracy"],
                "--rule", "accuracy.top1:-0pt", "--rule", "accuracy.top5:-0pt") == 0
    out = capsys.readouterr().out
    assert _listed(out, "Baseline") == {runs["accuracy"]} and "| 0.5 (n=1) | 0.5 (n=1) | +0pt |" in out


def test_slower_model_fails_with_an_explanation(runs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The slowed model under the default --match: the same configuration, hundreds of times slower."""
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "gate.xml"
    assert gate(runs, runs["baseline"], runs["slow"], "--rule", f"{THROUGHPUT}:-50%", "--junit", junit) == 1
    out = capsys.readouterr().out
    assert out.startswith("## mlharness gate: ❌ FAIL (1 of 1 checks)") and "### What failed" in out
    fell = re.search(rf"{THROUGHPUT} fell ([0-9.]+)% from a median of", out)
    assert fell and float(fell[1]) > 90, out  # 100 ms a batch: far beyond any noise
    assert "allowed -50%" in out and _p(out) == 0.05  # 3+3 runs, completely separated: 1/20
    assert "LoadGen settings differ between baseline and candidate: target_qps: 1000000 vs 1000" in out
    assert summary.read_text() == "earlier step\n" + out  # appended
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("message").startswith(f"{THROUGHPUT} fell ")


def test_harness_settings_are_part_of_the_configuration(runs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Under the default --match a run with another max_batch_size has nothing to compare with;
    --match without `settings` compares it, and says how the LoadGen settings differ."""
    assert gate(runs, runs["baseline"], [runs["other"]], "--rule", f"{THROUGHPUT}:-90%") == 1
    out = capsys.readouterr().out
    assert f"no configuration has {THROUGHPUT} on both sides" in out
    assert "candidate configuration null null Offline max_batch_size=512 has no baseline" in out
    assert gate(runs, runs["baseline"], [runs["other"]], "--match", "model,backend,scenario",
                "--rule", f"{THROUGHPUT}:-90%") == 0
    out = capsys.readouterr().out
    assert out.startswith("## mlharness gate: ✅ PASS") and "fewer than 2 runs on a side" in out


def test_direction_and_bootstrap(runs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The slowed model as the baseline: the null model's throughput rose hundreds of times, beyond a
    +5% limit in every one of the bootstrap's resamples (p exactly 0); the same change is no
    regression against a -5% limit."""
    assert gate(runs, runs["slow"], runs["baseline"], "--rule", f"{THROUGHPUT}:+5%", "--test", "bootstrap") == 1
    out = capsys.readouterr().out
    assert f"{THROUGHPUT} rose " in out and _p(out, "bootstrap") == 0.0
    assert gate(runs, runs["slow"], runs["baseline"], "--rule", f"{THROUGHPUT}:-5%") == 0
    out = capsys.readouterr().out
    assert out.startswith("## mlharness gate: ✅ PASS") and _p(out) == 1.0  # the other direction: 20/20


def test_references_by_file_folder_query_and_prefix(runs: dict, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Each kind of reference resolves to the runs it names (read from the Markdown's run lists)."""
    results = runs["results"]
    run_json = tmp_path / "run.json"
    folder = tmp_path / "baseline"
    folder.mkdir()
    with ResultStore(results / "mlharness.sqlite") as store:
        run_json.write_text(json.dumps(store.get_record(runs["accuracy"]).to_dict()))
        for run_id in runs["baseline"]:
            (folder / f"{run_id}.json").write_text(json.dumps(store.get_record(run_id).to_dict()))
    assert gate(runs, [str(folder)], ["latest:model=null,scenario=Offline,mode=performance,n=3"],
                "--rule", f"{THROUGHPUT}:-90%") == 0
    out = capsys.readouterr().out
    assert _listed(out, "Baseline") == set(runs["baseline"])
    assert _listed(out, "candidate") == {runs["candidate"][1], runs["baseline"][2], runs["candidate"][2]}
    # A file and a unique prefix of a run id; the accuracy run has no throughput to compare.
    assert gate(runs, [str(run_json)], [runs["baseline"][0][:-1]], "--match", "model,backend",
                "--rule", f"{THROUGHPUT}:-90%") == 1
    out = capsys.readouterr().out
    assert _listed(out, "Baseline") == {runs["accuracy"]} and _listed(out, "candidate") == {runs["baseline"][0]}
    assert f"no configuration has {THROUGHPUT} on both sides" in out


def test_different_systems_are_refused(runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Another machine cannot exist here: its record is this machine's run with the CPU renamed.
    with ResultStore(runs["results"] / "mlharness.sqlite") as store:
        other = store.get_record(runs["baseline"][0]).to_dict()
    other["system"]["cpu_model"] = "Some Other CPU"
    other["software"]["checked"]["numpy"] = "0.0.1"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    assert gate(runs, [str(path)], runs["candidate"][:1], "--rule", f"{THROUGHPUT}:-90%") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlharness: error: refusing to compare") and len(err.splitlines()) == 1
    assert "system.cpu_model" in err and "software.numpy" in err
    assert gate(runs, [str(path)], runs["candidate"][:1], "--rule", f"{THROUGHPUT}:-90%",
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
    baseline = REPO / "scenarios" / "baselines" / "null-offline"
    assert run_cli("gate", "--db", tmp_path / "none.sqlite", "--baseline", baseline, "--candidate", baseline,
                   "--rule", "offline.samples_per_second:-0%", "--rule", "accuracy.top1:-0pt") == 0
