"""The warnings the harness itself sets off, filtered where it sets them off: in its suites' tests and around the
imports its suites and its activation make, never in an engine's own tests.

A checkout's ini filters them (``filterwarnings`` in ``pyproject.toml``, the same filters); an engine's run reads
the engine's ini, so without these its run report ended in torch's deprecation warnings of Inductor's
``torch.jit`` use, set off by the harness's ``torch.compile``."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest

__all__ = ["WARNING_FILTERS", "as_ini_lines", "filtered", "mark"]

# (action, category, module regex) each: torch's own deprecations, which its modules raise while the harness
# compiles and captures (Inductor's use of torch.jit.script_method); pyproject.toml's filterwarnings spells them
# the same (tests/test_plugin_scope.py holds the two equal).
WARNING_FILTERS: tuple[tuple[str, type[Warning], str], ...] = (
    ("ignore", DeprecationWarning, "torch.*"),
)


def as_ini_lines() -> list[str]:
    """:data:`WARNING_FILTERS` as pytest's ``filterwarnings`` lines (``ignore::DeprecationWarning:torch.*``)."""
    return [f"{action}::{category.__name__}:{module}" for action, category, module in WARNING_FILTERS]


@contextlib.contextmanager
def filtered() -> Iterator[None]:
    """:data:`WARNING_FILTERS` in force for the block (an import the harness makes, a suite's collection), on top
    of whatever filters the run has; restored afterwards."""
    with warnings.catch_warnings():
        for action, category, module in WARNING_FILTERS:
            warnings.filterwarnings(action, category=category, module=module)
        yield


def mark(item: pytest.Item) -> None:
    """Give an item of the harness's suites a ``filterwarnings`` mark per filter, which pytest applies around its
    setup, call and teardown (an engine's own items are not given them)."""
    for line in as_ini_lines():
        item.add_marker(pytest.mark.filterwarnings(line))
