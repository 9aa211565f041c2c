"""The FutureMap-style relay end to end: stash over several steps, resolve in random orders.

A relay that resolves through the candidate must hand out exactly what a relay resolving through
the eager oracle hands out, step after step, and must refuse to read a slot twice or a slot that
was never stashed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.errors import GatherContractError
from harness.gather import SpecExtrasRelay, eager_gather

pytestmark = pytest.mark.clause("relay")


def _stash_random(relays: list[SpecExtrasRelay], slots: torch.Tensor, generator: torch.Generator) -> None:
    relay = relays[0]
    count = slots.numel()
    values = dict(
        topk_p=torch.rand(count, relay.topk, generator=generator),
        topk_index=torch.randint(0, 1 << 40, (count, relay.topk), generator=generator),
        output_tokens=torch.randint(0, 1 << 40, (count,), generator=generator),
    )
    if relay.hidden_states_buf is not None:
        values["hidden_states"] = torch.randn(count, relay.hidden_states_buf.shape[1], generator=generator)
    for each in relays:
        each.stash(slots.to(each.device), **{k: v.to(each.device) for k, v in values.items()})


@given(pool=st.integers(1, 300), topk=st.sampled_from([1, 4, 8, 13]),
       hidden_size=st.sampled_from([None, 1, 64, 1025]), steps=st.integers(1, 6),
       index_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**32 - 1))
def test_relay_matches_eager_relay(gather_function, device, failure_context, pool, topk, hidden_size, steps,
                                   index_dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    make = lambda gather: SpecExtrasRelay(pool, topk=topk, hidden_size=hidden_size, device=device,  # noqa: E731
                                          gather=gather)
    candidate, oracle = make(gather_function), make(eager_gather)
    pending: list[int] = []
    for step in range(steps):
        free = sorted(set(range(pool)) - set(pending))
        stash_count = int(torch.randint(0, len(free) + 1, (), generator=generator)) if free else 0
        chosen = [free[i] for i in torch.randperm(len(free), generator=generator)[:stash_count].tolist()]
        if chosen:
            _stash_random([candidate, oracle], torch.tensor(chosen, dtype=index_dtype), generator)
            pending += chosen
        # Resolve a random subset of everything pending, in a random order; the rest waits for a later step.
        order = torch.randperm(len(pending), generator=generator).tolist()
        take = int(torch.randint(0, len(pending) + 1, (), generator=generator)) if step < steps - 1 else len(pending)
        resolved = [pending[i] for i in order[:take]]
        indices = torch.tensor(resolved, dtype=index_dtype, device=device)
        context = failure_context(seed=seed, pool=pool, topk=topk, hidden_size=hidden_size, step=step,
                                  index_dtype=index_dtype, resolved_slots=resolved)
        assert_equivalent(candidate.resolve(indices), oracle.resolve(indices.clone()), exact=True, context=context)
        pending = [slot for slot in pending if slot not in set(resolved)]
        buffers = lambda relay: [relay.topk_p_buf, relay.topk_index_buf, relay.output_tokens_buf,  # noqa: E731
                                 relay.hidden_states_buf]
        assert_equivalent(buffers(candidate), buffers(oracle), exact=True,
                          context={"problem": "relay buffers differ after resolve", **context})


@pytest.mark.clause("relay-misuse")
def test_resolving_a_never_stashed_slot_is_caught(gather_function, device):
    relay = SpecExtrasRelay(8, topk=2, hidden_size=4, device=device, gather=gather_function)
    relay.stash(torch.tensor([1, 2], device=device), topk_p=torch.rand(2, 2, device=device),
                topk_index=torch.zeros(2, 2, dtype=torch.int64, device=device),
                output_tokens=torch.tensor([7, 9], device=device), hidden_states=torch.zeros(2, 4, device=device))
    with pytest.raises(GatherContractError, match=r"slots \[5\] that hold no extras"):
        relay.resolve(torch.tensor([2, 5], device=device))


@pytest.mark.clause("relay-misuse")
def test_resolving_a_slot_twice_is_caught(gather_function, device):
    relay = SpecExtrasRelay(8, topk=2, device=device, gather=gather_function)
    relay.stash(torch.tensor([3], device=device), topk_p=torch.rand(1, 2, device=device),
                topk_index=torch.zeros(1, 2, dtype=torch.int64, device=device),
                output_tokens=torch.tensor([11], device=device))
    first = relay.resolve(torch.tensor([3], device=device))
    assert first.bonus_tokens.tolist() == [11], f"the stashed bonus token was {first.bonus_tokens.tolist()}, not [11]"
    with pytest.raises(GatherContractError, match="already consumed"):
        relay.resolve(torch.tensor([3], device=device))


@pytest.mark.clause("fresh-outputs")
def test_resolved_extras_outlive_the_next_resolve(gather_function, device):
    """The scheduler holds one step's resolved extras while the next step stashes and resolves."""
    relay = SpecExtrasRelay(16, topk=3, hidden_size=5, device=device, gather=gather_function)
    generator = torch.Generator().manual_seed(21)
    _stash_random([relay], torch.tensor([1, 4, 9, 12]), generator)
    first = relay.resolve(torch.tensor([9, 1], device=device))
    kept = [first.topk_p.clone(), first.topk_index.clone(), first.bonus_tokens.clone(), first.hidden_states.clone()]
    _stash_random([relay], torch.tensor([1, 9]), generator)  # the same slots, new extras
    indices = torch.tensor([1, 4], device=device)
    expected = eager_gather(indices, relay.topk_p_buf, relay.topk_index_buf, relay.output_tokens_buf,
                            relay.hidden_states_buf)
    second = relay.resolve(indices)
    assert_equivalent(list(dataclasses.astuple(second)), list(expected), exact=True,
                      context={"problem": "the second resolve"})
    assert_equivalent([first.topk_p, first.topk_index, first.bonus_tokens, first.hidden_states], kept, exact=True,
                      context={"problem": "extras resolved at one step changed after the next stash and resolve"})
