"""The kill matrix as a golden: did the committed killing test of each mutant change?

Compares a run with ``golden/selfcheck/kill_matrix.json`` (:data:`harness.selfcheck.KILL_MATRIX_PATH`) for
``python -m harness selfcheck --check-kill-matrix`` (before ``--update-kill-matrix`` rewrites the file), and for
the one line a plain run prints where a killing test moved."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.errors import GoldenError

__all__ = ["changes"]


def _recorded(root: Path) -> dict[tuple[str, str, str], str]:
    from harness.selfcheck import KILL_MATRIX_PATH, read_hints

    try:
        return read_hints(root)
    except (ValueError, KeyError, TypeError) as error:
        raise GoldenError(f"kill-matrix golden {root / KILL_MATRIX_PATH} is unreadable ({error!r}); restore it with "
                          "git, or delete it and rerun selfcheck with --update-kill-matrix") from None


def changes(root: Path, outcomes: Iterable[Any]) -> list[str]:
    """One line per mutant whose killing test differs from the committed one (empty: no change).

    Compares only the mutants and backends of ``outcomes`` (selfcheck's ``Outcome`` objects)."""
    recorded = _recorded(root)
    lines = []
    for outcome in outcomes:
        if outcome.kind != "mutant" or outcome.verdict == "skipped":  # not judged on this backend
            continue
        key = (outcome.component, outcome.spec, outcome.graph_backend)
        now = outcome.first_failure if outcome.verdict == "killed" else f"({outcome.verdict})"
        before = recorded.get(key, "(not recorded)")
        if before != now:
            lines.append(f"{outcome.component} {outcome.spec} [{outcome.graph_backend}]: killed by {before} -> {now}")
    return lines
