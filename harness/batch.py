"""The engine's inputs: :class:`ForwardBatch`, hidden-state modes, buckets, paged-KV metadata.

Safe to use: :class:`ForwardBatch` (``from_lengths``, ``padded_to``), :func:`select_bucket`,
:class:`PagedKV` and :data:`PAD_SLOT`, and :func:`forward_context` / :func:`current_batch`, through which
runners publish the live batch that attention reads out of band (a captured graph freezes arguments,
an eager break does not). ``docs/runner.md`` describes batches."""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from harness.errors import BatchError, BucketError, UsageError

__all__ = [
    "HiddenMode",
    "ForwardBatch",
    "PagedKV",
    "PAD_SLOT",
    "validate_buckets",
    "select_bucket",
    "request_offsets",
    "forward_context",
    "current_batch",
    "published_batch",
]

PAD_SLOT = -1  # the slot of a padding token: attention writes nothing for it (vLLM's convention)


class HiddenMode(str, enum.Enum):
    """Which hidden states a forward returns: none, each request's last token, or every token."""

    NONE = "none"
    LAST = "last"
    FULL = "full"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, eq=False)
class PagedKV:
    """Paged-KV-cache metadata of a batch: ``slot_mapping`` (int64 device tensor, one cache slot per
    packed token, :data:`PAD_SLOT` for padding), and per request its ``kv_lens`` (tokens in the cache
    after this step, its new tokens included) and ``block_tables`` (the cache pages it owns, in
    order; slot ``page * block_size + offset``)."""

    slot_mapping: torch.Tensor
    kv_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    block_size: int

    def slots_of(self, request: int) -> list[int]:
        """The cache slots request ``request`` reads, in token order."""
        pages, size = self.block_tables[request], self.block_size
        return [pages[i // size] * size + i % size for i in range(self.kv_lens[request])]

    def padded_to(self, num_tokens: int) -> PagedKV:
        extra = num_tokens - self.slot_mapping.shape[0]
        if not extra:
            return self
        pad = self.slot_mapping.new_full((extra,), PAD_SLOT)
        return dataclasses.replace(self, slot_mapping=torch.cat([self.slot_mapping, pad]))


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardBatch:
    """Packed tokens of ``num_requests`` requests, plus ``num_padding`` padding tokens at the end.

    The last ``num_padding_requests`` requests may be padding requests with no tokens (a scheduler that pads
    the request count to a size it captured, as vLLM does; :meth:`padded_requests_to`); every other request
    has at least one token. A padding request starts at the real tokens' end, so its ``last_indices`` entry
    is the last real token (``cu_seqlens`` repeat their final entry for it).

    ``last_indices`` is a device tensor (each request's last token) so that graph-captured code can
    follow it when it is refreshed in place. ``side_inputs`` maps a layer-stack keyword to a
    per-token tensor; ``kv`` the paged-KV-cache metadata of a decode batch (``None`` without a
    cache). Build one with :meth:`from_lengths`; the constructor checks consistency.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: tuple[int, ...]
    start_offsets: tuple[int, ...]
    last_indices: torch.Tensor
    hidden_mode: HiddenMode = HiddenMode.NONE
    all_logits: bool = False
    side_inputs: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    num_padding: int = 0
    kv: PagedKV | None = None
    num_padding_requests: int = 0

    def __post_init__(self) -> None:
        lengths = self.seq_lens
        if not lengths:
            raise BatchError("a batch needs at least one request; got an empty list of request lengths")
        padding = self.num_padding_requests
        if not isinstance(padding, int) or isinstance(padding, bool) or not 0 <= padding < len(lengths):
            raise BatchError(f"num_padding_requests is {padding!r}; a batch of {len(lengths)} requests pads "
                             f"0 to {len(lengths) - 1} of them (at least one request is real)")
        real = len(lengths) - padding
        bad = [(i, n) for i, n in enumerate(lengths[:real]) if not isinstance(n, int) or n <= 0]
        if bad:
            index, length = bad[0]
            raise BatchError(
                f"request {index} has length {length!r}; every request needs at least one token "
                f"(lengths {list(lengths)})"
            )
        bad = [(real + i, n) for i, n in enumerate(lengths[real:]) if n != 0 or isinstance(n, bool)]
        if bad:
            index, length = bad[0]
            raise BatchError(f"request {index} is a padding request (the last {padding}) but has length {length!r}; "
                             f"padding requests have no tokens (lengths {list(lengths)})")
        expected_starts, _ = request_offsets(lengths)
        if tuple(self.start_offsets) != expected_starts:
            raise BatchError(f"start offsets {self.start_offsets} do not match request lengths {lengths}")
        total = sum(lengths) + self.num_padding
        for name, tensor in (("input_ids", self.input_ids), ("positions", self.positions),
                             *((f"side input {k!r}", v) for k, v in self.side_inputs.items())):
            if tensor.dim() < 1 or tensor.shape[0] != total:
                raise BatchError(
                    f"{name} has shape {tuple(tensor.shape)} but the batch has {sum(lengths)} tokens "
                    f"+ {self.num_padding} padding; its first dimension must be {total}"
                )
        if tuple(self.last_indices.shape) != (len(lengths),):
            raise BatchError(f"last_indices has shape {tuple(self.last_indices.shape)}, expected ({len(lengths)},)")
        if self.kv is not None:
            if tuple(self.kv.slot_mapping.shape) != (total,):
                raise BatchError(f"slot_mapping has shape {tuple(self.kv.slot_mapping.shape)}, expected ({total},)")
            if padding:
                raise BatchError("padding requests of a paged-KV batch are not supported: pad the request count of "
                                 "a batch without kv")
            if len(self.kv.kv_lens) != len(lengths) or len(self.kv.block_tables) != len(lengths):
                raise BatchError(f"kv_lens and block_tables need one entry per request ({len(lengths)})")
            short = [i for i, (n, kv) in enumerate(zip(lengths, self.kv.kv_lens)) if kv < n]
            if short:
                raise BatchError(f"request {short[0]} has {lengths[short[0]]} new tokens but kv length "
                                 f"{self.kv.kv_lens[short[0]]}; the cache holds the new tokens too")
        object.__setattr__(self, "hidden_mode", HiddenMode(self.hidden_mode))

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    @property
    def num_real_requests(self) -> int:
        """Requests with tokens: every request but the trailing padding requests."""
        return len(self.seq_lens) - self.num_padding_requests

    @property
    def num_tokens(self) -> int:
        """Real tokens, padding excluded."""
        return sum(self.seq_lens)

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], *, vocab_size: int, seed: int = 0,
                     device: torch.device | str = "cpu", hidden_mode: HiddenMode | str = HiddenMode.NONE,
                     all_logits: bool = False, side_inputs: Mapping[str, torch.Tensor] | None = None) -> ForwardBatch:
        """Requests of the given lengths, token ids drawn from ``seed``, positions from 0 in each."""
        lengths = tuple(lengths)
        if not lengths:
            raise BatchError("a batch needs at least one request; got an empty list of request lengths")
        for index, length in enumerate(lengths):
            if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
                raise BatchError(
                    f"request {index} has length {length!r}; every request needs at least one token "
                    f"(lengths {list(lengths)})"
                )
        try:
            mode = HiddenMode(hidden_mode)
        except ValueError:
            raise BatchError(
                f"unknown hidden-state mode {hidden_mode!r}; choose one of {[m.value for m in HiddenMode]}"
            ) from None
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (sum(lengths),), generator=generator)
        positions = torch.cat([torch.arange(n) for n in lengths])
        starts, last = request_offsets(lengths)
        return cls(ids.to(device), positions.to(device), lengths, starts, torch.tensor(last, device=device), mode,
                   all_logits, dict(side_inputs or {}))

    @classmethod
    def concatenate(cls, batches: Sequence[ForwardBatch]) -> ForwardBatch:
        """One batch holding the requests of ``batches`` in order (unpadded), with their tokens and side inputs;
        modes come from the first batch."""
        if not batches or any(batch.num_padding or batch.num_padding_requests for batch in batches):
            raise BatchError("concatenate needs at least one batch, none of them padded")
        lengths = tuple(n for batch in batches for n in batch.seq_lens)
        starts, last = request_offsets(lengths)
        first = batches[0]
        sides = {name: torch.cat([b.side_inputs[name] for b in batches]) for name in first.side_inputs}
        return cls(torch.cat([b.input_ids for b in batches]), torch.cat([b.positions for b in batches]), lengths,
                   starts, torch.tensor(last, device=first.device), first.hidden_mode, first.all_logits, sides)

    @classmethod
    def dummy(cls, num_tokens: int, *, device: torch.device | str = "cpu") -> ForwardBatch:
        """One request of ``num_tokens`` zero tokens: what runners capture with."""
        return cls.from_lengths([num_tokens], vocab_size=1, device=device)

    def with_side_inputs(self, **tensors: torch.Tensor) -> ForwardBatch:
        return dataclasses.replace(self, side_inputs={**self.side_inputs, **tensors})

    def padded_to(self, num_tokens: int) -> ForwardBatch:
        """This batch with zero tokens appended up to ``num_tokens`` (ids, positions, side inputs)."""
        current = self.input_ids.shape[0]
        if num_tokens < current:
            raise BucketError(f"cannot pad a batch of {current} tokens down to {num_tokens}")
        extra = num_tokens - current

        def pad(tensor: torch.Tensor) -> torch.Tensor:
            return torch.cat([tensor, tensor.new_zeros((extra, *tensor.shape[1:]))]) if extra else tensor

        # Autocast off: padding is a copy, and cat is one of autocast's promoting ops (under a caller's CPU autocast
        # to float16 it refuses bfloat16 rows, where the eager model the batch is for runs).
        with torch.autocast(self.input_ids.device.type, enabled=False):
            return dataclasses.replace(
                self, input_ids=pad(self.input_ids), positions=pad(self.positions),
                side_inputs={k: pad(v) for k, v in self.side_inputs.items()}, num_padding=self.num_padding + extra,
                kv=None if self.kv is None else self.kv.padded_to(num_tokens),
            )

    def padded_requests_to(self, num_requests: int) -> ForwardBatch:
        """This batch with padding requests (no tokens) appended up to ``num_requests`` requests: each starts
        at the real tokens' end, its ``last_indices`` entry is the last real token. Tokens are unchanged
        (pad them with :meth:`padded_to`)."""
        extra = num_requests - self.num_requests
        if extra < 0:
            raise BatchError(f"cannot pad a batch of {self.num_requests} requests down to {num_requests}")
        if not extra:
            return self
        if self.kv is not None:
            raise BatchError("padding requests of a paged-KV batch are not supported: pad the request count of "
                             "a batch without kv")
        lengths = (*self.seq_lens, *(0,) * extra)
        starts, last = request_offsets(lengths)
        return dataclasses.replace(
            self, seq_lens=lengths, start_offsets=starts,
            last_indices=torch.cat([self.last_indices, self.last_indices.new_full((extra,), last[-1])]),
            num_padding_requests=self.num_padding_requests + extra)

    def describe(self) -> str:
        """One line for failure messages: request lengths, padding, modes, side inputs."""
        sides = f", side inputs {sorted(self.side_inputs)}" if self.side_inputs else ""
        requests = (f" ({self.num_padding_requests} of them padding requests)" if self.num_padding_requests
                    else "")
        return (f"{self.num_requests} requests{requests} of lengths {list(self.seq_lens)} ({self.num_tokens} tokens"
                f"{f' + {self.num_padding} padding' if self.num_padding else ''}), hidden_mode={self.hidden_mode}, "
                f"all_logits={self.all_logits}{sides}")

    def __repr__(self) -> str:
        return f"ForwardBatch({self.describe()})"


def request_offsets(lengths: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where each packed request starts, and where its last token is."""
    starts = tuple(sum(lengths[:i]) for i in range(len(lengths)))
    return starts, tuple(start + length - 1 for start, length in zip(starts, lengths))


def validate_buckets(buckets: Iterable[int]) -> tuple[int, ...]:
    """Sorted, distinct, positive token counts; raises :class:`BucketError` saying what is wrong."""
    values = list(buckets)
    if not values:
        raise BucketError("no buckets given: a runner needs at least one token-count bucket")
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise BucketError(f"bucket {value!r} is not a positive token count (buckets {values})")
    if len(set(values)) != len(values):
        raise BucketError(f"buckets repeat a size: {values}")
    return tuple(sorted(values))


def select_bucket(num_tokens: int, buckets: Sequence[int]) -> int:
    """The smallest of the sorted ``buckets`` that holds ``num_tokens``; :class:`BucketError` if none."""
    index = bisect.bisect_left(buckets, num_tokens)
    if index == len(buckets):
        raise BucketError(
            f"a batch of {num_tokens} tokens fits no bucket: the largest captured bucket is {buckets[-1]} "
            f"(buckets {list(buckets)})"
        )
    return buckets[index]


# Per thread and per asyncio task, like the capture state of harness.graphs.
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("harness_forward_batch", default=None)


@contextlib.contextmanager
def forward_context(batch: Any) -> Iterator[Any]:
    """Make ``batch`` the live batch until the block ends (nesting restores the outer one)."""
    token = _CURRENT.set(batch)
    try:
        yield batch
    finally:
        _CURRENT.reset(token)


def published_batch() -> Any:
    """The live batch, or ``None`` when no forward context is published (for checks, not attention)."""
    return _CURRENT.get()


def current_batch() -> Any:
    """The live batch; raises :class:`UsageError` outside :func:`forward_context`."""
    batch = _CURRENT.get()
    if batch is None:
        raise UsageError(
            "attention ran outside a forward context: call the model's top-level forward, or wrap the "
            "call in harness.models.forward_context(batch)"
        )
    return batch
