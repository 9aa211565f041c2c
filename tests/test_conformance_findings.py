"""Findings by cause: one finding per cause whatever the number of tests and clauses, severities from what the caller
got, and the report's wording that follows from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import conformance
from harness.conformance import findings
from harness.conformance.clauses import CORE, Clause
from harness.graphs import _seam

MODULE_STATE = ('MismatchError("runner: observably different from eager (harness.oracle):\\n  module state: the call '
                'changed module 0.model instance forward, which eager leaves as it was\\n  implementations: '
                '{\'runner\': \'x\'}\\n  backend: cuda") [single exception in FlakyFailure]')
VALUES = ("harness.errors.MismatchError: runner: observably different from eager (harness.oracle):\n"
          "  values: tensors differ at .next_token_logits (rtol=1e-05, atol=1e-05): 96 / 96 elements mismatch "
          "(100.0%); greatest absolute difference 2.3 at index (0, 20)\n"
          "    tensors differ at .hidden_states (rtol=1e-05, atol=1e-05): 4 / 8 elements mismatch (50.0%)\n"
          "  module state: the call changed module 1.model instance forward, which eager leaves as it was\n"
          "  implementations: {'runner': 'x'}\n  seed: 3")


def test_causes_are_read_from_the_checkers_facts_and_from_what_was_raised():
    assert findings.causes_of(MODULE_STATE) == [
        (findings.WRONG_STATE, "module state: the call changed module N.model instance forward, which eager leaves "
                               "as it was")]
    # every fact of the call, the continuation line folded into its fact, numbers left out
    assert findings.causes_of(VALUES) == [
        (findings.WRONG_VALUES, "values: tensors differ at .next_token_logits"),
        (findings.WRONG_STATE, "module state: the call changed module N.model instance forward, which eager leaves "
                               "as it was")]
    assert findings.causes_of("Failed: DID NOT RAISE <class 'harness.errors.ReplayError'>") == [
        (findings.WRONG_STATE, "went on where <class 'harness.errors.ReplayError'> had to be raised")]
    assert findings.causes_of("harness.errors.GraphHazardError: replay reads a tensor of shape (4, 16) that was "
                              "released")[0][0] == findings.HAZARD
    assert findings.causes_of("AssertionError (raised at engine/runner.py:2328)") == [
        (findings.LOUD_REFUSAL, "AssertionError raised at engine/runner.py:2328")]
    # which class's forward lacks which keyword is one cause: the engine's call form
    assert (findings.causes_of("TypeError: A.forward() missing 1 required keyword-only argument: 'residual'")
            == findings.causes_of("TypeError: B.forward() missing 1 required keyword-only argument: 'token_slots'"))
    assert findings.causes_of("") == [(findings.LOUD_REFUSAL, "failed without a message")]


def test_one_cause_is_one_finding_across_tests_and_clauses_worst_first():
    failures = [("replay", {"nodeid": "t::a", "message": MODULE_STATE, "reproduce": "pytest a"}, False),
                ("no-grad", {"nodeid": "t::b", "message": MODULE_STATE}, False),
                ("replay", {"nodeid": "t::c", "message": VALUES}, False),
                ("discovery", {"nodeid": "t::d", "message": "DiscoveryRefused: no layers"}, True)]
    grouped = findings.group_findings(failures)
    assert [(f.severity, len(f.tests), f.clauses) for f in grouped] == [
        (findings.WRONG_VALUES, 1, {"replay": 1}),
        (findings.WRONG_STATE, 3, {"replay": 2, "no-grad": 1}),
        (findings.OUTSIDE, 1, {"discovery": 1})]
    assert grouped[1].first["reproduce"] == "pytest a" and grouped[1].tests == ["t::a", "t::b", "t::c"]
    assert findings.worst([findings.LOUD_REFUSAL, findings.WRONG_STATE]) == findings.WRONG_STATE
    assert findings.worst([]) == ""


pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
TABLE = (Clause("toy", "replay", CORE, "replay equals eager"), Clause("toy", "no-grad", CORE, "no grad"))


def _failed(n: int, clause: str, message: str) -> list[dict]:
    nodeid = f"suites/toy/test_a.py::test_{n}"
    return [{"collected": nodeid, "clause": clause},
            {"nodeid": nodeid, "when": "call", "outcome": "failed", "clause": clause, "message": message,
             "example": "", "reproduce": f"pytest {n}"}]


def test_results_can_be_wrong_only_where_a_test_saw_wrong_values():
    """SGLang 0.5.23's runner report said "results can be wrong" for every clause a bound forward left in the
    stack failed; now a clause says what its tests saw, and the headline says it only where values were wrong."""
    state_only = conformance.build_report(_failed(1, "replay", MODULE_STATE) + _failed(2, "no-grad", MODULE_STATE),
                                          TABLE, component="toy", spec="x", kind="adapter", engine="", device="cpu",
                                          graph_backend="emulated", environment={}, command="")
    assert state_only.headline(CORE) == ("core: VIOLATED (no test saw wrong values): replay (wrong state left behind), "
                                         "no-grad (wrong state left behind)")
    assert len(state_only.findings) == 1 and state_only.findings[0].clauses == {"replay": 1, "no-grad": 1}
    text = conformance.format_markdown(state_only)
    assert "### Findings by cause" in text and "| F1 | wrong state left behind | module state:" in text
    assert "- F1 `test_a.py::test_1`: `pytest 1`" in text
    mixed = conformance.build_report(_failed(1, "replay", VALUES) + _failed(2, "no-grad", MODULE_STATE), TABLE,
                                     component="toy", spec="x", kind="adapter", engine="", device="cpu",
                                     graph_backend="emulated", environment={}, command="")
    assert mixed.headline(CORE) == ("core: VIOLATED (results can be wrong): replay (wrong values), no-grad (wrong "
                                    "state left behind)")
    assert mixed.to_json()["findings"][0]["severity"] == findings.WRONG_VALUES


SHARED_RUNNER_SUITE = """
from harness.conformance.plugin import PerTestInConformance

RUNNERS = PerTestInConformance()


class Runner:  # a finding that only a runner's first call shows
    def __init__(self):
        self.calls = 0

    def call(self):
        self.calls += 1
        return self.calls


def test_a():
    assert RUNNERS.get("runner", Runner).call() == 2


def test_b():
    assert RUNNERS.get("runner", Runner).call() == 2
"""


def test_what_a_suite_shares_between_tests_is_per_test_in_a_conformance_run(pytester, monkeypatch):
    """Shared between tests, the first-call finding fails whichever test runs first, and only that one; in a
    conformance run each test has its own, so every test meets it, in either order."""
    pytester.makepyfile(test_shared=SHARED_RUNNER_SUITE)
    shared = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    shared.assert_outcomes(passed=1, failed=1)
    for order in ("collected", "reversed"):
        monkeypatch.setenv("HARNESS_CONFORMANCE_ORDER", order)
        isolated = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "harness.conformance.plugin", "-v")
        isolated.assert_outcomes(failed=2)
        names = [line.split("::")[1].split()[0] for line in isolated.outlines if "::test_" in line and "FAILED" in line]
        assert names[:2] == (["test_a", "test_b"] if order == "collected" else ["test_b", "test_a"])


RECORDING_SUITE = """
import pytest
import torch
from hypothesis import given, settings, strategies as st

from harness.oracle import Checker, checks_stop
from harness.errors import MismatchError

STATE = {"calls": 0}


def leaves_state(value):  # a call that leaves a module attribute changed, then one that gives wrong values
    module = torch.nn.Linear(2, 2)
    checker = Checker("graphs")

    def candidate():
        module.training = False
        return torch.tensor([value])

    checker.call(candidate, lambda: torch.tensor([value]), modules=[module], exact=True, call="first")
    STATE["calls"] += 1
    checker.call(lambda: torch.tensor([value + 1.0]), lambda: torch.tensor([value]), exact=True, call="second")
    STATE["calls"] += 1


def test_plain():
    leaves_state(1.0)


@settings(max_examples=5, database=None)
@given(st.floats(0, 4))
def test_drawn(value):
    leaves_state(value)


def test_stopped():
    with checks_stop(), pytest.raises(MismatchError, match="module state"):
        leaves_state(1.0)
"""


def test_a_conformance_run_records_every_failed_check_and_goes_on(pytester):
    """A suite's run stops at the first failed check (the state left behind); a conformance run records it, goes on
    to the next call's values, and fails the test, or the hypothesis example, with both; ``checks_stop`` stops as
    before."""
    pytester.makepyfile(test_recording=RECORDING_SUITE)
    for plugin, went_on in (((), False), (("-p", "harness.conformance.plugin"), True)):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *plugin)
        result.assert_outcomes(failed=2, passed=1)  # test_stopped passes: its check raised at once
        sections = re.split(r"^_+ (test_\w+) _+$", result.stdout.str(), flags=re.MULTILINE)
        failures = dict(zip(sections[1::2], sections[2::2]))
        for test in ("test_plain", "test_drawn"):
            assert "module state: the call changed module 0 training" in failures[test], failures[test]
            # the second call's values are seen only where the run went on past the first call's failure
            assert ("values: tensors differ" in failures[test]) is went_on, failures[test]
            assert ("2 failed checks recorded" in failures[test]) is went_on, failures[test]


@pytest.mark.slow_child
def test_verdicts_and_findings_do_not_depend_on_test_order_or_workers():
    """Two recordings of one suite against a runner mutant, in collection order on one process and reversed on two
    xdist workers, agree on every verdict, count, severity and finding."""
    reports = [conformance.run_conformance(
        component="runner", spec="mutant:restores-a-bound-method", device="cpu", graph_backend="emulated", root=ROOT,
        extra_args=["-k", "test_hidden_states"], test_order=order, jobs=jobs)
        for order, jobs in (("collected", 1), ("reversed", 2))]
    first, second = ([(r.clause, r.verdict, r.passed, r.failed, r.skipped, r.severity) for r in report.results]
                     for report in reports)
    assert first == second and any(row[3] for row in first)
    assert [(f.cause, f.severity, sorted(f.tests)) for f in reports[0].findings] == [
        (f.cause, f.severity, sorted(f.tests)) for f in reports[1].findings]


def test_a_report_says_which_lines_of_the_implementation_no_test_reached():
    """Reach of the reference's breakable graph under part of its suite: some of its functions' lines ran, some did
    not (the refusals of a bad receiver are not among the tests chosen), and the report lists those by function."""
    report = conformance.run_conformance(component="graphs", spec="reference", device="cpu", graph_backend="emulated",
                                         root=ROOT, extra_args=["-k", "test_every_calling_convention"])
    by_module = {m.module: m for m in report.reach}
    assert set(by_module) == {"harness.graphs._breakable", "harness.graphs._seam"}, report.reach_note
    seam = by_module["harness.graphs._seam"]
    assert 0 < seam.lines_reached < seam.lines and seam.branches_reached <= seam.branches
    refusal = next(number for number, line in enumerate(Path(_seam.__file__).read_text().splitlines(), 1)
                   if "receive_breaks() needs an object with run_break" in line)  # a receiver without run_break
    assert refusal in seam.unreached["receive_breaks.__init__"]
    text = conformance.format_markdown(report)
    assert "### Reach" in text and "| `harness.graphs._seam` |" in text
    assert f"- `receive_breaks.__init__`: lines {refusal}" in text


def test_reach_names_the_engines_modules_and_says_why_it_was_not_measured():
    from harness.conformance import reach

    assert reach.modules_of("graphs", "vllm") == ("vllm.compilation.breakable_cudagraph",)
    assert reach.modules_of("runner", "mutant:forget-restore") == ("harness.runner.runner", "harness.runner.discovery")
    assert reach.modules_of("gather", "mypkg.kernels:gather") == ("mypkg.kernels",)
    report = conformance.build_report([], TABLE, component="toy", spec="x", kind="adapter", engine="", device="cpu",
                                      graph_backend="emulated", environment={}, command="")
    report.reach_note = "coverage.py is not installed (pip install -c constraints.txt coverage)"
    assert "Not measured: coverage.py is not installed" in conformance.format_markdown(report)


def test_the_failures_a_conformance_run_recorded_are_read_as_one_cause_each():
    """What the recording of a conformance run raises at a test's end (harness.oracle._recording.combined): the first
    call's state difference and a later call's values are two causes, and the count line none."""
    from harness.errors import MismatchError
    from harness.oracle._recording import combined

    def failure(*problems: str) -> MismatchError:
        error = MismatchError("runner: observably different from eager (harness.oracle):\n  " + "\n  ".join(problems)
                              + "\n  implementations: {'runner': 'x'}")
        error.problems, error.context = list(problems), "\n  implementations: {'runner': 'x'}"
        return error

    state = "module state: the call changed module 0.model instance forward, which eager leaves as it was"
    values = "values: tensors differ at .next_token_logits (bitwise): 3 / 96 elements mismatch"
    raised = combined([failure(state), failure(state), failure(values)])
    assert str(raised).count(state) == 1 and "3 failed checks recorded in this test" in str(raised)
    assert findings.causes_of(f"harness.errors.MismatchError: {raised}") == [
        (findings.WRONG_STATE, "module state: the call changed module N.model instance forward, which eager leaves "
                               "as it was"),
        (findings.WRONG_VALUES, "values: tensors differ at .next_token_logits")]
