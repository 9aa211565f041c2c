"""State re-allocated between replays (zoo model ``recurrent-state``, whose layer stack reads and writes a recurrent
state per request slot inside the captured segments). An engine that releases its memory and resumes (SGLang's
``release_memory_occupation`` / ``resume_memory_occupation`` around RL training) may hand the model a new state
tensor, at a new address, holding the same values; a graph captured earlier reads and writes the memory it was
captured on: the old, freed one, or one still held elsewhere (a backup), silently stale. A runner must notice and
capture again (the reference compares the model's parameters and buffers with those it captured on, at each
replay). Requests keep their slots across steps; before some steps the state moves, the old tensor released or
still held; after every step the outputs and the whole state equal an eager twin's (the same weights, a state of
its own moved the same way), bitwise where the backend allows it. Every step goes through ``check_run``."""

from __future__ import annotations

import pytest
import torch

from harness.compare import assert_equivalent
from harness.models import build_model
from harness.models.index_checked import with_pool_slots
from harness.oracle import CALLING_MODES
from harness.runner import ForwardBatch
from harness.runner.cases import CONFIG, SEED, eager_forward, stateless_parts

pytestmark = pytest.mark.clause("moved-state")

NAME = "recurrent-state"
# Request lengths per step (request i keeps slot i + 1): buckets 8, 4, 8, 8, 16.
STEPS = ((3, 2), (1, 1), (2, 1, 3), (4, 4), (5, 6, 2, 1))
MOVED_BEFORE = (2, 4)  # the steps before which the state moves


def _move(model: torch.nn.Module, held: list[torch.Tensor] | None) -> None:
    """Re-allocate the recurrent state as a resume does: a new tensor with the same values replaces the buffer;
    the old one is released, or kept in ``held``."""
    states = model.recurrent_state
    old = states.state
    states.state = old.clone()
    if held is not None:
        held.append(old)


@pytest.mark.parametrize("old_state", ["released", "held"])
def test_replays_follow_a_state_moved_between_them(build_runner, check_run, exact_comparison, failure_context,
                                                   device, old_state):
    model, twin = (build_model(NAME, seed=SEED, device=device) for _ in range(2))
    runner = build_runner(model)
    bitwise = exact_comparison(torch.float32)
    held: list[torch.Tensor] | None = [] if old_state == "held" else None
    for step, lengths in enumerate(STEPS):
        if step in MOVED_BEFORE:
            moved_from = model.recurrent_state.state.data_ptr()
            _move(model, held)
            _move(twin, None)
            assert model.recurrent_state.state.data_ptr() != moved_from
        batch = with_pool_slots(ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=step,
                                                          device=device), range(1, len(lengths) + 1))
        check_run(runner, model, batch, mode=CALLING_MODES[step % len(CALLING_MODES)],
                  twin=eager_forward(twin, bitwise=bitwise), modules=stateless_parts(model), model=NAME, step=step,
                  old_state=old_state)
        assert_equivalent(model.recurrent_state.state, twin.recurrent_state.state, exact=bitwise,
                          context=failure_context(model=NAME, step=step, old_state=old_state, batch=batch.describe(),
                                                  comparison="the recurrent state against the eager twin's"))
    # The state really changed along the way: otherwise comparing it proves nothing.
    assert model.recurrent_state.state[:, 1:len(STEPS[-1]) + 1].abs().amin() > 0
