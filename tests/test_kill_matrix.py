"""The kill-matrix golden: one entry per mutant, a diff when the killing test moves, a clear error
for a broken file."""

from __future__ import annotations

import json

import pytest

from harness import kill_matrix
from harness.errors import GoldenError
from harness.selfcheck import Outcome


def _outcome(mutant: str, killed_by: str, *, component: str = "gather", verdict: str = "killed") -> Outcome:
    return Outcome(component, mutant, "mutant", verdict, killed_by, 1.0, "pytest ...")


def test_entries_are_one_per_mutant_without_the_reference():
    outcomes = [Outcome("gather", "reference", "reference", "passed", "", 1.0, "pytest ..."),
                _outcome("b", "suites/gather/test_x.py::test_b"), _outcome("a", "", verdict="survived")]
    assert kill_matrix.entries(outcomes) == [
        {"component": "gather", "mutant": "a", "killing_test": "(survived)"},
        {"component": "gather", "mutant": "b", "killing_test": "suites/gather/test_x.py::test_b"},
    ]


def test_a_moved_killing_test_is_a_diff_and_update_keeps_other_components(tmp_path):
    path = tmp_path / "kill_matrix.json"
    rows = kill_matrix.entries([_outcome("a", "t::one"), _outcome("r", "t::r", component="runner")])
    kill_matrix.write(path, rows, graph_backend="emulated", components=["gather", "runner"])
    assert kill_matrix.diff(path, rows, graph_backend="emulated", components=["gather", "runner"]) == []
    moved = kill_matrix.entries([_outcome("a", "t::two")])
    assert kill_matrix.diff(path, moved, graph_backend="emulated", components=["gather"]) == [
        "gather a: killed by t::one -> t::two"]
    assert kill_matrix.diff(path, moved, graph_backend="cuda", components=["gather"]) == []  # other backend
    kill_matrix.write(path, moved, graph_backend="emulated", components=["gather"])
    stored = json.loads(path.read_text())["mutants"]
    assert [row["killing_test"] for row in stored] == ["t::two", "t::r"]


def test_missing_and_corrupted_matrices(tmp_path):
    path = tmp_path / "kill_matrix.json"
    assert kill_matrix.diff(path, [], graph_backend="emulated", components=["gather"])[0].startswith("no kill-matrix")
    path.write_text('{"graph_backend": "emu')
    with pytest.raises(GoldenError, match="kill_matrix.json is unreadable"):
        kill_matrix.load(path)
