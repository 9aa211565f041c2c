"""The relay's own checks: bad stash and resolve arguments are clear errors; slots wrap and invalidate."""

from __future__ import annotations

import pytest
import torch

from harness.errors import GatherContractError
from harness.gather import SENTINEL, SpecExtrasRelay


def _relay(hidden_size=None):
    return SpecExtrasRelay(6, topk=2, hidden_size=hidden_size)


def _values(count, hidden_size=None, tokens=None):
    values = dict(topk_p=torch.rand(count, 2), topk_index=torch.zeros(count, 2, dtype=torch.int64),
                  output_tokens=torch.arange(count) if tokens is None else torch.tensor(tokens))
    if hidden_size:
        values["hidden_states"] = torch.zeros(count, hidden_size)
    return values


@pytest.mark.parametrize("slots, values, message", [
    (torch.tensor([1, 1]), _values(2), "name a slot twice"),
    (torch.tensor([1, -5]), _values(2), "name a slot twice"),  # -5 wraps to 1 in a pool of 6
    (torch.tensor([6]), _values(1), r"outside \[-6, 6\)"),
    (torch.tensor([[1]]), _values(1), "1-D int32 or int64"),
    (torch.tensor([1.0]), _values(1), "1-D int32 or int64"),
    (torch.tensor([1, 2]), _values(3), r"topk_p must have shape \(2, 2\)"),
    (torch.tensor([1]), _values(1, tokens=[-3]), "output_tokens must be >= 0"),
    (torch.tensor([1]), _values(1, hidden_size=4), "keeps no hidden states"),
])
def test_bad_stash_is_a_clear_error(slots, values, message):
    with pytest.raises(GatherContractError, match=message):
        _relay().stash(slots, **values)


def test_missing_hidden_states_is_a_clear_error():
    with pytest.raises(GatherContractError, match=r"hidden_states must have shape \(1, 4\)"):
        _relay(hidden_size=4).stash(torch.tensor([0]), **_values(1))


def test_resolve_rejects_out_of_range_before_gathering():
    relay = _relay()
    relay.stash(torch.tensor([0]), **_values(1))
    with pytest.raises(GatherContractError, match=r"resolve indices \[7\] are outside"):
        relay.resolve(torch.tensor([0, 7]))
    assert relay.pending_slots() == [0], "a refused resolve must not consume anything"


def test_negative_slots_wrap_and_consumed_slots_hold_the_sentinel():
    relay = _relay(hidden_size=3)
    relay.stash(torch.tensor([-1, 2]), **_values(2, hidden_size=3, tokens=[40, 41]))
    assert relay.pending_slots() == [2, 5]
    resolved = relay.resolve(torch.tensor([5], dtype=torch.int32))
    assert resolved.bonus_tokens.tolist() == [40] and resolved.hidden_states.shape == (1, 3)
    assert relay.output_tokens_buf[5].item() == SENTINEL and relay.pending_slots() == [2]


def test_bad_relay_sizes_are_a_clear_error():
    with pytest.raises(GatherContractError, match="pool >= 1"):
        SpecExtrasRelay(0, topk=2)
