"""A decoder whose attention indexes a request pool and checks every row it reads (``index-checked``).

Engines' attention kernels index KV memory with per-token metadata: SGLang's read
``req_to_token[req_pool_index, position]`` for every row they are handed, the graph's padding rows
included, and a rotary or KV-cache kernel reads row ``position`` of its table. On CUDA an index out
of range reads memory that is not there: an illegal memory access, or silently another request's
KV. Runners that leave pad rows' metadata stale hit exactly that (SGLang #24401: pad rows kept the
positions of a previous, larger batch; #22958 / #26292: padded slots kept stale request-pool
indices). The zoo's other attention ignores pad rows and never looks at what they hold;
:func:`index_checked_attention` does the kernel's lookup for every row of its input and raises
:class:`~harness.errors.IllegalIndexError` naming the row where a kernel would go out of bounds, or
where a padding row holds anything but the padding fill (slot :data:`PADDING_POOL_SLOT`, position
:data:`PADDING_POSITION`), which a kernel would read and write as a live request's KV.

The metadata travels as the graph's inputs: ``positions`` and ``token_slots`` (per token, the
request-pool slot its request owns; a per-token side input of the batch, zero where the batch has
none, so the capture's dummy and padding rows address the reserved slot 0) are arguments of the
layer stack, so a replay reads them from the runner's static buffers, pad rows and all. Request
boundaries come from the live batch as cumulative sequence lengths, which repeat an entry for each
padding request (a request with no tokens); the kernel skips those.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from typing import Any

import torch
from torch import nn

from harness.batch import ForwardBatch, current_batch, forward_context
from harness.errors import IllegalIndexError, UsageError
from harness.graphs import eager_on_graph
from harness.models.engine import Attention, CausalLM, DecoderLayer, EngineModel, LogitsOutput, ModelConfig

__all__ = [
    "PADDING_POOL_SLOT",
    "PADDING_POSITION",
    "TOKEN_SLOTS",
    "RequestPool",
    "index_checked_attention",
    "with_pool_slots",
    "SlottedLM",
    "IndexCheckedLM",
]

PADDING_POOL_SLOT = 0  # the request-pool slot reserved for padding rows and the capture's dummy (as SGLang's slot 0)
PADDING_POSITION = 0  # the position of a padding row
TOKEN_SLOTS = "token_slots"  # the batch's side input: per token, the request-pool slot of its request


class RequestPool(nn.Module):
    """``req_to_token`` ``[pool_size, max_len]`` (int64): the KV location of each (slot, position), -1 where
    nothing is allocated. Slot :data:`PADDING_POOL_SLOT` is reserved: each of its positions resolves to the
    reserved KV location 0 (it serves the capture's dummy batch, and padding rows). :meth:`allocate` and
    :meth:`free` give a request its slot and take it back, as a scheduler does between steps.
    ``padding_rows_checked`` counts the padding rows the kernel has checked (tests use it to prove the check ran)."""

    req_to_token: torch.Tensor  # a buffer

    def __init__(self, *, pool_size: int, max_len: int) -> None:
        super().__init__()
        self.pool_size, self.max_len = pool_size, max_len
        table = torch.full((pool_size, max_len), -1, dtype=torch.int64)
        table[PADDING_POOL_SLOT] = 0
        self.register_buffer("req_to_token", table, persistent=False)
        self.padding_rows_checked = 0

    def allocated(self, slot: int) -> int:
        """How many positions of ``slot`` hold a KV location."""
        return int((self.req_to_token[slot] >= 0).sum())

    def allocate(self, slot: int, length: int) -> None:
        """Give a request slot ``slot`` with ``length`` positions (unique KV locations, never the reserved 0)."""
        if not 0 <= slot < self.pool_size or slot == PADDING_POOL_SLOT:
            raise UsageError(f"slot {slot} is not a request slot: slots 1..{self.pool_size - 1} are "
                             f"(slot {PADDING_POOL_SLOT} is reserved for padding)")
        if not 0 < length <= self.max_len:
            raise UsageError(f"a request of {length} positions does not fit a slot of {self.max_len}")
        if self.allocated(slot):
            raise UsageError(f"slot {slot} is in use ({self.allocated(slot)} positions); free it first")
        row = self.req_to_token[slot]
        row[:length] = torch.arange(length, device=row.device) + 1 + slot * self.max_len
        row[length:] = -1

    def free(self, slot: int) -> None:
        """Take slot ``slot`` back (its request finished): nothing in it is allocated any more."""
        if slot == PADDING_POOL_SLOT:
            raise UsageError(f"slot {PADDING_POOL_SLOT} is reserved for padding and is never freed")
        self.req_to_token[slot] = -1


def _row(batch: ForwardBatch, row: int, rows: int) -> str:
    real = batch.num_tokens
    if row >= real:
        return f"row {row} (a padding row: the live batch has {real} real tokens in {rows} rows)"
    request = bisect.bisect_right(list(itertools.accumulate(batch.seq_lens)), row)
    return f"row {row} (a token of request {request})"


def _first(mask: torch.Tensor) -> int | None:
    bad = mask.nonzero()
    return int(bad[0, 0]) if bad.numel() else None


def check_rows(positions: torch.Tensor, token_slots: torch.Tensor, batch: ForwardBatch, pool: RequestPool) -> None:
    """What the kernel reads, row by row, padding rows included: ``req_to_token[slot, position]`` must be in the
    table and allocated, and a padding row (past the live batch's real tokens) must hold the padding fill."""
    rows = positions.shape[0]
    if token_slots.shape != positions.shape:
        raise IllegalIndexError(f"the kernel got {tuple(token_slots.shape)} request-pool indices for "
                                f"{tuple(positions.shape)} positions")
    slots, where = token_slots.long(), positions.long()
    crash = "a kernel reading req_to_token there reads out of bounds: on CUDA an illegal memory access"
    bad = _first((slots < 0) | (slots >= pool.pool_size))
    if bad is not None:
        raise IllegalIndexError(f"{_row(batch, bad, rows)} holds request-pool index {int(slots[bad])}, outside "
                                f"[0, {pool.pool_size}): {crash}")
    bad = _first((where < 0) | (where >= pool.max_len))
    if bad is not None:
        raise IllegalIndexError(f"{_row(batch, bad, rows)} holds position {int(where[bad])}, outside "
                                f"[0, {pool.max_len}): {crash}")
    bad = _first(pool.req_to_token[slots, where] < 0)
    if bad is not None:
        slot = int(slots[bad])
        raise IllegalIndexError(
            f"{_row(batch, bad, rows)} reads req_to_token[{slot}, {int(where[bad])}], which is not allocated (slot "
            f"{slot} holds {pool.allocated(slot)} positions now; a stale index of a finished request reads its freed "
            f"slot): the kernel would read a KV location that is not there, on CUDA an illegal memory access")
    real = batch.num_tokens
    padding = (slots[real:] != PADDING_POOL_SLOT) | (where[real:] != PADDING_POSITION)
    bad = _first(padding)
    if bad is not None:
        row = real + bad
        raise IllegalIndexError(
            f"{_row(batch, row, rows)} holds request-pool index {int(slots[row])} at position {int(where[row])}, "
            f"not the padding fill (slot {PADDING_POOL_SLOT}, position {PADDING_POSITION}): a leftover of an earlier "
            f"batch or a copy of a real row, which the kernel reads and writes as a live request's KV")
    pool.padding_rows_checked += rows - real


@eager_on_graph
def index_checked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            token_slots: torch.Tensor, *, pool: RequestPool) -> torch.Tensor:
    """Causal attention within each request of the live batch, after checking every row's metadata
    (:func:`check_rows`); ``q, k, v``: ``[tokens, heads, dim]``, ``positions`` and ``token_slots``: ``[tokens]``.

    Request boundaries are cumulative sequence lengths, an entry repeated for each request with no tokens
    (a padding request): such a request has no query and no key, and is skipped."""
    batch = current_batch()
    rows = q.shape[0]
    bounds = [0, *itertools.accumulate(batch.seq_lens)]  # cu_seqlens
    if bounds[-1] > rows:
        raise ValueError(f"attention got {rows} tokens but the live batch describes {bounds[-1]}")
    check_rows(positions, token_slots, batch, pool)
    out = torch.zeros_like(q)  # padding rows attend to nothing
    scale = q.shape[-1] ** -0.5
    for start, end in zip(bounds, bounds[1:]):
        if end == start:  # a padding request
            continue
        length = end - start
        qs, ks, vs = (t[start:end].transpose(0, 1).float() for t in (q, k, v))
        scores = (qs @ ks.transpose(-1, -2)) * scale
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        out[start:end] = (probs @ vs).transpose(0, 1).to(q.dtype)
    return out


class _IndexCheckedAttention(Attention):
    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                token_slots: torch.Tensor | None = None) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).view(tokens, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.rotary(positions, q), self.rotary(positions, k)
        out = self.kernel(q, k, v.contiguous(), positions, token_slots)
        return self.o_proj(out.reshape(tokens, -1))


class _IndexCheckedLayer(DecoderLayer):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.self_attn = _IndexCheckedAttention(config)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                token_slots: torch.Tensor | None = None) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_norm(hidden), token_slots)
        return hidden + self.mlp(self.post_attention_norm(hidden))


class _IndexCheckedStack(EngineModel):
    """The layer stack: it takes the per-token request-pool slots as a keyword, so they are a graph input."""

    layer_class = _IndexCheckedLayer

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,  # type: ignore[override]
                input_embeds: torch.Tensor | None = None, *, token_slots: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids, input_embeds)
        for layer in self.decoder_layers:
            hidden = layer(positions, hidden, token_slots)
        return self.norm(hidden)


def with_pool_slots(batch: ForwardBatch, slots: tuple[int, ...] | list[int]) -> ForwardBatch:
    """``batch`` with each real request's request-pool slot as the per-token side input :data:`TOKEN_SLOTS`
    (one slot per real request; padding requests have no tokens). Pad it afterwards: padding rows get slot 0."""
    if batch.num_padding:
        raise UsageError("give the request-pool slots before padding the batch's tokens")
    if len(slots) != batch.num_real_requests:
        raise UsageError(f"{len(slots)} slots for {batch.num_real_requests} real requests")
    lengths = torch.tensor(batch.seq_lens[:batch.num_real_requests])
    per_token = torch.repeat_interleave(torch.tensor(list(slots), dtype=torch.int64), lengths)
    return batch.with_side_inputs(**{TOKEN_SLOTS: per_token.to(batch.device)})


class SlottedLM(CausalLM):
    """A :class:`CausalLM` whose stack takes each token's request-pool slot (the batch's ``token_slots`` side
    input) as the keyword ``token_slots``; a batch without them (the capture's dummy) addresses the reserved
    padding slot."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                input_embeds: torch.Tensor | None = None) -> LogitsOutput:
        with forward_context(batch):
            slots: Any = batch.side_inputs.get(TOKEN_SLOTS)
            if slots is None:  # a batch without slots (the capture's dummy) addresses the reserved slot
                slots = torch.full_like(input_ids, PADDING_POOL_SLOT)
            hidden = self.stack(input_ids, positions, batch, input_embeds, token_slots=slots)
            return self.logits_processor(hidden, batch)


class IndexCheckedLM(SlottedLM):
    """The dense :class:`CausalLM` with a :class:`RequestPool` at ``request_pool`` whose attention,
    :func:`index_checked_attention`, checks every row it reads (the stack stays at ``model.layers``)."""

    def __init__(self, config: ModelConfig, *, pool_size: int = 8, max_len: int = 64) -> None:
        stack = _IndexCheckedStack(config)
        super().__init__(config, stack)
        self.request_pool = RequestPool(pool_size=pool_size, max_len=max_len)
        for layer in stack.decoder_layers:
            attention: Any = layer.self_attn  # an _IndexCheckedAttention (nn.Module types attributes Tensor | Module)
            attention.kernel = functools.partial(index_checked_attention, pool=self.request_pool)

