"""The kill matrix as a golden: a moved killing test is reported, a broken file is named."""

from __future__ import annotations

import pytest

from harness import selfcheck
from harness.errors import GoldenError
from harness.selfcheck import Outcome, kill_matrix


def _outcome(mutant: str, killed_by: str, *, verdict: str = "killed", backend: str = "emulated") -> Outcome:
    return Outcome("gather", mutant, "mutant", verdict, killed_by, 1.0, "pytest ...", graph_backend=backend)


def test_unchanged_killing_tests_are_no_change(tmp_path):
    outcomes = [_outcome("a", "t::one"), Outcome("gather", "reference", "reference", "passed", "", 1.0, "pytest ...")]
    selfcheck.write_kill_matrix(tmp_path, outcomes)
    assert kill_matrix.changes(tmp_path, outcomes) == []


def test_moved_survived_and_new_mutants_are_changes(tmp_path):
    selfcheck.write_kill_matrix(tmp_path, [_outcome("a", "t::one"), _outcome("b", "t::b")])
    now = [_outcome("a", "t::two"), _outcome("b", "", verdict="survived"), _outcome("c", "t::c"),
           _outcome("a", "t::one", backend="cuda")]
    assert kill_matrix.changes(tmp_path, now) == [
        "gather a [emulated]: killed by t::one -> t::two",
        "gather b [emulated]: killed by t::b -> (survived)",
        "gather c [emulated]: killed by (not recorded) -> t::c",
        "gather a [cuda]: killed by (not recorded) -> t::one",
    ]


def test_a_corrupted_matrix_is_named(tmp_path):
    path = tmp_path / selfcheck.KILL_MATRIX_PATH
    path.parent.mkdir(parents=True)
    path.write_text('{"kills": [{"component": "gath')
    with pytest.raises(GoldenError, match="kill_matrix.json is unreadable"):
        kill_matrix.changes(tmp_path, [_outcome("a", "t::one")])
