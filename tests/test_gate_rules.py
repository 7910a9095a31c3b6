"""The gate's rules and verdicts as users read them, on records built in memory with fixed numbers:
rule and --match parsing (one-line errors), configuration keys, the exact notes, refusals and table
rows a gate prints, which Mann-Whitney method answers (exact for up to 16 runs even with tied runs,
the normal approximation beyond), the bootstrap's 90% interval and its 4000 resamples, and the
message when scipy is missing. Every expected number is worked out here, independently of the code."""
from __future__ import annotations

import math
import sys
from itertools import combinations

import pytest

from mlharness.compare import gate
from mlharness.compare.gate import DEFAULT_ALPHA, config_key, evaluate, parse_match, parse_rule
from mlharness.compare.gate_output import markdown
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord

THROUGHPUT = "offline.samples_per_second"
SYSTEM = {"cpu_model": "Xeon A", "logical_cpus": 8}


def record(run_id: str, value: float | None = 100.0, *, status: str = "ok", harness: dict | None = None,
           loadgen: dict | None = None, system: dict | None = None) -> RunRecord:
    """A performance record of one Offline run of model m with `value` samples/s (None: no figure)."""
    return RunRecord(run_id=run_id, command="mlharness run m", model={"name": "m"}, dataset={}, backend="null",
                     scenario="Offline", mode="performance", status=status,
                     error=None if status == "ok" else "it broke", system=dict(SYSTEM if system is None else system),
                     settings={"harness": {"max_batch_size": 8} if harness is None else harness,
                               "loadgen": loadgen or {"target_qps": "10"}},
                     performance=None if value is None else {"samples_per_second": value})


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(UserError) as raised:
        call(*args, **kwargs)
    text = str(raised.value)
    assert "\n" not in text
    return text


# ---- parsing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["offline.samples_per_second", "x:5%", "x:-5 %", "x:-five%", "x y:-5%", ":-5%"])
def test_a_malformed_rule_is_one_line_naming_the_form(text: str) -> None:
    assert one_line_error(parse_rule, text) == (
        f"--rule {text!r}: expected FIGURE:[+-]LIMIT[%|pt], e.g. offline.samples_per_second:-5% "
        "or accuracy.top1:-0.5pt")


@pytest.mark.parametrize("text, figure, sign, limit, unit, allowed", [
    (" offline.samples_per_second:-5% ", THROUGHPUT, "-", 5.0, "%", "-5%"),
    ("accuracy.top1:-0.5pt", "accuracy.top1", "-", 0.5, "pt", "-0.5pt"),
    ("server.p99_latency_ns:+1000", "server.p99_latency_ns", "+", 1000.0, "", "+1000"),
])
def test_a_rule_parses_into_figure_sign_limit_and_unit(text: str, figure: str, sign: str, limit: float, unit: str,
                                                       allowed: str) -> None:
    rule = parse_rule(text)
    assert (rule.text, rule.figure, rule.sign, rule.limit, rule.unit) == (text.strip(), figure, sign, limit, unit)
    assert rule.allowed() == allowed


def test_a_limit_in_the_figures_own_unit_is_printed_without_a_unit() -> None:
    check = gate._check(parse_rule("offline.p99_latency_ns:+1000"), "c", [5000.0], [6500.0], "none", DEFAULT_ALPHA)
    assert check.status == "fail" and check.change == 1500.0
    assert check.message == ("offline.p99_latency_ns rose 1.5e+03 from a median of 5000 (1 run(s)) to 6500 (1 run(s)); "
                             "allowed +1000; no significance test (--test none): the limit alone decides")


@pytest.mark.parametrize("text, baseline, at_limit, beyond", [
    ("offline.p99_latency_ns:+1000", 5000.0, 6000.0, 6001.0),   # may rise by at most 1000
    ("offline.p99_latency_ns:+10%", 200.0, 220.0, 221.0),       # at most 10%
    (f"{THROUGHPUT}:-1000", 5000.0, 4000.0, 3999.0),            # may fall by at most 1000
    (f"{THROUGHPUT}:-10%", 200.0, 180.0, 179.0),
    ("accuracy.top1:-25pt", 0.5, 0.25, 0.2499),                 # exact in binary
    ("accuracy.top1:-0.5pt", 0.75, 0.745, 0.744),               # 100 * (0.745 - 0.75) is -0.5000000000000004
])
def test_a_change_exactly_at_the_limit_passes(text: str, baseline: float, at_limit: float, beyond: float) -> None:
    rule = parse_rule(text)
    held = gate._check(rule, "c", [baseline], [at_limit], "none", DEFAULT_ALPHA)
    assert abs(held.change) == pytest.approx(rule.limit) and held.status == "pass"
    assert gate._check(rule, "c", [baseline], [beyond], "none", DEFAULT_ALPHA).status == "fail"


@pytest.mark.parametrize("text, fields", [
    ("model", ("model",)),
    (" scenario , model,, mode ", ("scenario", "model", "mode")),
    ("model,backend,scenario,mode,settings", ("model", "backend", "scenario", "mode", "settings")),
])
def test_match_keeps_the_fields_given_in_order(text: str, fields: tuple[str, ...]) -> None:
    assert parse_match(text) == fields


@pytest.mark.parametrize("text", ["model,colour", "colour", "", " , ", "Model"])
def test_an_unknown_or_empty_match_is_one_line_listing_the_fields(text: str) -> None:
    assert one_line_error(parse_match, text) == (
        f"--match {text!r}: expected a comma list of model, backend, scenario, mode, settings")


def test_config_key_joins_the_matched_fields_and_names_a_key_with_none_all_runs() -> None:
    bare = record("r", harness={})
    assert config_key(record("r")) == "m null Offline max_batch_size=8"
    assert config_key(record("r", harness={"workers": 2, "max_batch_size": 4}), ("settings", "mode")) == \
        "max_batch_size=4 workers=2 performance"
    assert config_key(bare, ("model", "settings")) == "m"  # empty settings leave no gap
    assert config_key(bare, ("settings",)) == "all runs"
    (check,) = evaluate([record("b", 100.0, harness={})], [record("c", 99.0, harness={})],
                        [parse_rule(f"{THROUGHPUT}:-5%")], match=("settings",)).checks
    assert (check.config, check.status) == ("all runs", "pass")


# ---- evaluate: exact notes, refusals and one-line errors -----------------------------------------

def test_unusable_input_is_exactly_one_line() -> None:
    rules = [parse_rule(f"{THROUGHPUT}:-5%")]
    assert one_line_error(evaluate, [record("b")], [record("c")], []) == \
        "--rule: give at least one rule, e.g. --rule offline.samples_per_second:-5%"
    assert one_line_error(evaluate, [record("b", status="failed")], [record("c")], rules) == \
        "--baseline: no successful run among the baseline runs"
    assert one_line_error(evaluate, [record("b")], [record("c")], rules, test="ttest") == \
        "--test: expected one of mannwhitney, bootstrap, none, got 'ttest'"


def test_test_none_lets_the_limit_alone_decide_with_repeats() -> None:
    base = [record(f"b{i}", v) for i, v in enumerate([100.0, 101.0, 102.0])]
    cand = [record(f"c{i}", v) for i, v in enumerate([94.0, 200.0, 95.0])]  # median 95: -5.9%, not significant
    (check,) = evaluate(base, cand, [parse_rule(f"{THROUGHPUT}:-5%")], test="none").checks
    assert check.status == "fail" and check.p_value is None
    assert check.test == "no significance test (--test none): the limit alone decides"


def test_left_out_baselines_and_differing_loadgen_settings_are_noted_exactly() -> None:
    base = [record("b0", loadgen={"target_qps": "10"}), record("b1", status="failed"), record("b2", status="failed")]
    cand = [record("c0", loadgen={"target_qps": "20", "min_duration_ms": "1000"})]
    result = evaluate(base, cand, [parse_rule(f"{THROUGHPUT}:-5%")])
    assert result.warnings == [
        "baseline runs not ok, left out: b1, b2",
        "m null Offline max_batch_size=8: LoadGen settings differ between baseline and candidate: "
        "min_duration_ms: None vs 1000; target_qps: 10 vs 20",
    ]


def test_a_failed_candidate_is_an_error_row_in_its_configuration() -> None:
    """The error check shows as the rule `run status` with nothing allowed (-0), in the configuration
    --match makes of the failed run (here the model alone)."""
    result = evaluate([record("b0")], [record("c0"), record("c1", status="failed")],
                      [parse_rule(f"{THROUGHPUT}:-5%")], match=("model",))
    error = next(c for c in result.checks if c.status == "error")
    assert (error.rule.text, error.config, error.rule.allowed()) == ("run status", "m", "-0")
    assert error.message == "candidate run c1 failed: it broke"
    assert "| ❌ | `run status` | m | - | - | - | -0 | - |" in markdown(result).splitlines()


def test_a_rule_no_configuration_has_is_a_missing_row() -> None:
    result = evaluate([record("b0")], [record("c0")], [parse_rule("accuracy.top1:-1pt")])
    (check,) = result.checks
    assert (check.status, check.config) == ("missing", "-")
    assert check.message == ("no configuration has accuracy.top1 on both sides "
                             "(check the figure name and the runs' scenario and mode)")
    assert "| ⚠️ | `accuracy.top1:-1pt` | - | - | - | - | -1pt | - |" in markdown(result).splitlines()
    assert not result.passed


# ---- comparability: every run against the first baseline run ------------------------------------

OTHER = {"cpu_model": "Xeon B", "logical_cpus": 16}
REFUSAL = ("refusing to compare: runs b0 and {other} differ: system.cpu_model: 'Xeon A' vs 'Xeon B'; "
           "system.logical_cpus: 8 vs 16 (pass --allow-different-systems to compare anyway)")


@pytest.mark.parametrize("baseline, candidate, other", [
    ([record("b0"), record("b1", system=OTHER)], [record("c0")], "b1"),                  # the second baseline run
    ([record("b0"), record("b1")], [record("c0"), record("c1", system=OTHER)], "c1"),    # after comparable ones
])
def test_runs_from_another_system_are_refused_by_default(baseline: list[RunRecord], candidate: list[RunRecord],
                                                         other: str) -> None:
    rules = [parse_rule(f"{THROUGHPUT}:-5%")]
    assert one_line_error(evaluate, baseline, candidate, rules) == REFUSAL.format(other=other)
    result = evaluate(baseline, candidate, rules, allow_different_systems=True)
    assert result.warnings == [f"compared across systems: runs b0 and {other} differ: system.cpu_model: "
                               "'Xeon A' vs 'Xeon B'; system.logical_cpus: 8 vs 16"]
    assert result.passed


# ---- Mann-Whitney: which method answers ----------------------------------------------------------

def exact_p(baseline: list[float], candidate: list[float]) -> float:
    """Share of the splits of the pooled values with U (pairs baseline > candidate) at least the
    observed one; exact when no baseline value ties a candidate value."""
    def u(b: list[float], c: list[float]) -> int:
        return sum(x > y for x in b for y in c)
    pooled, observed, n = baseline + candidate, u(baseline, candidate), len(baseline)
    splits = list(combinations(range(len(pooled)), n))
    hits = sum(u([pooled[i] for i in s], [pooled[i] for i in range(len(pooled)) if i not in s]) >= observed
               for s in splits)
    return hits / len(splits)


def normal_p(baseline: list[float], candidate: list[float]) -> float:
    """The normal approximation of the one-sided p, with the continuity and tie corrections."""
    n1, n2 = len(baseline), len(candidate)
    n = n1 + n2
    u = sum((x > y) + 0.5 * (x == y) for x in baseline for y in candidate)
    pooled = baseline + candidate
    ties = sum(t ** 3 - t for t in (pooled.count(v) for v in set(pooled)))
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    z = (u - n1 * n2 / 2 - 0.5) / sigma
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("baseline, candidate", [
    ([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]),              # repeated identical figures (accuracy is deterministic)
    ([7.0, 7.0, 7.0], [2.0, 2.0, 1.0]),              # tied on both sides, no tie across
    ([10.0] * 8, [float(i) for i in range(1, 9)]),   # 16 runs: still exact
])
def test_up_to_16_runs_the_p_is_exact_even_with_tied_runs(baseline: list[float], candidate: list[float]) -> None:
    p, text = gate._mann_whitney(parse_rule(f"{THROUGHPUT}:-5%"), baseline, candidate, DEFAULT_ALPHA)
    expected = exact_p(baseline, candidate)
    assert expected == 1 / math.comb(len(baseline) + len(candidate), len(baseline))  # complete separation
    assert expected != pytest.approx(normal_p(baseline, candidate), rel=0.05)       # the approximation differs
    assert p == pytest.approx(expected, rel=1e-9)
    assert text == f"Mann-Whitney U one-sided p={expected:.3g}"


def test_beyond_16_runs_the_p_is_the_normal_approximation() -> None:
    """9+8 tied runs: the exact p would be 1/C(17, 9) = 4.1e-05; the normal approximation gives 1.08e-04."""
    baseline, candidate = [10.0] * 9, [float(i) for i in range(1, 9)]
    p, text = gate._mann_whitney(parse_rule(f"{THROUGHPUT}:-5%"), baseline, candidate, DEFAULT_ALPHA)
    expected = normal_p(baseline, candidate)
    assert expected == pytest.approx(1.0832e-4, rel=1e-3)
    assert expected != pytest.approx(1 / math.comb(17, 9), rel=0.5)
    assert p == pytest.approx(expected, rel=1e-9)
    assert text == "Mann-Whitney U one-sided p=0.000108"
    # A rising rule takes the other side: the same runs swapped.
    p, _ = gate._mann_whitney(parse_rule("offline.p99_latency_ns:+5%"), candidate, baseline, DEFAULT_ALPHA)
    assert p == pytest.approx(expected, rel=1e-9)


def test_without_scipy_the_gate_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # import scipy.stats now fails
    assert one_line_error(gate._mann_whitney, parse_rule(f"{THROUGHPUT}:-5%"), [1.0, 2.0], [3.0, 4.0],
                          DEFAULT_ALPHA) == ("scipy is not installed (needed for the gate's Mann-Whitney U test); "
                                             "pip install 'mlharness[gates]'")


# ---- bootstrap: resamples and the 90% interval ---------------------------------------------------

def at_least(k: int, n: int, q: float) -> float:
    """P(at least k of n draws hit), each with probability q."""
    return sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k, n + 1))


def test_the_bootstrap_p_is_a_share_of_4000_resamples() -> None:
    """As documented: p counts resamples out of 4000 (a share of 4001 would not be a multiple of 1/4000)."""
    p, _ = gate._bootstrap(parse_rule(f"{THROUGHPUT}:-7%"), [100.0, 100.0, 100.0], [90.0, 100.0], DEFAULT_ALPHA)
    assert 0 < p < 1 and abs(p * 4000 - round(p * 4000)) < 1e-9


@pytest.mark.parametrize("candidate, low_tail, high_tail, interval", [
    # Median of 5 draws from {90, 100 x4} is 90 when 3+ draws are 90: P = 5.79%, just above 5%, so
    # the 5th percentile is -10% (the 6th would be 0%).
    ([90.0] + [100.0] * 4, at_least(3, 5, 1 / 5), 0.0, "-10..+0%"),
    # Median of 10 draws from {100 x7, 110 x3} is 110 when 6+ draws are 110 (P = 4.73%, below 5%) and
    # 105 when exactly 5 are (10.3%), so the 95th percentile is +5% (the 96th would be +10%).
    ([100.0] * 7 + [110.0] * 3, 0.0, at_least(6, 10, 0.3), "+0..+5%"),
])
def test_the_bootstrap_interval_is_the_5th_to_95th_percentile(candidate: list[float], low_tail: float,
                                                              high_tail: float, interval: str) -> None:
    """Against a constant baseline of 100 the resampled change is (median - 100)%; with 200000 resamples
    the tails' shares are within 0.06% (about 4 sd) of the exact ones, far from the 5%/6% and 94%/95% edges."""
    assert low_tail == 0.0 or 0.055 < low_tail < 0.059
    assert high_tail == 0.0 or 0.044 < high_tail < 0.048
    p, text = gate._bootstrap(parse_rule(f"{THROUGHPUT}:-5%"), [100.0], candidate, DEFAULT_ALPHA, resamples=200_000)
    assert p == pytest.approx(1 - low_tail, abs=0.002)
    assert text.endswith(f", 90% interval of the change {interval}")
