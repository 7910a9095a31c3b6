"""Performance and accuracy gates: does a candidate regress against a baseline beyond a rule's limit?

A rule is `FIGURE:LIMIT`, e.g. `offline.samples_per_second:-5%` (may fall at most 5%),
`server.p99_latency_ns:+10%` (may rise at most 10%), `accuracy.top1:-0.5pt` (may fall at most half
a percentage point), or a plain number in the figure's unit. Runs are grouped by configuration
(model, backend, scenario, harness settings); a group's figure is the median over its runs, and
with repeats on both sides a one-sided test must also find the change significant, so noise alone
does not fail a build."""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from mlharness.compare import comparability
from mlharness.errors import UserError, require
from mlharness.records.run_record import RunRecord

_RULE = re.compile(r"^(?P<figure>[A-Za-z0-9_.]+):(?P<sign>[+-])(?P<limit>\d+(?:\.\d+)?)(?P<unit>%|pt)?$")
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class Rule:
    text: str
    figure: str
    sign: str  # "-": the figure may fall by at most `limit`; "+": it may rise by at most `limit`
    limit: float
    unit: str  # "%" relative, "pt" percentage points of a fraction, "" the figure's own unit

    def change(self, baseline: float, candidate: float) -> float:
        """The change in this rule's unit."""
        if self.unit == "%":
            if baseline == 0:
                return 0.0 if candidate == 0 else math.copysign(math.inf, candidate - baseline)
            return 100.0 * (candidate - baseline) / abs(baseline)
        if self.unit == "pt":
            return 100.0 * (candidate - baseline)
        return candidate - baseline

    def violated_by(self, change: float) -> bool:
        # Rounded first: 100 * (0.755 - 0.76) is -0.5000000000000004, and a drop of exactly the
        # limit must pass as printed.
        change = round(change, 9)
        return change < -self.limit if self.sign == "-" else change > self.limit

    def allowed(self) -> str:
        return f"{self.sign}{self.limit:g}{self.unit}"


def parse_rule(text: str) -> Rule:
    match = _RULE.match(text.strip())
    if not match:
        raise UserError(f"--rule {text!r}: expected FIGURE:[+-]LIMIT[%|pt], e.g. offline.samples_per_second:-5% "
                        "or accuracy.top1:-0.5pt")
    return Rule(text=text.strip(), figure=match["figure"], sign=match["sign"], limit=float(match["limit"]),
                unit=match["unit"] or "")


# What can make two runs "the same configuration"; --match picks a subset.
MATCH_FIELDS: dict[str, Callable[[RunRecord], str]] = {
    "model": lambda r: str(r.model_name),
    "backend": lambda r: str(r.backend),
    "scenario": lambda r: str(r.scenario),
    "mode": lambda r: str(r.mode),
    "settings": lambda r: " ".join(f"{k}={v}" for k, v in sorted(r.harness_settings.items())),
}
DEFAULT_MATCH = ("model", "backend", "scenario", "settings")


def parse_match(text: str) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = [f for f in fields if f not in MATCH_FIELDS]
    if unknown or not fields:
        raise UserError(f"--match {text!r}: expected a comma list of {', '.join(MATCH_FIELDS)}")
    return fields


def config_key(record: RunRecord, match: tuple[str, ...] = DEFAULT_MATCH) -> str:
    """What must be equal for two runs to be compared: the --match fields."""
    parts = [MATCH_FIELDS[f](record) for f in match]
    return " ".join(p for p in parts if p) or "all runs"


@dataclass
class Check:
    rule: Rule
    config: str
    status: str  # pass | fail | missing | error
    baseline: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    change: float | None = None
    p_value: float | None = None
    test: str = ""
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.status != "pass"


@dataclass
class GateResult:
    checks: list[Check]
    baseline_ids: list[str]
    candidate_ids: list[str]
    warnings: list[str]
    system: dict[str, Any]

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.checks)


# ---- significance ------------------------------------------------------------------------------


def _mann_whitney(rule: Rule, baseline: list[float], candidate: list[float], alpha: float) -> tuple[float | None, str]:
    """One-sided p that the candidate moved in the rule's bad direction; None when n cannot reach alpha."""
    mannwhitneyu = require("scipy.stats", "gates", "the gate's Mann-Whitney U test").mannwhitneyu

    smallest_p = 1.0 / math.comb(len(baseline) + len(candidate), len(baseline))
    if smallest_p > alpha:
        return None, f"Mann-Whitney U cannot reach p<={alpha:g} with n={len(baseline)}+{len(candidate)}"
    # "-" rule: a regression is the baseline being greater than the candidate.
    alternative = "greater" if rule.sign == "-" else "less"
    method = "exact" if len(baseline) + len(candidate) <= 16 else "auto"
    p = float(mannwhitneyu(baseline, candidate, alternative=alternative, method=method).pvalue)
    return p, f"Mann-Whitney U one-sided p={p:.3g}"


def _bootstrap(rule: Rule, baseline: list[float], candidate: list[float], alpha: float,
               resamples: int = 4000) -> tuple[float | None, str]:
    """Share of resampled median pairs whose change stays within the limit: small means a real regression."""
    import numpy as np

    rng = np.random.default_rng(0)  # fixed: the same runs give the same verdict
    b = rng.choice(np.asarray(baseline), size=(resamples, len(baseline))).astype(float)
    c = rng.choice(np.asarray(candidate), size=(resamples, len(candidate))).astype(float)
    changes = [rule.change(x, y) for x, y in zip(np.median(b, axis=1), np.median(c, axis=1))]
    within = sum(1 for change in changes if not rule.violated_by(change))
    p = within / resamples
    low, high = np.percentile(changes, [5, 95])
    return p, f"bootstrap p={p:.3g}, 90% interval of the change {low:+.3g}..{high:+.3g}{rule.unit}"


TESTS: dict[str, Callable[[Rule, list[float], list[float], float], tuple[float | None, str]]] = {
    "mannwhitney": _mann_whitney,
    "bootstrap": _bootstrap,
}


# ---- evaluation --------------------------------------------------------------------------------


def _check(rule: Rule, config: str, baseline: list[float], candidate: list[float], test: str, alpha: float) -> Check:
    med_b, med_c = statistics.median(baseline), statistics.median(candidate)
    change = rule.change(med_b, med_c)
    check = Check(rule, config, "pass", baseline, candidate, change)
    if len(baseline) >= 2 and len(candidate) >= 2 and test != "none":
        check.p_value, check.test = TESTS[test](rule, baseline, candidate, alpha)
    elif test == "none":
        check.test = "no significance test (--test none): the limit alone decides"
    else:
        check.test = "fewer than 2 runs on a side: the limit alone decides"
    violated = rule.violated_by(change)
    significant = check.p_value is None or check.p_value <= alpha
    if violated and significant:
        check.status = "fail"
    elif violated:
        check.test += f" > alpha {alpha:g}: within noise"
    direction = "rose" if med_c > med_b else "fell" if med_c < med_b else "did not change"
    check.message = (f"{rule.figure} {direction} {abs(change):.3g}{rule.unit} from a median of "
                     f"{med_b:.6g} ({len(baseline)} run(s)) to {med_c:.6g} ({len(candidate)} run(s)); "
                     f"allowed {rule.allowed()}; {check.test}")
    return check


def _groups(records: list[RunRecord], match: tuple[str, ...]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(config_key(record, match), []).append(record)
    return groups


def _loadgen_differences(base: list[RunRecord], cand: list[RunRecord]) -> list[str]:
    a, b = base[0].loadgen_settings, cand[0].loadgen_settings
    return [f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def evaluate(baseline: list[RunRecord], candidate: list[RunRecord], rules: list[Rule], *,
             allow_different_systems: bool = False, test: str = "mannwhitney", alpha: float = DEFAULT_ALPHA,
             match: tuple[str, ...] = DEFAULT_MATCH) -> GateResult:
    """Apply every rule to every configuration both sides ran; failed candidate runs fail the gate."""
    if test not in TESTS and test != "none":
        raise UserError(f"--test: expected one of {', '.join([*TESTS, 'none'])}, got {test!r}")
    if not rules:
        raise UserError("--rule: give at least one rule, e.g. --rule offline.samples_per_second:-5%")
    warnings: list[str] = []
    checks: list[Check] = []
    dropped = [r.run_id for r in baseline if not r.is_ok]
    if dropped:
        warnings.append(f"baseline runs not ok, left out: {', '.join(dropped)}")
    baseline = [r for r in baseline if r.is_ok]
    if not baseline:
        raise UserError("--baseline: no successful run among the baseline runs")
    for record in candidate:
        if not record.is_ok:
            checks.append(Check(Rule("run status", "status", "-", 0, ""), config_key(record, match), "error",
                                message=f"candidate run {record.run_id} {record.status}: {record.error}"))
    candidate = [r for r in candidate if r.is_ok]
    _check_systems(baseline, candidate, allow_different_systems, warnings)
    base_groups, cand_groups = _groups(baseline, match), _groups(candidate, match)
    for config in sorted(set(cand_groups) - set(base_groups)):
        warnings.append(f"candidate configuration {config} has no baseline")
    for config in sorted(set(base_groups) & set(cand_groups)):
        differ = _loadgen_differences(base_groups[config], cand_groups[config])
        if differ:
            warnings.append(f"{config}: LoadGen settings differ between baseline and candidate: {'; '.join(differ)}")
    figures = {key: ([r.figures() for r in base_groups[key]], [r.figures() for r in runs])
               for key, runs in cand_groups.items() if key in base_groups}
    for rule in rules:
        matched = False
        for config in sorted(figures):
            b = [f[rule.figure] for f in figures[config][0] if rule.figure in f]
            c = [f[rule.figure] for f in figures[config][1] if rule.figure in f]
            if b and c:
                matched = True
                checks.append(_check(rule, config, b, c, test, alpha))
        if not matched:
            checks.append(Check(rule, "-", "missing", message=f"no configuration has {rule.figure} on both sides "
                                                              "(check the figure name and the runs' scenario and mode)"))
    return GateResult(checks, [r.run_id for r in baseline], [r.run_id for r in candidate], warnings,
                      comparability.fingerprint(baseline[0]))


def _check_systems(baseline: list[RunRecord], candidate: list[RunRecord], allow: bool,
                   warnings: list[str]) -> None:
    reference = baseline[0]
    for record in baseline[1:] + candidate:
        diffs = comparability.differences(reference, record)
        if not diffs:
            continue
        text = f"runs {reference.run_id} and {record.run_id} differ: {'; '.join(diffs)}"
        if not allow:
            raise UserError(f"refusing to compare: {text} (pass --allow-different-systems to compare anyway)")
        warnings.append(f"compared across systems: {text}")
