"""Side inputs: an extra tensor keyword of the layer stack must reach the graph. Ablation oracle:
eager with the side input zeroed differs, so an equal replay proves the input got through."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from runner_cases import eager, lengths_strategy, make_batch


@given(lengths=lengths_strategy(), seed=st.integers(0, 2**16), mode=st.sampled_from(["none", "last", "full"]))
def test_side_input_reaches_the_graph(zoo_runner, assert_matches_eager, device, lengths, seed, mode):
    model, runner = zoo_runner("side-input")
    with_side = make_batch("side-input", lengths, seed=seed, dtype=torch.float32, device=device, hidden_mode=mode)
    zeroed = make_batch("side-input", lengths, seed=seed, dtype=torch.float32, device=device, hidden_mode=mode,
                        side_scale=0.0)
    expected_with, expected_zeroed = eager(model, with_side), eager(model, zeroed)
    assert not torch.equal(expected_with.next_token_logits, expected_zeroed.next_token_logits), (
        "the side input does not change eager output, so this example proves nothing")
    # Both orders: a replay must not keep the previous replay's side input either.
    for batch in (with_side, zeroed, with_side):
        assert_matches_eager(runner.run(batch), model, batch, dtype=torch.float32, name="side-input", seed=seed,
                             side_input="zeroed" if batch is zeroed else "random")
