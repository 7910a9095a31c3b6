"""The gate's statistics on fixed numbers with answers worked out here, independently of the code:
Mann-Whitney U p-values by enumerating every split of the pooled runs, bootstrap shares where the
resampled medians have a known distribution, and the verdict rules (limit and significance) of
mlharness.compare.gate on records built in memory. No run, no timing: the same answers on any machine."""
from __future__ import annotations

import math
import re
from itertools import combinations

import pytest

from mlharness.compare import gate
from mlharness.compare.gate import DEFAULT_ALPHA, evaluate, parse_rule
from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord

THROUGHPUT = "offline.samples_per_second"


def exact_p(baseline: list[float], candidate: list[float]) -> float:
    """One-sided exact p that the baseline is stochastically greater than the candidate: the share
    of the C(n+m, n) ways to split the pooled values whose U (pairs with baseline > candidate) is at
    least the observed one. For values without ties this is the exact Mann-Whitney p."""
    def u(b: list[float], c: list[float]) -> int:
        return sum(x > y for x in b for y in c)

    pooled, observed = baseline + candidate, u(baseline, candidate)
    splits = [set(chosen) for chosen in combinations(range(len(pooled)), len(baseline))]
    extreme = sum(u([pooled[i] for i in s], [pooled[i] for i in range(len(pooled)) if i not in s]) >= observed
                  for s in splits)
    return extreme / len(splits)


def record(run_id: str, value: float | None, *, status: str = "ok", model: str = "m",
           harness: dict | None = None, loadgen: dict | None = None) -> RunRecord:
    """A performance record of one Offline run, with `value` samples/s (None: no figure)."""
    return RunRecord(run_id=run_id, command="mlharness run m", model={"name": model}, dataset={}, backend="null",
                     scenario="Offline", mode="performance", status=status,
                     error=None if status == "ok" else "it broke",
                     settings={"harness": harness or {"max_batch_size": 8}, "loadgen": loadgen or {"target_qps": "10"}},
                     performance=None if value is None else {"samples_per_second": value})


def records(prefix: str, values: list[float]) -> list[RunRecord]:
    return [record(f"{prefix}{i}", v) for i, v in enumerate(values)]


# ---- Mann-Whitney U ------------------------------------------------------------------------------

def test_enumeration_gives_the_textbook_values() -> None:
    """The reference itself: complete separation of n+m runs is 1 / C(n+m, n); 4+4 with U=12 is 12/70
    (U's null distribution for 4+4 has 1, 1, 2, 3, 5 ways to reach 16, 15, 14, 13, 12)."""
    assert exact_p([4, 5, 6], [1, 2, 3]) == 1 / 20
    assert exact_p([10, 11, 12, 13], [1, 2, 3, 14]) == 12 / 70


@pytest.mark.parametrize("baseline, candidate", [
    ([104.0, 105.0, 106.0], [101.0, 102.0, 103.0]),       # complete separation: 1/20
    ([10.0, 11.0, 12.0, 13.0], [1.0, 2.0, 3.0, 14.0]),    # one candidate run above every baseline run
    ([5.0, 1.0, 9.0, 7.0], [2.0, 8.0, 3.0, 4.0, 6.0]),    # interleaved, unequal sizes
    ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),                   # the candidate improved: p near 1
])
def test_mann_whitney_p_is_the_exact_one_sided_p(baseline: list[float], candidate: list[float]) -> None:
    rule = parse_rule(f"{THROUGHPUT}:-5%")  # throughput may fall: the bad direction is baseline > candidate
    p, text = gate._mann_whitney(rule, baseline, candidate, DEFAULT_ALPHA)
    assert p == pytest.approx(exact_p(baseline, candidate), abs=1e-12)
    assert text == f"Mann-Whitney U one-sided p={p:.3g}"


def test_mann_whitney_follows_the_rules_direction() -> None:
    """For a figure that may only rise by the limit (latency), a rise is the bad direction."""
    rise = parse_rule("offline.p99_latency_ns:+5%")
    p, _ = gate._mann_whitney(rise, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], DEFAULT_ALPHA)
    assert p == pytest.approx(1 / 20)
    p, _ = gate._mann_whitney(rise, [4.0, 5.0, 6.0], [1.0, 2.0, 3.0], DEFAULT_ALPHA)
    assert p == pytest.approx(exact_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])) == 1.0


@pytest.mark.parametrize("n, m, alpha, reachable", [
    (2, 2, 0.05, False),   # smallest p 1/6
    (2, 3, 0.05, False),   # 1/10
    (3, 3, 0.05, True),    # 1/20 = alpha: reachable
    (3, 3, 0.01, False),
    (4, 4, 0.01, False),   # 1/70 > 0.01
    (5, 5, 0.01, True),    # 1/252
])
def test_mann_whitney_says_when_n_cannot_reach_alpha(n: int, m: int, alpha: float, reachable: bool) -> None:
    baseline, candidate = [100.0 + i for i in range(n)], [float(i) for i in range(m)]
    p, text = gate._mann_whitney(parse_rule(f"{THROUGHPUT}:-5%"), baseline, candidate, alpha)
    assert exact_p(baseline, candidate) == pytest.approx(1 / math.comb(n + m, n))
    if reachable:
        assert p == pytest.approx(1 / math.comb(n + m, n)) and p <= alpha
    else:
        assert p is None and text == f"Mann-Whitney U cannot reach p<={alpha:g} with n={n}+{m}"


# ---- bootstrap -----------------------------------------------------------------------------------

def _parsed(text: str) -> tuple[float, float, float]:
    """(p, low, high) from the bootstrap's summary."""
    match = re.fullmatch(r"bootstrap p=(\S+), 90% interval of the change ([-+][\d.e+]+)\.\.([-+][\d.e+]+)%", text)
    assert match, text
    return float(match[1]), float(match[2]), float(match[3])


def test_bootstrap_of_a_change_beyond_the_limit_in_every_resample_is_p_0() -> None:
    """Every baseline run is more than 5% above every candidate run: every resampled change violates."""
    p, text = gate._bootstrap(parse_rule(f"{THROUGHPUT}:-5%"), [100.0, 101.0, 102.0], [50.0, 51.0, 52.0],
                              DEFAULT_ALPHA)
    shown, low, high = _parsed(text)
    assert p == 0.0 and shown == 0.0
    assert (low, high) == (-51.0, -48.0)  # resampled medians 50..52 against 100..102: -50.98% .. -48%, 3 digits


def test_bootstrap_of_identical_constant_runs_is_p_1() -> None:
    """No resample can move a constant: the change is 0 in all 4000, never beyond -0%."""
    p, text = gate._bootstrap(parse_rule(f"{THROUGHPUT}:-0%"), [7.0, 7.0, 7.0], [7.0, 7.0, 7.0], DEFAULT_ALPHA)
    assert p == 1.0 and text.endswith("interval of the change +0..+0%")


def test_bootstrap_share_follows_the_distribution_of_resampled_medians() -> None:
    """Baseline median is always 100. The median of two candidates drawn from {90, 100} is 90, 95 or
    100 with probabilities 1/4, 1/2, 1/4; a -7% limit is broken only by 90 (-10%): p = 3/4 up to
    the sampling error of 4000 resamples (sd 0.007), and the 5%..95% interval is -10%..0%."""
    rule = parse_rule(f"{THROUGHPUT}:-7%")
    p, text = gate._bootstrap(rule, [100.0, 100.0, 100.0], [90.0, 100.0], DEFAULT_ALPHA)
    assert abs(p - 0.75) < 0.03
    assert text.endswith("interval of the change -10..+0%")
    assert gate._bootstrap(rule, [100.0, 100.0, 100.0], [90.0, 100.0], DEFAULT_ALPHA) == (p, text)  # seeded


# ---- one check: the limit, then significance -----------------------------------------------------

def test_a_change_beyond_the_limit_and_significant_fails() -> None:
    check = gate._check(parse_rule(f"{THROUGHPUT}:-5%"), "c", [104.0, 105.0, 106.0], [90.0, 91.0, 92.0],
                        "mannwhitney", DEFAULT_ALPHA)
    assert check.status == "fail" and check.p_value == pytest.approx(0.05)
    assert check.change == pytest.approx(100 * (91 - 105) / 105)
    assert check.message == (f"{THROUGHPUT} fell 13.3% from a median of 105 (3 run(s)) to 91 (3 run(s)); "
                             "allowed -5%; Mann-Whitney U one-sided p=0.05")


def test_a_change_beyond_the_limit_within_noise_passes() -> None:
    """Medians 13% apart, but one candidate run is the best of all: U = 6 of 9, and 7 of the 20
    splits of 3+3 runs reach U >= 6 (3 + 2 + 1 + 1 ways to U = 6, 7, 8, 9): p = 7/20."""
    baseline, candidate = [104.0, 105.0, 106.0], [90.0, 91.0, 200.0]
    check = gate._check(parse_rule(f"{THROUGHPUT}:-5%"), "c", baseline, candidate, "mannwhitney", DEFAULT_ALPHA)
    assert exact_p(baseline, candidate) == 7 / 20 and check.p_value == pytest.approx(7 / 20)
    assert check.status == "pass" and check.test.endswith("p=0.35 > alpha 0.05: within noise")


def test_a_change_within_the_limit_passes_however_significant() -> None:
    check = gate._check(parse_rule(f"{THROUGHPUT}:-5%"), "c", [100.0, 100.1, 100.2], [97.0, 97.1, 97.2],
                        "mannwhitney", DEFAULT_ALPHA)
    assert check.p_value == pytest.approx(0.05) and check.status == "pass"


@pytest.mark.parametrize("baseline, candidate, test", [
    ([100.0], [80.0, 81.0, 82.0], "mannwhitney"),  # one run on a side
    ([100.0, 101.0, 102.0], [80.0], "bootstrap"),
    ([100.0, 101.0], [80.0, 81.0], "none"),        # no test asked for
])
def test_without_a_test_the_limit_alone_decides(baseline: list[float], candidate: list[float], test: str) -> None:
    fell = gate._check(parse_rule(f"{THROUGHPUT}:-5%"), "c", baseline, candidate, test, DEFAULT_ALPHA)
    assert fell.status == "fail" and fell.p_value is None
    assert fell.test == ("no significance test (--test none): the limit alone decides" if test == "none"
                         else "fewer than 2 runs on a side: the limit alone decides")
    held = gate._check(parse_rule(f"{THROUGHPUT}:-25%"), "c", baseline, candidate, test, DEFAULT_ALPHA)
    assert held.status == "pass"


def test_when_n_cannot_reach_alpha_the_limit_alone_decides() -> None:
    """2+2 runs: Mann-Whitney cannot reach 0.05, so (as documented) the limit decides, and says so."""
    check = gate._check(parse_rule(f"{THROUGHPUT}:-5%"), "c", [100.0, 101.0], [80.0, 81.0], "mannwhitney",
                        DEFAULT_ALPHA)
    assert check.status == "fail" and check.p_value is None
    assert check.test == "Mann-Whitney U cannot reach p<=0.05 with n=2+2"


@pytest.mark.parametrize("text, baseline, candidate, change", [
    ("x.y:-5%", 200.0, 150.0, -25.0),
    ("x.y:+10%", 0.0, 0.0, 0.0),
    ("x.y:+10%", 0.0, 3.0, math.inf),
    ("x.y:-10%", 0.0, -3.0, -math.inf),
    ("accuracy.top1:-0.5pt", 0.760, 0.750, -1.0),
    ("x.p99_latency_ns:+1000", 5000.0, 6500.0, 1500.0),
])
def test_changes_in_each_unit(text: str, baseline: float, candidate: float, change: float) -> None:
    assert parse_rule(text).change(baseline, candidate) == pytest.approx(change)


# ---- evaluate: whole gates on records ------------------------------------------------------------

def test_identical_inputs_pass_with_no_change() -> None:
    """The "no change" verdict: the same runs on both sides. The change is exactly 0 under any limit,
    and a one-sided test of a sample against itself can never be significant (the observed U is the
    middle of its null distribution, so p >= 1/2)."""
    runs = records("r", [100.0, 103.0, 98.0])
    for rule in ("-0%", "+0%"):
        result = evaluate(runs, runs, [parse_rule(f"{THROUGHPUT}:{rule}")])
        (check,) = result.checks
        assert result.passed and check.status == "pass" and check.change == 0.0
        assert 0.5 <= check.p_value <= 1.0
        assert check.message.startswith(f"{THROUGHPUT} did not change 0% from a median of 100 (3 run(s)) to 100")
    (check,) = evaluate(runs, runs, [parse_rule(f"{THROUGHPUT}:-0%")], test="bootstrap").checks
    assert check.status == "pass" and check.change == 0.0 and 0.0 < check.p_value <= 1.0


def test_a_slower_candidate_fails_and_the_alpha_is_the_callers() -> None:
    baseline, candidate = records("b", [100.0, 101.0, 102.0]), records("c", [50.0, 51.0, 52.0])
    rules = [parse_rule(f"{THROUGHPUT}:-5%")]
    (check,) = evaluate(baseline, candidate, rules).checks
    assert check.status == "fail" and check.p_value == pytest.approx(0.05)
    # A stricter alpha 3+3 runs cannot reach: the limit alone decides, and still fails.
    (check,) = evaluate(baseline, candidate, rules, alpha=0.01).checks
    assert check.status == "fail" and check.p_value is None and "cannot reach p<=0.01" in check.test


def test_runs_are_grouped_by_configuration() -> None:
    """Each configuration is compared with its own baseline; one without a baseline is a note."""
    base = [record("b0", 100.0), record("b1", 100.0, harness={"max_batch_size": 1}), record("b2", 100.0)]
    cand = [record("c0", 99.0), record("c1", 10.0, harness={"max_batch_size": 1}),
            record("c2", 99.0, harness={"max_batch_size": 4})]
    result = evaluate(base, cand, [parse_rule(f"{THROUGHPUT}:-5%")])
    by_config = {c.config: c for c in result.checks}
    assert set(by_config) == {"m null Offline max_batch_size=8", "m null Offline max_batch_size=1"}
    assert by_config["m null Offline max_batch_size=8"].status == "pass"
    assert by_config["m null Offline max_batch_size=8"].baseline == [100.0, 100.0]
    assert by_config["m null Offline max_batch_size=1"].status == "fail"
    assert result.warnings == ["candidate configuration m null Offline max_batch_size=4 has no baseline"]
    # Matching on the model alone pools them all: medians 100 and 99.
    (check,) = evaluate(base, cand, [parse_rule(f"{THROUGHPUT}:-5%")], match=("model",)).checks
    assert (check.config, check.status, check.change) == ("m", "pass", pytest.approx(-1.0))


def test_missing_figures_failed_runs_and_settings_are_reported() -> None:
    base = [record("b0", 100.0), record("b1", 100.0, status="failed"), record("b2", None)]
    cand = [record("c0", 100.0, loadgen={"target_qps": "20"}), record("c1", None, status="failed")]
    result = evaluate(base, cand, [parse_rule(f"{THROUGHPUT}:-5%"), parse_rule("accuracy.top1:-1pt")])
    statuses = sorted((c.rule.figure, c.status) for c in result.checks)
    assert statuses == [("accuracy.top1", "missing"), (THROUGHPUT, "pass"), ("status", "error")]
    assert not result.passed and result.baseline_ids == ["b0", "b2"] and result.candidate_ids == ["c0"]
    assert "baseline runs not ok, left out: b1" in result.warnings
    assert any("LoadGen settings differ" in w and "target_qps: 10 vs 20" in w for w in result.warnings)
    error = next(c for c in result.checks if c.status == "error")
    assert error.message == "candidate run c1 failed: it broke"


@pytest.mark.parametrize("kwargs, message", [
    ({"test": "ttest"}, "--test: expected one of mannwhitney, bootstrap, none, got 'ttest'"),
    ({"rules": []}, "--rule: give at least one rule"),
    ({"baseline": [record("b", 1.0, status="failed")]}, "--baseline: no successful run among the baseline runs"),
])
def test_unusable_input_is_one_line(kwargs: dict, message: str) -> None:
    args = {"baseline": [record("b", 1.0)], "candidate": [record("c", 1.0)],
            "rules": [parse_rule(f"{THROUGHPUT}:-5%")]} | kwargs
    with pytest.raises(UserError, match=re.escape(message)):
        evaluate(args.pop("baseline"), args.pop("candidate"), args.pop("rules"), **args)
