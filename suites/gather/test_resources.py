"""What the gather holds on to: nothing of a call's arguments or results once the caller drops them, and nothing
that grows over a long run, each compared with eager's (:meth:`harness.oracle.Checker.released`,
:meth:`harness.oracle.Checker.steady`). The memory behind each output is compared at every call by the checker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from harness.gather import BUFFER_NAMES, GatherCase, eager_gather

# Owning its outputs and holding nothing of the caller's arguments is the gather's fresh-outputs clause.
pytestmark = pytest.mark.clause("fresh-outputs")

_CASE = GatherCase(pool=48, count=7, seed=1)
# Enough calls for a per-call cache to show after the warm-up calls (a compile, a first allocation) are done.
_CALLS = 16


def _session(gather: Callable[..., Any], device: Any) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        args = _CASE.build(device).args
        outputs = gather(*args)
        return {**dict(zip(("indices", *BUFFER_NAMES), args)), "outputs": outputs}

    return run


def test_arguments_and_results_are_released_when_the_caller_drops_them(check_gather, gather_function, device):
    check_gather.checker.released(_session(gather_function, device), _session(eager_gather, device),
                                  **_CASE.describe())


def test_a_long_run_grows_no_more_than_eager(check_gather, gather_function, device):
    args = _CASE.build(device).args
    check_gather.checker.steady(lambda: gather_function(*args), lambda: eager_gather(*args), calls=_CALLS,
                                **_CASE.describe())
