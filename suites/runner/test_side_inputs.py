"""Side inputs: an extra tensor keyword of the layer stack must reach the graph. Ablation oracle:
eager with the side input zeroed differs beyond tolerance, so a replay that matches eager proves
the input got through."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import describe_mismatch
from harness.oracle import CALLING_MODES
from harness.runner.cases import eager, lengths_strategy, make_batch

pytestmark = pytest.mark.clause("stack-arguments")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@given(lengths=lengths_strategy(), seed=st.integers(0, 2**16), mode=st.sampled_from(["none", "last", "full"]),
       calling=st.sampled_from(CALLING_MODES))
def test_side_input_reaches_the_graph(zoo_runner, check_run, device, dtype, lengths, seed, mode, calling):
    model, runner = zoo_runner("side-input", dtype)
    with_side = make_batch("side-input", lengths, seed=seed, dtype=dtype, device=device, hidden_mode=mode)
    zeroed = make_batch("side-input", lengths, seed=seed, dtype=dtype, device=device, hidden_mode=mode,
                        side_scale=0.0)
    effect = describe_mismatch(eager(model, with_side).next_token_logits, eager(model, zeroed).next_token_logits,
                               exact=False)
    assert effect is not None, (
        "the side input does not change eager output beyond tolerance: this example proves nothing")
    # Both orders: a replay must not keep the previous replay's side input either.
    for batch in (with_side, zeroed, with_side):
        check_run(runner, model, batch, mode=calling, dtype=dtype, model="side-input", seed=seed,
                  side_input="zeroed" if batch is zeroed else "random")
