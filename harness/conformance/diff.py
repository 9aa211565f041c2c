"""What changed between two conformance reports of one component: clause by clause, test by test, finding by finding.

Read from the JSON that ``python -m harness conformance`` writes. The wording is a release note's: which clauses the
newer report newly violates, which it fixed, which tests newly fail or no longer do, and which findings are new or
gone. The same comparison proves two recordings order-free (``--expect-identical``: any change is a failure)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import UsageError

__all__ = ["ReportDiff", "diff_reports", "format_diff", "load_report"]

_COUNTS = ("passed", "failed", "skipped")


@dataclasses.dataclass
class ReportDiff:
    """The changes from ``old`` to ``new``; :attr:`identical` when there are none."""

    old: str
    new: str
    newly_violated: list[str] = dataclasses.field(default_factory=list)
    fixed: list[str] = dataclasses.field(default_factory=list)
    verdicts: list[str] = dataclasses.field(default_factory=list)  # other verdict changes, as "clause: a -> b"
    counts: list[str] = dataclasses.field(default_factory=list)  # "clause: passed/failed/skipped a/b/c -> d/e/f"
    newly_failing: list[str] = dataclasses.field(default_factory=list)  # "clause: node id"
    no_longer_failing: list[str] = dataclasses.field(default_factory=list)
    new_findings: list[str] = dataclasses.field(default_factory=list)  # "severity: cause (N tests)"
    gone_findings: list[str] = dataclasses.field(default_factory=list)
    findings_changed: list[str] = dataclasses.field(default_factory=list)  # same cause, other severity or tests

    @property
    def identical(self) -> bool:
        return not any(getattr(self, field.name) for field in dataclasses.fields(self)
                       if field.name not in ("old", "new"))


def load_report(path: str | Path) -> dict[str, Any]:
    """A report's JSON, or one line saying why it is not one."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: not a conformance report's JSON ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise UsageError(f"{path}: not a conformance report's JSON (no 'results' list; write one with "
                         "python -m harness conformance)")
    return document


def _name(report: Mapping[str, Any]) -> str:
    engine = report.get("engine") or ""
    return f"{report.get('component')}={report.get('spec')}" + (f" ({engine})" if engine else "")


def _failing(result: Mapping[str, Any]) -> set[str]:
    return {failure["nodeid"] for failure in result.get("failures") or ()}


def _findings(report: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {finding["cause"]: finding for finding in report.get("findings") or ()}


def _finding_line(finding: Mapping[str, Any]) -> str:
    tests = len(finding.get("tests") or ())
    return f"{finding.get('severity')}: {finding['cause']} ({tests} test{'s' if tests != 1 else ''})"


def diff_reports(old: Mapping[str, Any], new: Mapping[str, Any]) -> ReportDiff:
    """The changes from ``old`` to ``new`` (each a report's JSON). Clauses and findings are matched by name and
    cause; a clause in one report only counts as a verdict change from or to ``absent``."""
    if old.get("component") != new.get("component"):
        raise UsageError(f"the reports judge different components ({old.get('component')} and "
                         f"{new.get('component')}): compare reports of one component")
    diff = ReportDiff(_name(old), _name(new))
    before = {result["clause"]: result for result in old["results"]}
    after = {result["clause"]: result for result in new["results"]}
    for clause in [*before, *(name for name in after if name not in before)]:
        was, now = before.get(clause, {}), after.get(clause, {})
        verdict_was, verdict_now = was.get("verdict", "absent"), now.get("verdict", "absent")
        if verdict_was != verdict_now:
            if verdict_now == "violated":
                diff.newly_violated.append(f"{clause} (was {verdict_was})")
            elif verdict_was == "violated" and verdict_now == "held":
                diff.fixed.append(clause)
            else:
                diff.verdicts.append(f"{clause}: {verdict_was} -> {verdict_now}")
        counts_was = [was.get(count, 0) for count in _COUNTS]
        counts_now = [now.get(count, 0) for count in _COUNTS]
        if counts_was != counts_now and was and now:
            diff.counts.append(f"{clause}: passed/failed/skipped {'/'.join(map(str, counts_was))} -> "
                               f"{'/'.join(map(str, counts_now))}")
        diff.newly_failing += [f"{clause}: {test}" for test in sorted(_failing(now) - _failing(was))]
        diff.no_longer_failing += [f"{clause}: {test}" for test in sorted(_failing(was) - _failing(now))]
    found_before, found_after = _findings(old), _findings(new)
    diff.new_findings = [_finding_line(found_after[cause]) for cause in found_after if cause not in found_before]
    diff.gone_findings = [_finding_line(found_before[cause]) for cause in found_before if cause not in found_after]
    for cause in found_before.keys() & found_after.keys():
        was, now = found_before[cause], found_after[cause]
        if was.get("severity") != now.get("severity") or sorted(was.get("tests") or ()) != sorted(
                now.get("tests") or ()):
            diff.findings_changed.append(f"{_finding_line(was)} -> {_finding_line(now)}")
    diff.findings_changed.sort()
    return diff


def format_diff(diff: ReportDiff) -> str:
    """The changes as a release note's lines (Markdown), or one line saying there are none."""
    if diff.identical:
        return f"{diff.new} against {diff.old}: identical verdicts, counts, failing tests and findings"
    sections = (("Newly violated", diff.newly_violated), ("Fixed", diff.fixed),
                ("Other verdict changes", diff.verdicts), ("New findings", diff.new_findings),
                ("Findings gone", diff.gone_findings),
                ("Findings with other tests or severity", diff.findings_changed),
                ("Tests that newly fail", diff.newly_failing), ("Tests that no longer fail", diff.no_longer_failing),
                ("Test counts", diff.counts))
    lines = [f"## {diff.new} against {diff.old}"]
    for title, entries in sections:
        if entries:
            lines += ["", f"{title} ({len(entries)}):", *(f"- {entry}" for entry in entries)]
    return "\n".join(lines)
