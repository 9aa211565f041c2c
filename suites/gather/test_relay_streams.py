"""The relay across two streams, as an overlap scheduler runs it (SGLang's FutureMap; the bug class of its PR 18958).

Stash runs on one stream and resolve on the other. What a call is handed is made on the other stream (the calling
stream waits for it, as a caller must) or on the calling stream itself (then only the relay orders the call after
its previous one); the producer drops its tensors as soon as the call returns and allocates tensors of the same
sizes at once, filled with other numbers (on CUDA the caching allocator hands it the blocks just freed unless the
relay recorded them on its stream). The resolved extras are read on the main stream, after it waits
for the resolving stream, and every gather the relay makes is checked against the oracle on its own stream;
what the relay hands out and keeps must equal an eager relay run on one stream, and what was stashed in each slot
(:class:`StashedSlots`). On the CPU the streams are the emulated model (:func:`harness.graphs.emulated_streams`),
which raises where CUDA could reorder or reuse memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from harness.compare import assert_equivalent
from harness.gather import SpecExtrasRelay
from harness.graphs import Streams, emulated_streams, streams_for

from .relay_oracle import StashedSlots

pytestmark = pytest.mark.clause("streams")

POOL, TOPK, STEPS = 24, 4, 5


@contextlib.contextmanager
def _streams(device: torch.device) -> Iterator[Streams]:
    if device.type == "cuda":
        yield streams_for(device)
    else:
        with emulated_streams() as model:
            yield model


def _made_on(streams: Streams, producer: object, values: dict[str, torch.Tensor],
             device: torch.device) -> dict[str, torch.Tensor]:
    """The producer's own copies of ``values`` on the device (a copy even where the device is the host's)."""
    with streams.on(producer):
        return {name: value.to(device, copy=True) for name, value in values.items()}


def _churn(streams: Streams, producer: object, shapes: list[tuple[tuple[int, ...], torch.dtype]],
           device: torch.device) -> list[torch.Tensor]:
    """The producer's next tensors, of the sizes it just dropped, written with zeros (slot 0 for indices: a relay
    reading them gives wrong extras, not an index error)."""
    with streams.on(producer):
        return [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in shapes]


def _shapes(tensors: dict[str, torch.Tensor]) -> list[tuple[tuple[int, ...], torch.dtype]]:
    return [(tuple(tensor.shape), tensor.dtype) for tensor in tensors.values()]


def _plan(generator: torch.Generator, hidden_size: int | None) -> list[dict]:
    """Each step's host data, drawn before any stream exists: the slots stashed and their extras, then the slots
    resolved (half of the pending ones, and one more)."""
    steps, pending = [], []
    for step in range(STEPS):
        free = [slot for slot in range(POOL) if slot not in pending]
        chosen = [free[i] for i in torch.randperm(len(free), generator=generator)[:2 + step].tolist()]
        values = dict(topk_p=torch.rand(len(chosen), TOPK, generator=generator),
                      topk_index=torch.randint(0, 1 << 40, (len(chosen), TOPK), generator=generator),
                      output_tokens=torch.randint(0, 1 << 40, (len(chosen),), generator=generator))
        if hidden_size is not None:
            values["hidden_states"] = torch.randn(len(chosen), hidden_size, generator=generator)
        pending += chosen
        order = torch.randperm(len(pending), generator=generator).tolist()
        resolved = [pending[i] for i in order[:len(pending) // 2 + 1]]
        pending = [slot for slot in pending if slot not in resolved]
        steps.append(dict(stashed=chosen, stash=dict(slots=torch.tensor(chosen), **values), resolved=resolved,
                          indices=torch.tensor(resolved), pending=sorted(pending)))
    return steps


@pytest.mark.parametrize("hidden_size", [None, 33])
@pytest.mark.parametrize("stash_on, resolve_on", [("side", "main"), ("main", "side")],
                         ids=["stash-on-side", "resolve-on-side"])
def test_relay_across_two_streams_matches_the_eager_relay(check_gather, device, stash_on, resolve_on, hidden_size):
    plan = _plan(torch.Generator().manual_seed(18958 + (hidden_size or 0)), hidden_size)
    # The oracle runs first, on one stream: its host syncs between the streamed calls would order them.
    oracle = SpecExtrasRelay(POOL, topk=TOPK, hidden_size=hidden_size, device=device)
    expected = []
    for step in plan:
        oracle.stash(**{name: value.to(device) for name, value in step["stash"].items()})
        expected.append(vars(oracle.resolve(step["indices"].to(device))))
    calls = check_gather.anew()
    with _streams(device) as streams:
        roles = {"main": streams.current(), "side": streams.new_stream()}
        other = {"main": roles["side"], "side": roles["main"]}
        relay = SpecExtrasRelay(POOL, topk=TOPK, hidden_size=hidden_size, device=device)
        resolved = []
        for number, step in enumerate(plan):
            # Even steps hand each call tensors made on the other stream, which the calling stream waits for: the
            # relay must keep them alive on its stream. Odd steps make them on the calling stream, so nothing but
            # the relay itself orders this call after its previous one on the other stream.
            stash_from, resolve_from = ((other[stash_on], other[resolve_on]) if number % 2 == 0
                                        else (roles[stash_on], roles[resolve_on]))
            made = _made_on(streams, stash_from, step["stash"], device)
            with streams.on(roles[stash_on]):
                streams.wait_stream(stash_from)
                relay.stash(made.pop("slots"), **made)
            shapes = _shapes(made) + [((len(step["stashed"]),), torch.int64)]
            del made  # the producer's references go at once, and its next tensors take their sizes
            churned = _churn(streams, stash_from, shapes, device)

            relay.gather = calls.as_gather(step=number, stash_on=stash_on, resolve_on=resolve_on,
                                           hidden_size=hidden_size, stashed_slots=step["stashed"],
                                           resolved_slots=step["resolved"])
            indices = _made_on(streams, resolve_from, {"indices": step["indices"]}, device)["indices"]
            with streams.on(roles[resolve_on]):
                streams.wait_stream(resolve_from)
                resolved.append(vars(relay.resolve(indices)))
            del indices
            churned += _churn(streams, resolve_from, [((len(step["resolved"]),), torch.int64)], device)

        # The main stream reads what the relay handed out and kept only now, after waiting for the resolving
        # stream and recording the extras on itself, as the relay's contract asks of a caller on another stream.
        streams.wait_stream(roles[resolve_on])
        for extras in resolved:
            streams.record(*extras.values())
        context = dict(stash_on=stash_on, resolve_on=resolve_on, hidden_size=hidden_size,
                       resolved_slots=[step["resolved"] for step in plan])
        assert_equivalent(resolved, expected, exact=True, context=context)
        stashed = StashedSlots(POOL, TOPK, hidden_size, torch.bfloat16)  # what was stashed, not another relay
        for number, (step, extras) in enumerate(zip(plan, resolved)):
            values = dict(step["stash"])
            stashed.stash(values.pop("slots"), **values)
            stashed.resolve(step["indices"], extras, **context, step=number)
        stashed.check_pending(relay.pending_slots(), **context)
        assert relay.pending_slots() == oracle.pending_slots() == plan[-1]["pending"], (
            f"the relay holds slots {relay.pending_slots()}, the eager relay {oracle.pending_slots()}; stashed and "
            f"not resolved: {plan[-1]['pending']}")
        buffers = ("topk_p_buf", "topk_index_buf", "output_tokens_buf", "hidden_states_buf")
        assert_equivalent({name: getattr(relay, name) for name in buffers},
                          {name: getattr(oracle, name) for name in buffers}, exact=True,
                          context={**context, "compared": "the relay's buffers after the last step"})
