"""python -m harness conformance-diff: what changed between two reports, in a release note's words."""

from __future__ import annotations

import json

import pytest

from harness.conformance import diff
from harness.errors import UsageError


def _result(clause: str, verdict: str, passed: int, failed: int, *failing: str) -> dict:
    return {"clause": clause, "verdict": verdict, "passed": passed, "failed": failed, "skipped": 0,
            "failures": [{"nodeid": test} for test in failing]}


def _report(results: list[dict], findings: list[dict] = ()) -> dict:
    return {"component": "graphs", "spec": "vllm", "engine": "vllm 0.33.0", "results": results,
            "findings": list(findings)}


OLD = _report([_result("pools", "violated", 3, 1, "t::a"), _result("replay-equals-eager", "held", 5, 0),
               _result("streams", "not run", 0, 0)],
              [{"cause": "values: tensors differ at .out", "severity": "wrong values", "tests": ["t::a"]}])
NEW = _report([_result("pools", "held", 4, 0), _result("replay-equals-eager", "violated", 4, 1, "t::b"),
               _result("streams", "held", 2, 0)],
              [{"cause": "module state: forward", "severity": "wrong state left behind", "tests": ["t::b"]}])


def test_a_release_that_fixes_one_clause_and_breaks_another_says_both():
    changes = diff.diff_reports(OLD, NEW)
    assert changes.newly_violated == ["replay-equals-eager (was held)"]
    assert changes.fixed == ["pools"]
    assert changes.verdicts == ["streams: not run -> held"]
    assert changes.newly_failing == ["replay-equals-eager: t::b"] and changes.no_longer_failing == ["pools: t::a"]
    assert changes.new_findings == ["wrong state left behind: module state: forward (1 test)"]
    assert changes.gone_findings == ["wrong values: values: tensors differ at .out (1 test)"]
    assert "pools: passed/failed/skipped 3/1/0 -> 4/0/0" in changes.counts
    text = diff.format_diff(changes)
    assert "Newly violated (1):\n- replay-equals-eager (was held)" in text and "Fixed (1):\n- pools" in text


def test_a_report_against_itself_is_identical_and_a_moved_test_is_not():
    assert diff.diff_reports(OLD, OLD).identical
    assert "identical verdicts, counts, failing tests and findings" in diff.format_diff(diff.diff_reports(OLD, OLD))
    moved = json.loads(json.dumps(OLD))
    moved["findings"][0]["tests"] = ["t::c"]
    changes = diff.diff_reports(OLD, moved)
    line = "wrong values: values: tensors differ at .out (1 test)"
    assert not changes.identical and changes.findings_changed == [f"{line} -> {line}"]


def test_reports_of_two_components_or_a_file_that_is_no_report_are_refused_in_one_line(tmp_path):
    with pytest.raises(UsageError, match="different components"):
        diff.diff_reports(OLD, {**NEW, "component": "gather"})
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="no 'results' list"):
        diff.load_report(bad)


def test_the_command_exits_1_on_a_change_only_where_it_expects_none(tmp_path, capsys):
    from harness.cli import main

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(OLD))
    new.write_text(json.dumps(NEW))
    assert main(["conformance-diff", str(old), str(new)]) == 0
    assert main(["conformance-diff", str(old), str(new), "--expect-identical"]) == 1
    assert "Newly violated" in capsys.readouterr().out
    assert main(["conformance-diff", str(old), str(old), "--expect-identical"]) == 0
    capsys.readouterr()
    assert main(["conformance-diff", str(tmp_path / "none.json"), str(new)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not a conformance report" in error, error
