"""MoE under no_grad: a caller with autograd on and parameters that require grad still gets a
capture, a layer forward that runs without autograd, outputs without grad_fn, eager values."""

from __future__ import annotations

import pytest
import torch

from harness.models import build_model, forward_context
from harness.runner.cases import SEED, make_batch

pytestmark = pytest.mark.clause("no-grad")


@pytest.fixture(scope="module")
def trainable_moe(device):
    return build_model("moe", seed=SEED, device=device, requires_grad=True)


def test_the_compiled_out_reduction_fails_under_autograd(trainable_moe, device):
    # The hazard is real: without no_grad the layer stack's compiled out= combine refuses to run.
    batch = make_batch("moe", [3, 2], seed=1, dtype=torch.float32, device=device)
    with torch.enable_grad(), forward_context(batch), pytest.raises(Exception, match="automatic differentiation"):
        trainable_moe.model(batch.input_ids, batch.positions, batch)


def test_capture_and_replay_with_grad_enabled(build_runner, trainable_moe, check_run, device):
    grad_seen: list[bool] = []
    hooks = [layer.register_forward_pre_hook(lambda *_: grad_seen.append(torch.is_grad_enabled()))
             for layer in trainable_moe.model.layers]
    try:
        with torch.enable_grad():
            runner = build_runner(trainable_moe)
            batch = make_batch("moe", [5, 1, 6], seed=3, dtype=torch.float32, device=device, hidden_mode="full")
            replays = runner.stats.replays
            # Under the caller's grad mode: outputs must be eager's (no grad_fn, as eager under no_grad gives).
            check_run(runner, trainable_moe, batch, mode="grad", model="moe", seed=3)
            assert runner.stats.replays == replays + 1, "the batch was not replayed"
    finally:
        for hook in hooks:
            hook.remove()
    assert grad_seen, "the decoder layers never ran during capture"
    assert not any(grad_seen), f"autograd was on inside the layer forward in {sum(grad_seen)} of {len(grad_seen)} calls"
