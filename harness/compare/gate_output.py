"""A gate's verdict as Markdown (CI job summaries, PR comments) and JUnit XML (CI test reports)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from mlharness.compare.gate import Check, GateResult

_ICON = {"pass": "✅", "fail": "❌", "missing": "⚠️", "error": "❌"}


def _values(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    median = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    return f"{median:.6g} (n={len(values)})"


def _change(check: Check) -> str:
    return "-" if check.change is None else f"{check.change:+.3g}{check.rule.unit}"


def markdown(result: GateResult) -> str:
    failed = [c for c in result.checks if c.failed]
    verdict = "✅ PASS" if result.passed else f"❌ FAIL ({len(failed)} of {len(result.checks)} checks)"
    system = ", ".join(f"{k.split('.', 1)[1]} {v}" for k, v in result.system.items() if v not in (None, [], ""))
    lines = [f"## mlharness gate: {verdict}", "",
             f"Baseline: {len(result.baseline_ids)} run(s) ({', '.join(result.baseline_ids)}); "
             f"candidate: {len(result.candidate_ids)} run(s) ({', '.join(result.candidate_ids)}).", "",
             f"System: {system}", "",
             "| | rule | configuration | baseline median | candidate median | change | allowed | test |",
             "|---|---|---|---|---|---|---|---|"]
    for check in result.checks:
        lines.append(f"| {_ICON[check.status]} | `{check.rule.text}` | {check.config} | {_values(check.baseline)} | "
                     f"{_values(check.candidate)} | {_change(check)} | {check.rule.allowed()} | {check.test or '-'} |")
    if failed:
        lines += ["", "### What failed", ""]
        lines += [f"- **{c.rule.text}** on {c.config}: {c.message}" for c in failed]
    if result.warnings:
        lines += ["", "### Notes", ""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def junit_xml(result: GateResult) -> str:
    failures = sum(1 for c in result.checks if c.status in ("fail", "missing"))
    errors = sum(1 for c in result.checks if c.status == "error")
    suites = ET.Element("testsuites", name="mlharness gate", tests=str(len(result.checks)),
                        failures=str(failures), errors=str(errors))
    suite = ET.SubElement(suites, "testsuite", name="mlharness-gate", tests=str(len(result.checks)),
                          failures=str(failures), errors=str(errors))
    for check in result.checks:
        case = ET.SubElement(suite, "testcase", classname=f"mlharness.gate.{check.config}", name=check.rule.text)
        if check.status == "pass":
            ET.SubElement(case, "system-out").text = check.message
        else:
            tag = "error" if check.status == "error" else "failure"
            ET.SubElement(case, tag, message=check.message, type=check.status).text = check.message
    if result.warnings:
        ET.SubElement(suite, "system-err").text = "\n".join(result.warnings)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
