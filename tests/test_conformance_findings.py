"""Findings by cause: one finding per cause whatever the number of tests and clauses, severities from what the caller
got, and the report's wording that follows from them."""

from __future__ import annotations

from harness import conformance
from harness.conformance import findings
from harness.conformance.clauses import CORE, Clause

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
