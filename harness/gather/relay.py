"""A FutureMap-style relay of speculative-decoding extras between decode steps (:class:`SpecExtrasRelay`).

It stashes each step's extras in per-slot buffers and resolves them by slot through any gather; a slot
is read once per stash (``resolve`` resets it to :data:`SENTINEL`), and reading an unstashed or consumed
slot raises :class:`~harness.errors.GatherContractError`. Its calls may run on different streams (``docs/gather.md``,
Streams): each call's work is ordered after the previous call's, and the tensors it is given stay its own until
its stream is done with them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch

from harness.errors import GatherContractError
from harness.gather.reference import GatherOutputs, eager_gather
from harness.graphs import streams_for

__all__ = ["SENTINEL", "ResolvedExtras", "SpecExtrasRelay"]

SENTINEL = -1  # token ids are >= 0; a negative token in the buffer marks an empty slot


@dataclasses.dataclass(frozen=True)
class ResolvedExtras:
    topk_p: torch.Tensor
    topk_index: torch.Tensor
    bonus_tokens: torch.Tensor
    hidden_states: torch.Tensor | None

    @classmethod
    def of(cls, outputs: GatherOutputs) -> ResolvedExtras:
        if not isinstance(outputs, (tuple, list)) or len(outputs) != 4:
            raise GatherContractError(
                "a gather must return (topk_p, topk_index, bonus_tokens, hidden_states); "
                f"it returned {type(outputs).__name__}"
                + (f" of length {len(outputs)}" if isinstance(outputs, (tuple, list)) else ""))
        return cls(*outputs)


class SpecExtrasRelay:
    """Per-slot extras buffers; ``stash`` writes slots, ``resolve`` gathers and invalidates them.

    Buffers: ``topk_p`` float32 [pool, topk], ``topk_index`` int64 [pool, topk], ``output_tokens``
    int64 [pool] and, when ``hidden_size`` is given, ``hidden_states`` [pool, hidden_size].

    Each call runs on the caller's current stream, after the work of every earlier call on any stream, and
    records the tensors it is given on that stream, so the caller may drop them as soon as the call returns.
    The caller makes them ready on that stream (it waits for their producer), and ``resolve``'s outputs are
    ready on that stream only.
    """

    def __init__(self, pool: int, *, topk: int, hidden_size: int | None = None,
                 hidden_dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
                 gather: Callable[..., GatherOutputs] = eager_gather) -> None:
        if pool < 1 or topk < 1 or (hidden_size is not None and hidden_size < 1):
            raise GatherContractError(
                f"a relay needs pool >= 1, topk >= 1 and hidden_size >= 1 or None; "
                f"got pool={pool}, topk={topk}, hidden_size={hidden_size}")
        self.pool, self.topk, self.gather = pool, topk, gather
        self.topk_p_buf = torch.zeros(pool, topk, dtype=torch.float32, device=device)
        # The allocated buffer's device carries the index ("cuda:0"), so comparisons with tensors agree.
        self.device = self.topk_p_buf.device
        self.topk_index_buf = torch.zeros(pool, topk, dtype=torch.int64, device=self.device)
        self.output_tokens_buf = torch.full((pool,), SENTINEL, dtype=torch.int64, device=self.device)
        self.hidden_states_buf = (
            None if hidden_size is None
            else torch.zeros(pool, hidden_size, dtype=hidden_dtype, device=self.device))
        self._streams = streams_for(self.device)
        self._done = self._streams.mark()  # the buffers' last use: the next call, on any stream, waits for it

    @contextlib.contextmanager
    def _in_turn(self) -> Iterator[None]:
        """One call's work, on the current stream: after the previous call's, whichever stream that ran on."""
        self._streams.wait(self._done)
        try:
            yield
        finally:
            self._done = self._streams.mark()

    def _keep(self, *given: torch.Tensor | None) -> None:
        """Record the caller's tensors on the current stream: the call's last kernels may still be queued when the
        caller drops them, and their memory must not go to another stream's tensor before those kernels run."""
        self._streams.record(*(tensor for tensor in given if tensor is not None and tensor.device == self.device))

    def _check_slots(self, slots: torch.Tensor, what: str) -> None:
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
            described = (f"{slots.dim()}-D {slots.dtype}" if isinstance(slots, torch.Tensor)
                         else type(slots).__name__)
            raise GatherContractError(f"{what} must be a 1-D int32 or int64 tensor, got {described}")
        if slots.device != self.device:
            raise GatherContractError(f"{what} are on {slots.device} but the relay buffers are on {self.device}")
        if slots.numel() and not bool(((slots >= -self.pool) & (slots < self.pool)).all()):
            bad = slots[(slots < -self.pool) | (slots >= self.pool)]
            raise GatherContractError(
                f"{what} {bad[:8].tolist()} are outside [-{self.pool}, {self.pool}) for a pool of {self.pool}")

    def _check_values(self, name: str, value: torch.Tensor | None, buffer: torch.Tensor | None, count: int) -> None:
        if buffer is None:
            if value is not None:
                raise GatherContractError(f"{name} given but this relay keeps no hidden states (hidden_size=None)")
            return
        expected = (count, *buffer.shape[1:])
        if value is None or tuple(value.shape) != expected:
            got = "None" if value is None else tuple(value.shape)
            raise GatherContractError(f"{name} must have shape {expected} to fill {count} slots, got {got}")

    def stash(self, slots: torch.Tensor, *, topk_p: torch.Tensor, topk_index: torch.Tensor,
              output_tokens: torch.Tensor, hidden_states: torch.Tensor | None = None) -> None:
        """Write one step's extras into ``slots`` (distinct, in range); tokens must be >= 0."""
        with self._in_turn():
            self._check_slots(slots, "stash slots")
            wrapped = torch.remainder(slots.long(), self.pool)
            if wrapped.unique().numel() != wrapped.numel():
                raise GatherContractError(
                    f"stash slots {slots.tolist()} name a slot twice; each slot holds one request")
            count = slots.numel()
            for name, value, buffer in (("topk_p", topk_p, self.topk_p_buf),
                                        ("topk_index", topk_index, self.topk_index_buf),
                                        ("output_tokens", output_tokens, self.output_tokens_buf),
                                        ("hidden_states", hidden_states, self.hidden_states_buf)):
                self._check_values(name, value, buffer, count)
            if count and bool((output_tokens < 0).any()):
                raise GatherContractError(
                    f"output_tokens must be >= 0 (negative values are the relay's empty-slot sentinel), got "
                    f"{output_tokens[output_tokens < 0][:8].tolist()}")
            self._keep(slots, topk_p, topk_index, output_tokens, hidden_states)
            self.topk_p_buf[wrapped] = topk_p.to(self.topk_p_buf.dtype)
            self.topk_index_buf[wrapped] = topk_index.to(torch.int64)
            self.output_tokens_buf[wrapped] = output_tokens.to(torch.int64)
            if self.hidden_states_buf is not None and hidden_states is not None:  # both or neither: _check_values
                self.hidden_states_buf[wrapped] = hidden_states.to(self.hidden_states_buf.dtype)

    def resolve(self, indices: torch.Tensor) -> ResolvedExtras:
        """Gather the extras of ``indices`` through the relay's gather, then invalidate those slots."""
        with self._in_turn():
            self._check_slots(indices, "resolve indices")
            self._keep(indices)
            resolved = ResolvedExtras.of(self.gather(
                indices, self.topk_p_buf, self.topk_index_buf, self.output_tokens_buf, self.hidden_states_buf))
            if resolved.bonus_tokens.numel() and bool((resolved.bonus_tokens < 0).any()):
                empty = indices[resolved.bonus_tokens.reshape(-1) < 0]
                raise GatherContractError(
                    f"resolve read slots {empty[:8].tolist()} that hold no extras (never stashed, or already "
                    "consumed by an earlier resolve); the relay refuses to hand stale data to the next step")
            self.output_tokens_buf[indices.long()] = SENTINEL
            return resolved

    def pending_slots(self) -> list[int]:
        """Slots stashed and not consumed yet."""
        with self._in_turn():
            return (self.output_tokens_buf >= 0).nonzero().flatten().tolist()
