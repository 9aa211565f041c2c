"""The FutureMap-style relay end to end: stash over several steps, resolve in random orders.

The relay resolves through the candidate, and every gather it makes is checked against the eager oracle on the
relay's own buffers (``check_gather.as_gather``): what the relay hands out, and what it leaves in its buffers,
is then what a relay over the oracle would. It must refuse to read a slot twice or a slot that was never
stashed.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import GatherContractError
from harness.gather import SpecExtrasRelay
from harness.oracle import CALLING_MODES, calling_mode

pytestmark = pytest.mark.clause("relay")


def _stash_random(relay: SpecExtrasRelay, slots: torch.Tensor, generator: torch.Generator) -> None:
    count = slots.numel()
    values = dict(
        topk_p=torch.rand(count, relay.topk, generator=generator),
        topk_index=torch.randint(0, 1 << 40, (count, relay.topk), generator=generator),
        output_tokens=torch.randint(0, 1 << 40, (count,), generator=generator),
    )
    if relay.hidden_states_buf is not None:
        values["hidden_states"] = torch.randn(count, relay.hidden_states_buf.shape[1], generator=generator)
    relay.stash(slots.to(relay.device), **{k: v.to(relay.device) for k, v in values.items()})


@given(pool=st.integers(1, 300), topk=st.sampled_from([1, 4, 8, 13]),
       hidden_size=st.sampled_from([None, 1, 64, 1025]), steps=st.integers(1, 6),
       index_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**32 - 1),
       mode=st.sampled_from(CALLING_MODES))
def test_relay_matches_eager_relay(check_gather, device, pool, topk, hidden_size, steps, index_dtype, seed, mode):
    """The caller stashes and resolves in its autograd ``mode``."""
    generator = torch.Generator().manual_seed(seed)
    relay = SpecExtrasRelay(pool, topk=topk, hidden_size=hidden_size, device=device)
    calls = check_gather.anew()
    pending: list[int] = []
    for step in range(steps):
        free = sorted(set(range(pool)) - set(pending))
        stash_count = int(torch.randint(0, len(free) + 1, (), generator=generator)) if free else 0
        chosen = [free[i] for i in torch.randperm(len(free), generator=generator)[:stash_count].tolist()]
        pending += chosen
        # Resolve a random subset of everything pending, in a random order; the rest waits for a later step.
        order = torch.randperm(len(pending), generator=generator).tolist()
        take = int(torch.randint(0, len(pending) + 1, (), generator=generator)) if step < steps - 1 else len(pending)
        resolved = [pending[i] for i in order[:take]]
        relay.gather = calls.as_gather(mode=mode, seed=seed, pool=pool, topk=topk, hidden_size=hidden_size,
                                       step=step, index_dtype=index_dtype, resolved_slots=resolved)
        with calling_mode(mode):
            if chosen:
                _stash_random(relay, torch.tensor(chosen, dtype=index_dtype), generator)
            relay.resolve(torch.tensor(resolved, dtype=index_dtype, device=device))
        pending = [slot for slot in pending if slot not in set(resolved)]


@pytest.mark.clause("relay-misuse")
def test_resolving_a_never_stashed_slot_is_caught(check_gather, device):
    relay = SpecExtrasRelay(8, topk=2, hidden_size=4, device=device, gather=check_gather.as_gather())
    relay.stash(torch.tensor([1, 2], device=device), topk_p=torch.rand(2, 2, device=device),
                topk_index=torch.zeros(2, 2, dtype=torch.int64, device=device),
                output_tokens=torch.tensor([7, 9], device=device), hidden_states=torch.zeros(2, 4, device=device))
    with pytest.raises(GatherContractError, match=r"slots \[5\] that hold no extras"):
        relay.resolve(torch.tensor([2, 5], device=device))


@pytest.mark.clause("relay-misuse")
def test_resolving_a_slot_twice_is_caught(check_gather, device):
    relay = SpecExtrasRelay(8, topk=2, device=device, gather=check_gather.as_gather())
    relay.stash(torch.tensor([3], device=device), topk_p=torch.rand(1, 2, device=device),
                topk_index=torch.zeros(1, 2, dtype=torch.int64, device=device),
                output_tokens=torch.tensor([11], device=device))
    first = relay.resolve(torch.tensor([3], device=device))
    assert first.bonus_tokens.tolist() == [11], f"the stashed bonus token was {first.bonus_tokens.tolist()}, not [11]"
    with pytest.raises(GatherContractError, match="already consumed"):
        relay.resolve(torch.tensor([3], device=device))


@pytest.mark.clause("fresh-outputs")
def test_resolved_extras_outlive_the_next_resolve(check_gather, device):
    """The scheduler holds one step's resolved extras while the next step stashes into the same slots and resolves:
    the checker keeps the first resolve's results and fails the second if they changed."""
    relay = SpecExtrasRelay(16, topk=3, hidden_size=5, device=device, gather=check_gather.as_gather(step="first"))
    generator = torch.Generator().manual_seed(21)
    _stash_random(relay, torch.tensor([1, 4, 9, 12]), generator)
    relay.resolve(torch.tensor([9, 1], device=device))
    _stash_random(relay, torch.tensor([1, 9]), generator)  # the same slots, new extras
    relay.gather = check_gather.as_gather(step="second")
    relay.resolve(torch.tensor([1, 4], device=device))
