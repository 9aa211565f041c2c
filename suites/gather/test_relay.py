"""The FutureMap-style relay end to end: stash over several steps, resolve in random orders.

The relay resolves through the candidate, and every gather it makes is checked against the eager oracle on the
relay's own buffers (``check_gather.as_gather``): what the relay hands out, and what it leaves in its buffers,
is then what a relay over the oracle would. It must refuse to read a slot twice or a slot that was never
stashed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import GatherContractError
from harness.gather import SpecExtrasRelay
from harness.oracle import CALLING_MODES, calling_mode

from .relay_oracle import StashedSlots

pytestmark = pytest.mark.clause("relay")


# Values at the edges of each buffer's dtype, mixed into the random ones: token id 0 (the smallest a stash accepts,
# one above the empty-slot sentinel), the largest int64, and for topk_index the negative edges a stash keeps as given.
_TOKEN_EDGES = (0, 1, 2**31 - 1, 2**31, 2**63 - 1)
_INDEX_EDGES = (0, -1, 2**63 - 1, -(2**63))
_PROBABILITY_EDGES = (0.0, -0.0, 1.0, 2.0**-149, float("inf"))


def _with_edges(values: torch.Tensor, edges: tuple, generator: torch.Generator) -> torch.Tensor:
    """``values`` with about a third of its elements replaced by one of ``edges``."""
    chosen = torch.tensor(edges, dtype=values.dtype)[torch.randint(0, len(edges), values.shape, generator=generator)]
    return torch.where(torch.rand(values.shape, generator=generator) < 1 / 3, chosen, values)


def _stash_random(relay: SpecExtrasRelay, slots: torch.Tensor, generator: torch.Generator,
                  stashed: StashedSlots | None = None, *, value_dtype: torch.dtype = torch.float32) -> None:
    """Stash random extras, edges included, in ``slots``; ``value_dtype`` is the dtype the caller hands
    ``topk_p`` and the hidden states in (the relay converts them to its buffers')."""
    count = slots.numel()
    values = dict(
        topk_p=_with_edges(torch.rand(count, relay.topk, generator=generator), _PROBABILITY_EDGES, generator),
        topk_index=_with_edges(torch.randint(0, 1 << 40, (count, relay.topk), generator=generator), _INDEX_EDGES,
                               generator),
        output_tokens=_with_edges(torch.randint(0, 1 << 40, (count,), generator=generator), _TOKEN_EDGES, generator),
    )
    if relay.hidden_states_buf is not None:
        values["hidden_states"] = torch.randn(count, relay.hidden_states_buf.shape[1], generator=generator)
    values["topk_p"] = values["topk_p"].to(value_dtype)
    if "hidden_states" in values:
        values["hidden_states"] = values["hidden_states"].to(value_dtype)
    moved = {k: v.to(relay.device) for k, v in values.items()}
    relay.stash(slots.to(relay.device), **moved)
    if stashed is not None:
        stashed.stash(slots, **moved)


@contextlib.contextmanager
def _caller_defaults(default_dtype: torch.dtype | None, default_device: str | None) -> Iterator[None]:
    """The caller's default dtype and default device while it builds the relay (None: as they are)."""
    previous = torch.get_default_dtype()
    with torch.device(default_device) if default_device is not None else contextlib.nullcontext():
        if default_dtype is not None:
            torch.set_default_dtype(default_dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)


@given(pool=st.one_of(st.sampled_from([1, 2, 3]), st.integers(1, 300)),
       topk=st.one_of(st.sampled_from([1, 2]), st.integers(1, 16)),
       hidden_size=st.sampled_from([None, 1, 64, 1025]),
       hidden_dtype=st.sampled_from([None, torch.bfloat16, torch.float16, torch.float32]),
       value_dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       steps=st.integers(1, 6), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       negative=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 2**32 - 1),
       mode=st.sampled_from(CALLING_MODES), pass_device=st.booleans(),
       default_dtype=st.sampled_from([None, torch.float64]), other_default_device=st.booleans())
def test_relay_matches_eager_relay(check_gather, device, pool, topk, hidden_size, hidden_dtype, value_dtype, steps,
                                   index_dtype, negative, seed, mode, pass_device, default_dtype,
                                   other_default_device):
    """The caller stashes and resolves in its autograd ``mode``. What each resolve hands out and which slots stay
    pending are checked against a plain record of what was stashed in each slot (:class:`StashedSlots`), not only
    against the relay's own buffers; slots are named by their negative alias with probability ``negative``. The
    relay is built as a caller may: without ``device=`` where it is the default (the CPU), without
    ``hidden_dtype=``, and under the caller's own default dtype and default device."""
    generator = torch.Generator().manual_seed(seed)
    options = {} if hidden_dtype is None else {"hidden_dtype": hidden_dtype}
    if pass_device or device.type != "cpu":
        options["device"] = device
    with _caller_defaults(default_dtype, ("meta" if device.type == "cpu" else "cpu") if other_default_device else None):
        relay = SpecExtrasRelay(pool, topk=topk, hidden_size=hidden_size, **options)
    stashed = StashedSlots(pool, topk, hidden_size, hidden_dtype or torch.bfloat16)
    calls = check_gather.anew()
    pending: list[int] = []

    def named(slots: list[int]) -> torch.Tensor:
        aliased = torch.rand(len(slots), generator=generator) < negative
        return torch.tensor([slot - pool if alias else slot for slot, alias in zip(slots, aliased.tolist())],
                            dtype=index_dtype)

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
        context = dict(seed=seed, pool=pool, topk=topk, hidden_size=hidden_size, hidden_dtype=hidden_dtype, step=step)
        with calling_mode(mode):
            if chosen:
                _stash_random(relay, named(chosen), generator, stashed, value_dtype=value_dtype)
            indices = named(resolved).to(device)
            stashed.resolve(indices, relay.resolve(indices), **context)
        pending = [slot for slot in pending if slot not in set(resolved)]
        stashed.check_pending(relay.pending_slots(), **context)


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


@pytest.mark.clause("relay-misuse")
@pytest.mark.parametrize("hidden_size", [None, 4])
@pytest.mark.parametrize("argument", ["pool", "topk", "hidden_size"])
@pytest.mark.parametrize("bad", [0, -1, -(2**31)])
def test_sizes_below_one_are_refused(device, argument, bad, hidden_size):
    sizes = dict(pool=3, topk=2, hidden_size=hidden_size)
    sizes[argument] = bad
    with pytest.raises(GatherContractError, match="pool >= 1, topk >= 1 and hidden_size >= 1"):
        SpecExtrasRelay(sizes.pop("pool"), **sizes, device=device)


def _misuses(slots: torch.Tensor, values: dict[str, torch.Tensor], held: torch.Tensor, *, pool: int,
             hidden_size: int | None) -> Iterator[tuple[str, str, torch.Tensor | list, dict | None, Any]]:
    """Every misuse of one stash of ``values`` into ``slots`` (valid ones) or one resolve of ``held`` (stashed
    slots): ``(what, the words its refusal must contain, slots, values or None for a resolve, the gather or None)``."""
    for edge in (pool, pool + 1, 2**31 - 1, -pool - 1, -(2**31)):  # at and past both edges of [-pool, pool)
        yield f"slot {edge}", "are outside", torch.cat([slots[:-1], torch.tensor([edge])]), values, None
        yield f"slot {edge}", "are outside", torch.cat([held[:-1], torch.tensor([edge])]), None, None
    for base, stash_values in ((slots, values), (held, None)):
        for form, bad in (("2-D", base.reshape(1, -1)), ("0-D", base[0]), ("float", base.double()),
                          ("bool", base > 0), ("int16", base.to(torch.int16)), ("list", base.tolist())):
            yield f"{form} slots", "must be a 1-D int32 or int64 tensor", bad, stash_values, None
    for twin in (int(slots[0]), int(slots[0]) - pool):  # the same slot, or its negative alias
        yield f"slot twice ({twin})", "name a slot twice", torch.cat([slots, torch.tensor([twin])]), \
            {name: torch.cat([value, value[:1]]) for name, value in values.items()}, None
    for name, value in values.items():
        reshaped = [torch.cat([value, value[:1]])]  # one row too many
        if len(value) > 1:
            reshaped.append(value[:1])  # a single row for every slot
        if value.dim() == 2:
            reshaped.append(torch.cat([value, value[:, :1]], dim=1))  # one column too many
        for bad in reshaped:
            yield f"{name} of shape {tuple(bad.shape)}", "must have shape", slots, {**values, name: bad}, None
    if hidden_size is None:
        yield "unexpected hidden_states", "keeps no hidden states", slots, \
            {**values, "hidden_states": torch.zeros(len(slots), 3)}, None
    else:
        missing = {name: value for name, value in values.items() if name != "hidden_states"}
        yield "no hidden_states", "hidden_states must have shape", slots, missing, None
    for negative in (-1, -2, -(2**63)):
        tokens = torch.cat([values["output_tokens"][:-1], torch.tensor([negative])])
        yield f"token {negative}", "output_tokens must be >= 0", slots, {**values, "output_tokens": tokens}, None
    for result, gather in (("three outputs", lambda *args: args[1:4]), ("five", lambda *args: (*args[1:5], None)),
                           ("None", lambda *args: None), ("a tensor", lambda *args: args[1]),
                           ("a dict", lambda *args: dict(enumerate(args[1:5])))):
        yield f"a gather returning {result}", "a gather must return", held, None, gather


@pytest.mark.clause("relay-misuse")
@given(pool=st.one_of(st.sampled_from([1, 2]), st.integers(1, 40)), topk=st.integers(1, 5),
       hidden_size=st.sampled_from([None, 1, 7]), count=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_every_misuse_is_refused_and_changes_nothing(check_gather, device, pool, topk, hidden_size, count, seed):
    """A relay refuses every misuse with a :class:`GatherContractError` that names it (slots outside [-pool, pool)
    at and past both edges, slots that are not a 1-D int32/int64 tensor, a slot named twice (by itself or its
    negative alias) in one stash, extras of the wrong shape, such as a (1, topk) ``topk_p`` for several slots,
    hidden states missing or unexpected, negative tokens, a gather that returns something else than four outputs),
    and a refused call changes nothing: the slots stashed before are still pending and resolve to what was stashed
    (:class:`StashedSlots`)."""
    generator = torch.Generator().manual_seed(seed)
    calls = check_gather.anew()
    relay = SpecExtrasRelay(pool, topk=topk, hidden_size=hidden_size, device=device, gather=calls.as_gather())
    stashed = StashedSlots(pool, topk, hidden_size, torch.bfloat16)
    held = torch.randperm(pool, generator=generator)[:max(1, pool // 2)].sort().values
    _stash_random(relay, held, generator, stashed)
    free = sorted(set(range(pool)) - set(held.tolist()))
    stash_slots = torch.tensor((free or held.tolist())[:count])
    values = dict(topk_p=torch.rand(len(stash_slots), topk),
                  topk_index=torch.zeros(len(stash_slots), topk, dtype=torch.int64),
                  output_tokens=torch.arange(len(stash_slots)))
    if hidden_size is not None:
        values["hidden_states"] = torch.randn(len(stash_slots), hidden_size)
    context = dict(pool=pool, topk=topk, hidden_size=hidden_size, seed=seed)
    for what, words, slots, given_values, gather in _misuses(stash_slots, values, held[:count], pool=pool,
                                                             hidden_size=hidden_size):
        relay.gather = gather or calls.as_gather()
        on_device = slots.to(device) if isinstance(slots, torch.Tensor) else slots
        try:
            if given_values is None:
                relay.resolve(on_device)
            else:
                relay.stash(on_device, **{name: value.to(device) for name, value in given_values.items()})
        except GatherContractError as refusal:
            assert words in str(refusal), f"the relay refused {what} with {str(refusal)!r}, not saying {words!r}"
        else:
            pytest.fail(f"the relay accepted {what} in a {'resolve' if given_values is None else 'stash'} "
                        f"(pool {pool}, topk {topk}, hidden_size {hidden_size}, slots {slots})")
        relay.gather = calls.as_gather()
        stashed.check_pending(relay.pending_slots(), **context, misuse=what)
    stashed.resolve(held.to(device), relay.resolve(held.to(device)), **context)
