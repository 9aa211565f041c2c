"""What a runner holds on to: nothing of a call's batch or results once the caller drops them, and nothing that
grows over a long run of replays, each compared with eager's (:meth:`harness.oracle.Checker.released`,
:meth:`harness.oracle.Checker.steady`). The memory behind each output is compared at every call by the checker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.runner.cases import eager, make_batch

pytestmark = pytest.mark.clause("outputs-owned")

_MODEL = "dense"
_LENGTHS = [3, 2]
# Enough calls for a per-call cache to show once the first calls (a bucket's first replay) are done.
_CALLS = 8


def _session(call: Callable[[Any], Any], device: torch.device) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        batch = make_batch(_MODEL, _LENGTHS, seed=7, dtype=torch.float32, device=device)
        return {"batch": batch, "outputs": call(batch)}

    return run


def test_batches_and_results_are_released_when_the_caller_drops_them(zoo_runner, runner_checker, device):
    model, runner = zoo_runner(_MODEL)
    runner_checker.released(_session(runner.run, device), _session(lambda batch: eager(model, batch), device),
                            model=_MODEL, lengths=_LENGTHS)


def test_a_long_run_grows_no_more_than_eager(zoo_runner, runner_checker, device):
    model, runner = zoo_runner(_MODEL)
    batch = make_batch(_MODEL, _LENGTHS, seed=7, dtype=torch.float32, device=device)
    runner_checker.steady(lambda: runner.run(batch), lambda: eager(model, batch), calls=_CALLS, model=_MODEL,
                          lengths=_LENGTHS)
