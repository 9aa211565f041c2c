"""Goldens: capture plans (buckets, segments and breaks per bucket) and output digests of fixed
batches. A change here must be deliberate: review it, then rerun with --snapshot-update."""

from __future__ import annotations

import pytest
import torch

from harness.runner.candidate import fixed_capture_plan
from harness.runner.cases import make_batch

pytestmark = pytest.mark.clause("replay-equals-eager")


@pytest.mark.clause("accounting")
@pytest.mark.parametrize("name", ["dense", "moe", "vlm", "odd-decoder-layers"])
def test_capture_plan(zoo_runner, snapshot, name):
    _, runner = zoo_runner(name)
    found = runner.discovery
    plan = {
        "discovery": {"module_class": type(found.module).__name__, "path": found.path, "fell_back": found.fell_back},
        "buckets": list(runner.buckets),
        # what the contract fixes of the plan (docs/runner.md: "at least" each bucket's segments and breaks);
        # a runner's other keys are its own
        "graphs": fixed_capture_plan(runner.capture_plan()),
    }
    assert plan == snapshot


@pytest.mark.parametrize("name", ["dense", "moe", "side-input"])
def test_output_digest(zoo_runner, check_run, snapshot, device, name):
    model, runner = zoo_runner(name)
    batch = make_batch(name, [3, 6, 1], seed=99, dtype=torch.float32, device=device, hidden_mode="full")
    output = check_run(runner, model, batch, model=name, seed=99)
    # The golden pins the zoo's numbers (weights from the seed, the layer math); the runner must match
    # both the golden (within the float32 tolerance) and eager (check_run).
    assert output == snapshot
