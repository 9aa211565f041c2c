"""``python -m harness conformance``: which contract clauses an implementation holds.

Runs a component's suite against ``--impl COMPONENT=SPEC`` in a child pytest and reports each clause
``held``, ``violated`` (core ones first) or ``not run``, or, for an engine adapter that declares it,
``documented away`` (the engine's documentation narrows the clause away: neither held nor violated), printed
and as Markdown and JSON; ``docs/graphs.md`` (Conformance) describes the report."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from harness import components, impls
from harness.conformance import clauses as _clauses
from harness.conformance import findings as _findings
from harness.conformance import plugin as _plugin
from harness.conformance import reach as _reach
from harness.devices import resolve
from harness.errors import HarnessError
from harness.plugin import child_runs

__all__ = ["ClauseResult", "ConformanceReport", "run_conformance", "build_report", "format_text",
           "format_markdown", "write_report", "documented_away"]

HELD, VIOLATED, NOT_RUN, NO_TEST, DOCUMENTED_AWAY = "held", "violated", "not run", "no test", "documented away"
# Every test of the clause that ran either passed or failed where the engine's documentation leaves it outside its
# contract (clauses.outside_contract): nothing is left to judge the clause by.
NOT_JUDGED = "not judged"


@dataclasses.dataclass
class ClauseResult:
    """One row: a clause and what its tests found."""

    clause: str
    tier: str
    summary: str
    verdict: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    first_failure: dict[str, str] | None = None  # nodeid, message, example, reproduce
    skip_reason: str = ""
    # Every failing test's failure, in collection order (first_failure is the first): fixing the first
    # is seldom the end of a violation.
    failures: list[dict[str, str]] = dataclasses.field(default_factory=list)
    # For a clause the engine documents away: its quote, where and note (clauses.DocumentedAway); the
    # counts above are its tests' outcomes, shown but not judged (first_failure stays None).
    documented: dict[str, str] | None = None
    # Failed tests that used the engine outside its documented contract (an adapter's outside_contract): not
    # counted in ``failed``, not judged; ``outside_of`` names the documented-away clauses they stepped into.
    outside: list[dict[str, str]] = dataclasses.field(default_factory=list)
    outside_of: list[str] = dataclasses.field(default_factory=list)
    # The stand-ins (for engine modules that cannot be imported here) that ``on_stand_ins`` of the counted tests
    # reached (clauses.rests_on_stand_in): the verdict rests on them as much as on the engine's code.
    stand_ins: list[str] = dataclasses.field(default_factory=list)
    on_stand_ins: int = 0
    # The worst severity among the findings counted against it (harness.conformance.findings); empty if none.
    severity: str = ""


@dataclasses.dataclass
class ConformanceReport:
    component: str
    spec: str
    kind: str
    engine: str
    device: str
    graph_backend: str
    environment: dict[str, str]
    command: str
    results: list[ClauseResult]
    unclassified: list[str]  # tests without a known clause
    stopped: str = ""  # why the suite did not run to its end (a time limit), or empty
    # Every failure grouped by cause, worst severity first (harness.conformance.findings).
    findings: list[_findings.Finding] = dataclasses.field(default_factory=list)
    # The implementation's own modules, and how much of each the run executed (harness.conformance.reach); or why
    # that was not measured.
    reach: list[_reach.ModuleReach] = dataclasses.field(default_factory=list)
    reach_note: str = ""

    def violations(self, tier: str) -> list[ClauseResult]:
        return [r for r in self.results if r.tier == tier and r.verdict == VIOLATED]

    @property
    def ok(self) -> bool:
        return not any(r.verdict == VIOLATED for r in self.results) and not self.unclassified and not self.stopped

    def documented_away(self, tier: str | None = None) -> list[ClauseResult]:
        return [r for r in self.results if r.verdict == DOCUMENTED_AWAY and tier in (None, r.tier)]

    def headline(self, tier: str) -> str:
        violated = self.violations(tier)
        away = self.documented_away(tier)
        away_part = f"; documented away by the engine: {', '.join(r.clause for r in away)}" if away else ""
        if violated:
            consequence = ""
            if tier == _clauses.CORE:  # a core clause promises right results; say whether a test saw wrong ones
                wrong_values = any(r.severity == _findings.WRONG_VALUES for r in violated)
                consequence = " (results can be wrong)" if wrong_values else " (no test saw wrong values)"
            clauses = ", ".join(f"{r.clause} ({r.severity})" if r.severity else r.clause for r in violated)
            return f"{tier}: VIOLATED{consequence}: {clauses}{away_part}"
        not_run = [r for r in self.results if r.tier == tier and r.verdict in (NOT_RUN, NO_TEST, NOT_JUDGED)]
        held = sum(r.tier == tier and r.verdict == HELD for r in self.results)
        line = f"{tier}: all held ({held} clauses){away_part}"
        if not_run:
            line += "; not run here: " + "; ".join(f"{r.clause} ({r.skip_reason or r.verdict})" for r in not_run)
        return line

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["summary"] = {"core": self.headline(_clauses.CORE), "strict": self.headline(_clauses.STRICT),
                               "core_violations": [r.clause for r in self.violations(_clauses.CORE)],
                               "strict_violations": [r.clause for r in self.violations(_clauses.STRICT)],
                               "documented_away": [r.clause for r in self.documented_away()]}
        return document


def _environment(device: torch.device) -> dict[str, str]:
    environment = {"python": sys.version.split()[0], "torch": torch.__version__}
    if device.type == "cuda":
        environment["gpu"] = torch.cuda.get_device_name(device)
        environment["cuda"] = str(torch.version.cuda)
    try:
        import triton

        environment["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional; its absence is not an error here
        pass
    return environment


def _engine(component: str, spec: str) -> str:
    """For an engine adapter, the engine and its version (``SGLang 0.5.23``); empty otherwise."""
    module = components.get_component(component).adapter_module(spec)
    if module is None:
        return ""
    version = getattr(module, "engine_version", lambda: "unknown")()
    return f"{spec} {version}"


def documented_away(component: str, spec: str) -> tuple[_clauses.DocumentedAway, ...]:
    """The clauses of ``component`` that an engine adapter declares its engine documents away (its module's
    ``DOCUMENTED_AWAY``, by component); none for anything but an adapter."""
    module = components.get_component(component).adapter_module(spec)
    return () if module is None else tuple(getattr(module, "DOCUMENTED_AWAY", {}).get(component, ()))


def run_conformance(*, component: str, spec: str, device: str = "auto", graph_backend: str = "auto",
                    root: Path, jobs: int = 1, hypothesis_profile: str = "ci",
                    extra_args: list[str] | None = None, time_limit: float | None = None,
                    test_order: str = "collected") -> ConformanceReport:
    """Run ``component``'s suite against ``spec`` in a child pytest process and build the report.

    Each test gets what the suite otherwise shares between tests of its own (a captured runner:
    :class:`~harness.conformance.plugin.PerTestInConformance`), so no verdict depends on which tests ran before;
    ``test_order`` ``reversed`` runs them in reverse, to show it.

    Past ``time_limit`` seconds the suite is stopped and the report says so: what finished is
    reported, the rest is not run (an engine's failures can make a suite much slower than the
    reference's: every failure is a traceback, every failing property a search)."""
    row = components.get_component(component)
    clause_table = _clauses.clauses_of(component)
    placement = resolve(device=device, graph_backend=graph_backend)
    resolved, backend = placement.device, placement.graph_backend
    implementation = impls.load(component, spec, graph_backend=backend)  # a bad spec: one line, before pytest
    with tempfile.TemporaryDirectory() as scratch:
        record_path, report_log = Path(scratch) / "collected.jsonl", Path(scratch) / "reports.jsonl"
        command = child_runs.pytest_command(
            [root / row.suite], root=root, plugin="harness.conformance.plugin", report_log=report_log,
            arguments=[f"--impl={component}={spec}", f"--device={resolved.type}", f"--graph-backend={backend}",
                       f"--hypothesis-profile={hypothesis_profile}", *(extra_args or []),
                       *([f"--numprocesses={jobs}"] if jobs > 1 else [])])
        environment = dict(child_runs.child_environment(), HARNESS_CONFORMANCE_RECORD=str(record_path))
        environment[_plugin.ORDER_VARIABLE] = test_order
        reach_modules = _reach.modules_of(component, spec)
        reach_note = (_reach.unavailable() if reach_modules
                      else f"no modules of {spec} are named for the {component} component")
        reach_data = Path(scratch) / "reach"
        if reach_modules and not reach_note:
            reach_data.mkdir()
            environment[_reach.REACH_VARIABLE] = json.dumps({"modules": reach_modules, "data": str(reach_data)})
        finished = child_runs.run(command, cwd=root, environment=environment, time_limit=time_limit)
        returncode, output = finished.returncode, finished.output
        records = child_runs.read_report_log(record_path) + [
            _record(entry) for entry in child_runs.phase_reports(child_runs.read_report_log(report_log))]
        reached = _reach.measure(reach_data, reach_modules) if reach_data.is_dir() else []
        if not reach_note and not reached:
            reach_note = f"none of {', '.join(reach_modules)} was executed"
    for record in records:
        if record.get("reproduce"):
            record["reproduce"] = _portable(record["reproduce"], root)
    stopped = returncode is None
    if (not stopped and returncode not in (0, 1)) or not any("nodeid" in r for r in records):
        raise HarnessError(f"the suite did not run (pytest exit {returncode}): "
                           + " | ".join(child_runs.why_it_did_not_run(output, last=3)))
    # the suite by its package name, as a wheel and a checkout's editable install both have it
    display = " ".join(["pytest", "--pyargs", "harness." + row.suite.replace("/", "."),
                        "--impl", f"{component}={spec}", "--device", resolved.type, "--graph-backend", backend,
                        "--hypothesis-profile", hypothesis_profile])
    report = build_report(records, clause_table, component=component, spec=spec, kind=implementation.kind,
                          engine=_engine(component, spec), device=resolved.type, graph_backend=backend,
                          environment=_environment(resolved), command=display,
                          documented_away=documented_away(component, spec))
    report.reach, report.reach_note = reached, reach_note
    if stopped:
        report.stopped = (f"stopped at the time limit of {time_limit:.0f} s: tests that had not finished count as "
                          "not run")
    return report


def _portable(command: str, root: Path) -> str:
    """A reproduce line as a reader of a committed report runs it, with nothing of this machine in it.

    - the test as ``--pyargs harness.suites.COMPONENT.MODULE::TEST``, a name that exists wherever the suites are
      installed (a wheel's ``site-packages/harness/suites``, a checkout's editable install), without ``--rootdir``
      (a checkout's pytest settings come from the ini file above the suite, a wheel has none);
    - the interpreter as ``python``, whichever path it ran from (``/opt/torch/.venv/bin/python3``);
    - ``PYTHONPATH`` with the entries inside the checkout only, relative to it (``.sglang:.``; run from the
      checkout) and each once: entries elsewhere are this machine's site folders (a virtual environment,
      carried wheels in ``/tmp/gpu-site``) or modules, which the reader's own environment provides; so the
      reader's own ``PYTHONPATH`` is kept after them (a GPU job that carries its wheels there still finds them).

    Other words are kept, with the checkout's path made ``.``; a line that is not a shell command line is
    only given that replacement and the interpreter's."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = []
    if "-m" not in words[1:] or words[words.index("-m") + 1: words.index("-m") + 2] != ["pytest"]:
        command = re.sub(rf"(?<![\w/.-]){re.escape(sys.executable)}(?=\s)", "python", command)
        return re.sub(rf"(?<![\w/.-]){re.escape(str(root))}(?=[/:\s'\"]|$)", ".", command)
    interpreter = words.index("-m") - 1
    assignments, arguments = words[:interpreter], words[interpreter + 3:]
    prefix = []
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        if name == "PYTHONPATH":
            inside = [_relative(Path(entry), root) for entry in value.split(os.pathsep) if entry]
            kept = list(dict.fromkeys(entry for entry in inside if entry is not None))
            if kept:
                prefix.append(f"PYTHONPATH={shlex.quote(os.pathsep.join(kept))}${{PYTHONPATH:+:$PYTHONPATH}}")
        else:
            prefix.append(shlex.quote(assignment))
    portable: list[str] = []
    skip = False
    for word in arguments:
        if skip:
            skip = False
        elif word == "--rootdir":
            skip = True
        elif word.startswith("--rootdir="):
            pass
        else:
            portable += _portable_argument(word, root)
    return " ".join([*prefix, shlex.join(["python", "-m", "pytest", *portable])])


def _relative(path: Path, root: Path) -> str | None:
    """``path`` relative to the checkout ``root`` (``.`` for the root itself), None outside it."""
    if not path.is_absolute() or not path.is_relative_to(root):
        return None
    return os.path.relpath(path, root)


def _portable_argument(word: str, root: Path) -> list[str]:
    """A test of the suites as ``--pyargs`` and its node id; another word with the checkout's path made ``.``."""
    path, separator, rest = word.partition("::")
    relative = _relative(Path(path), root)
    if relative is not None and relative.startswith("suites/") and relative.endswith(".py"):
        module = "harness." + relative.removesuffix(".py").replace("/", ".")
        return ["--pyargs", f"{module}{separator}{rest}"]
    return [re.sub(rf"(?<![\w/.-]){re.escape(str(root))}(?=[/:=]|$)", ".", word)]


def _record(report: dict[str, Any]) -> dict[str, Any]:
    """One test phase of the report log as :func:`build_report` reads it: node id, phase, outcome, and the
    user properties the conformance plugin gave it (clause; a failure's message, example and reproduce
    line; a skip's reason)."""
    properties = dict(report.get("user_properties") or [])
    return {"nodeid": report["nodeid"], "when": report["when"], "outcome": report["outcome"], **properties,
            "clause": properties.get("clause")}


def build_report(records: list[dict[str, Any]], clause_table: tuple[_clauses.Clause, ...], *,
                 documented_away: tuple[_clauses.DocumentedAway, ...] = (), **fields: Any) -> ConformanceReport:
    """Fold the plugin's per-phase records into one row per clause (a test fails if any phase failed).

    A clause in ``documented_away`` gets the verdict ``documented away`` whatever its tests found: their
    counts and failures are kept, ``first_failure`` is not set. A failed test of another clause whose records
    say it stepped outside one of those clauses (``outside_contract``) is listed in ``outside``, not counted
    against its clause; a clause left with no other test that ran is ``not judged``. A clause whose counted tests
    reached stand-ins (``rests_on_stand_in``) names them in ``stand_ins``. Naming a clause the table
    lacks is a :class:`HarnessError` (a misspelt id would otherwise judge the clause after all)."""
    away = {entry.clause: entry for entry in documented_away}
    unknown = sorted(set(away) - {clause.id for clause in clause_table})
    if unknown:
        raise HarnessError(f"documented away: {', '.join(unknown)} is not a clause of this component "
                           f"({', '.join(clause.id for clause in clause_table)})")
    outcomes: dict[str, dict[str, Any]] = {}
    for record in records:
        if "collected" in record:
            outcomes.setdefault(record["collected"], {"clause": record["clause"], "outcome": "not run"})
            continue
        test = outcomes.setdefault(record["nodeid"], {"clause": record["clause"], "outcome": "not run"})
        test.setdefault("outside", set()).update(record.get("outside_contract") or ())
        test.setdefault("stand_ins", set()).update(record.get("stand_ins") or ())
        if record["outcome"] == "failed":
            if test["outcome"] != "failed":
                test.update(outcome="failed", failure={"nodeid": record["nodeid"], "when": record["when"],
                                                       **{k: record.get(k, "") for k in
                                                          ("message", "example", "reproduce")}})
        elif record["outcome"] == "skipped" and test["outcome"] != "failed":
            test.update(outcome="skipped", reason=record.get("reason", ""))
        elif record["when"] == "call" and test["outcome"] == "not run":
            test["outcome"] = "passed"
    known = {clause.id for clause in clause_table}
    results = []
    for clause in clause_table:
        tests = [t for t in outcomes.values() if t["clause"] == clause.id]
        outside = [] if clause.id in away else [
            t for t in tests if t["outcome"] == "failed" and t.get("outside", set()) & away.keys()]
        tests = [t for t in tests if t not in outside]
        result = ClauseResult(clause.id, clause.tier, clause.summary, NO_TEST,
                              passed=sum(t["outcome"] == "passed" for t in tests),
                              failed=sum(t["outcome"] == "failed" for t in tests),
                              skipped=sum(t["outcome"] == "skipped" for t in tests))
        if clause.id in away:
            result.verdict = DOCUMENTED_AWAY
            result.documented = dataclasses.asdict(away[clause.id])
            result.failures = [t["failure"] for t in tests if t["outcome"] == "failed"]
        elif result.failed:
            result.verdict = VIOLATED
            result.failures = [t["failure"] for t in tests if t["outcome"] == "failed"]
            result.first_failure = result.failures[0]
        elif result.passed:
            result.verdict = HELD
        elif outside:
            result.verdict = NOT_JUDGED
            result.skip_reason = (f"its {len(outside)} failing tests used the engine outside its documented "
                                  f"contract, and no other test of it ran")
        elif result.skipped:
            result.verdict = NOT_RUN
            result.skip_reason = _short(next(t.get("reason", "") for t in tests if t["outcome"] == "skipped"))
        on_stand_ins = [t for t in tests if t.get("stand_ins") and t["outcome"] in ("passed", "failed")]
        result.on_stand_ins = len(on_stand_ins)
        result.stand_ins = sorted(set().union(*(t["stand_ins"] for t in on_stand_ins)))
        if outside:
            result.outside = [t["failure"] for t in outside]
            result.outside_of = sorted(set().union(*(t["outside"] & away.keys() for t in outside)))
        results.append(result)
    # Core first, then strict; the table's order within each tier.
    results.sort(key=lambda r: r.tier != _clauses.CORE)
    findings = _findings.group_findings(
        [(r.clause, failure, False) for r in results if r.verdict == VIOLATED for failure in r.failures]
        + [(r.clause, failure, True) for r in results for failure in r.outside])
    for result in results:
        if result.verdict == VIOLATED:
            result.severity = _findings.worst(f.severity for f in findings if result.clause in f.clauses
                                              and f.severity != _findings.OUTSIDE)
    unclassified = sorted(nodeid for nodeid, t in outcomes.items() if t["clause"] not in known)
    return ConformanceReport(results=results, unclassified=unclassified, findings=findings, **fields)


def _short(text: str, limit: int = 160) -> str:
    text = re.sub(r"^Skipped: ", "", " ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(failure: dict[str, str]) -> str:
    lines = [line for line in failure.get("message", "").splitlines() if line.strip()]
    return _short(lines[0] if lines else "(no message)")


def _test_name(nodeid: str) -> str:
    return nodeid.rpartition("/")[2]


def _title(report: ConformanceReport) -> str:
    what = f"{report.component}={report.spec}" + (f" ({report.engine})" if report.engine else "")
    return f"Conformance of {what}, graph backend {report.graph_backend}, device {report.device}"


def _tests_passed(result: ClauseResult) -> str:
    judged = f"{result.passed}/{result.passed + result.failed + result.skipped}"
    return f"{judged} (+{len(result.outside)} outside the contract)" if result.outside else judged


def _stand_ins(result: ClauseResult, *, code: str = "") -> str:
    """Which stand-ins a clause's verdict rests on, and how many of its counted tests reached them."""
    return (f"{code}{result.clause}{code} ({result.on_stand_ins} of {result.passed + result.failed} tests): "
            + "; ".join(result.stand_ins))


def _example(result: ClauseResult, *, code: str = "") -> str:
    """The first falsifying example (its test name quoted with ``code``), why the clause did not run, or the
    engine's sentence that documents it away."""
    if result.documented:
        return _short(f"the engine's documentation: \"{result.documented['quote']}\"")
    if result.first_failure:
        return f"{code}{_test_name(result.first_failure['nodeid'])}{code}: {_first_line(result.first_failure)}"
    return result.skip_reason if result.verdict in (NOT_RUN, NOT_JUDGED) else ""


def format_text(report: ConformanceReport) -> str:
    """The report for a terminal: the two headlines, then one row per clause."""
    lines = [_title(report), report.headline(_clauses.CORE), report.headline(_clauses.STRICT)]
    lines += [f"INCOMPLETE: {report.stopped}", ""] if report.stopped else [""]
    for number, finding in enumerate(report.findings, 1):
        lines.append(f"F{number} [{finding.severity}] {finding.cause} ({len(finding.tests)} tests: "
                     + ", ".join(f"{clause} {count}" for clause, count in finding.clauses.items()) + ")")
    lines += [""] if report.findings else []
    rows = [("tier", "clause", "verdict", "tests", "first falsifying example")]
    for r in report.results:
        rows.append((r.tier, r.clause, r.verdict, _tests_passed(r), _example(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4])
    for r in report.documented_away():
        documented = r.documented or {}
        lines.append(f"\ndocumented away {r.clause}: \"{documented.get('quote', '')}\" ({documented.get('where', '')})"
                     + (f"; {documented['note']}" if documented.get("note") else ""))
    for r in report.results:
        if r.stand_ins:
            lines.append(f"\nrests on stand-ins: {_stand_ins(r)}")
    if report.unclassified:
        lines.append(f"\n{len(report.unclassified)} tests name no clause of {report.component} "
                     f"(harness/conformance/clauses.py): " + ", ".join(report.unclassified[:5]))
    for r in report.results:
        if r.first_failure and r.first_failure.get("reproduce"):
            lines.append(f"\nreproduce {r.clause}: {r.first_failure['reproduce']}")
    lines.append("")
    lines += [f"reach {m.module}: lines {m.lines_reached}/{m.lines}, branches {m.branches_reached}/{m.branches}"
              for m in report.reach] or [f"reach: not measured ({report.reach_note})"]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(report: ConformanceReport) -> str:
    """The report as Markdown, to paste into a pull request or a CI step summary."""
    out = [f"## {_title(report)}", "", f"- **{report.headline(_clauses.CORE)}**",
           f"- {report.headline(_clauses.STRICT)}",
           *([f"- **incomplete**: {report.stopped}"] if report.stopped else []),
           "",
           "Tiers: **core**: " + _clauses.TIERS[_clauses.CORE] + "; **strict**: " + _clauses.TIERS[_clauses.STRICT]
           + ".", ""]
    if report.findings:
        out += _findings_markdown(report.findings)
    out += ["| tier | clause | verdict | tests passed | first falsifying example |", "| --- | --- | --- | --- | --- |"]
    for r in report.results:
        verdict = f"**{r.verdict}**" if r.verdict == VIOLATED else r.verdict
        verdict += f": {r.severity}" if r.severity else ""  # set on violated clauses only
        verdict += " (rests on stand-ins)" if r.stand_ins else ""
        out.append(f"| {r.tier} | `{r.clause}` | {verdict} | {_tests_passed(r)} | {_cell(_example(r, code='`'))} |")
    away = report.documented_away()
    if away:
        out += ["", "### Documented away by the engine", "",
                "Neither held nor violated: the engine's own documentation narrows these clauses away. Their tests "
                "ran; their outcomes are shown, not judged."]
    for r in away:
        documented = r.documented or {}
        out += ["", f"#### `{r.clause}` ({r.tier}): {r.summary}", "", f"> {documented.get('quote', '')}", "",
                f"{documented.get('where', '')}." + (f" {documented['note']}" if documented.get("note") else ""),
                "", f"Its tests: {r.passed} passed, {r.failed} failed, {r.skipped} skipped."]
    on_stand_ins = [r for r in report.results if r.stand_ins]
    if on_stand_ins:
        out += ["", "### Verdicts that rest on stand-ins", "",
                "These clauses' tests reached stand-ins for engine modules that cannot be imported here (each "
                "stand-in's docstring says what it replaces and how it differs): their verdicts rest on the "
                "stand-ins as much as on the engine's code.", ""]
        out += [f"- {_stand_ins(r, code='`')}" for r in on_stand_ins]
    outside = [r for r in report.results if r.outside]
    if outside:
        out += ["", "### Failed outside the engine's documented contract", "",
                "These tests used the engine where its own documentation leaves it outside its contract (the "
                "adapter says so as they run) and failed: they are not counted against their clause, which is "
                "judged by its other tests. A failure among them may have another cause as well."]
    for r in outside:
        out += ["", f"#### `{r.clause}` ({r.tier}): {len(r.outside)} tests outside "
                + ", ".join(f"`{name}`" for name in r.outside_of), ""]
        out += [f"- `{_test_name(other['nodeid'])}`: {_cell(_first_line(other))}" for other in r.outside]
    violated = [r for r in report.results if r.first_failure]
    if violated:
        out += ["", "### Violations"]
    for r in violated:
        failure = r.first_failure or {}
        out += ["", f"#### `{r.clause}` ({r.tier}): {r.summary}", "",
                f"{r.failed} of {r.passed + r.failed + r.skipped} tests failed; the first: `{failure['nodeid']}`"
                + (f" (in {failure['when']})" if failure.get("when") not in (None, "call") else ""), "",
                "```", failure.get("message", "").strip()[:2000], "```"]
        if failure.get("example"):
            out += ["", "```", failure["example"][:2000], "```"]
        if failure.get("reproduce"):
            out += ["", "```bash", failure["reproduce"], "```"]
        if len(r.failures) > 1:
            out += ["", f"Every failing test of `{r.clause}`:", ""]
            out += [f"- `{_test_name(other['nodeid'])}`: {_cell(_first_line(other))}" for other in r.failures]
    out += _reach_markdown(report)
    if report.unclassified:
        out += ["", f"{len(report.unclassified)} tests name no clause of {report.component}: "
                + ", ".join(f"`{n}`" for n in report.unclassified[:10])]
    environment = ", ".join(f"{key} {value}" for key, value in report.environment.items())
    out += ["", f"Run: `{report.command}` ({environment}; implementation kind: {report.kind})."]
    return "\n".join(out) + "\n"


def _findings_markdown(findings: list[_findings.Finding]) -> list[str]:
    """The findings section: one numbered row per cause, then each one's first failure's reproduce line."""
    out = ["### Findings by cause", "",
           "Each cause once, worst first: what differed from eager, or what was raised instead of a result. A test "
           "may show several causes; a clause's verdict below is the worst cause counted against it.", "",
           "| # | severity | cause | tests | clauses (tests) |", "| --- | --- | --- | --- | --- |"]
    for number, finding in enumerate(findings, 1):
        clauses = ", ".join(f"`{clause}` ({count})" for clause, count in finding.clauses.items())
        out.append(f"| F{number} | {finding.severity} | {_cell(finding.cause)} | {len(finding.tests)} | {clauses} |")
    reproducible = [(number, f) for number, f in enumerate(findings, 1) if f.first.get("reproduce")]
    if reproducible:
        out += ["", "Reproduce each finding (its first failing test):", ""]
        out += [f"- F{number} `{_test_name(f.first['nodeid'])}`: `{f.first['reproduce']}`"
                for number, f in reproducible]
    return out + [""]


def _reach_markdown(report: ConformanceReport) -> list[str]:
    """The reach section: per module, the lines and branches the run executed, and each function's unreached lines."""
    out = ["", "### Reach", ""]
    if not report.reach:
        return out + [f"Not measured: {report.reach_note}."]
    out += ["The lines and branches of the functions and methods of the implementation's own modules that the suite "
            "executed (coverage.py, every pytest process of the run). A line no test reached is a line no verdict "
            "above speaks for.", "",
            "| module | lines reached | branches reached |", "| --- | --- | --- |"]
    out += [f"| `{m.module}` | {m.lines_reached}/{m.lines} | {m.branches_reached}/{m.branches} |" for m in report.reach]
    for module in report.reach:
        if module.unreached:
            out += ["", f"Unreached in `{module.file}`, by function:", ""]
            out += [f"- `{name}`: lines {_line_ranges(lines)}"
                    for name, lines in module.unreached.items()]
    return out


def _line_ranges(lines: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``."""
    ranges: list[list[int]] = []
    for line in sorted(lines):
        if ranges and line == ranges[-1][1] + 1:
            ranges[-1][1] = line
        else:
            ranges.append([line, line])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def write_report(report: ConformanceReport, folder: str | Path) -> tuple[Path, Path]:
    """Write ``conformance-COMPONENT-SPEC.md`` and ``.json`` into ``folder``; returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"conformance-{report.component}-{_slug(report.spec)}"
    markdown, document = folder / f"{stem}.md", folder / f"{stem}.json"
    markdown.write_text(format_markdown(report))
    document.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return markdown, document
