"""Multi-step greedy decode over a paged KV cache, as an engine's scheduler drives it.

:class:`DecodePlan` lists requests; :class:`DecodeLoop` steps them through any ``forward(batch)`` (a
runner's ``run``, or eager); ``docs/runner.md`` (Decode and speculative decoding) describes a step."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from harness.batch import ForwardBatch, PagedKV, request_offsets
from harness.errors import BatchError

__all__ = ["DecodeRequest", "DecodePlan", "DecodeStep", "DecodeLoop", "take_pages"]


@dataclasses.dataclass(frozen=True)
class DecodeRequest:
    """A request: its prompt token ids, how many tokens to generate, the step it joins at."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    join_step: int = 0


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    requests: tuple[DecodeRequest, ...]
    num_pages: int
    block_size: int

    def finished(self, tokens: Mapping[int, Sequence[int]]) -> bool:
        """Whether every request has its ``max_new_tokens`` in ``tokens`` (request index -> its outputs)."""
        return all(len(tokens.get(i, ())) >= r.max_new_tokens for i, r in enumerate(self.requests))

    def describe(self) -> str:
        return "; ".join(f"r{i}: prompt {len(r.prompt)}, +{r.max_new_tokens} at step {r.join_step}"
                         for i, r in enumerate(self.requests))


@dataclasses.dataclass
class DecodeStep:
    """What one step ran and chose: the batch, the request ids in it, each one's next token."""

    batch: ForwardBatch
    request_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logits: torch.Tensor


def take_pages(free_pages: list[int], pages: list[int], kv_len: int, *, plan: DecodePlan, step: int) -> None:
    """Grow ``pages`` from ``free_pages`` (lowest first, so freed pages are reused) until they hold
    ``kv_len`` tokens; :class:`~harness.errors.BatchError` when the cache is out of pages."""
    needed = math.ceil(kv_len / plan.block_size) - len(pages)
    if needed > len(free_pages):
        raise BatchError(f"the KV cache is out of pages at step {step} ({plan.describe()})")
    free_pages.sort()
    pages += free_pages[:needed]
    del free_pages[:needed]


@dataclasses.dataclass
class _Live:
    generated: list[int]
    pages: list[int]
    kv_len: int = 0


class DecodeLoop:
    """Steps a :class:`DecodePlan` through ``forward``; ``tokens[i]`` is request ``i``'s output so far."""

    def __init__(self, plan: DecodePlan, forward: Callable[[ForwardBatch], Any], *,
                 device: torch.device | str = "cpu") -> None:
        self.plan, self.forward, self.device = plan, forward, torch.device(device)
        self.free_pages = list(range(plan.num_pages))
        self.live: dict[int, _Live] = {}
        self.tokens: dict[int, list[int]] = {}
        self.step_index = 0

    @property
    def done(self) -> bool:
        return self.plan.finished(self.tokens)

    def _allocate(self, state: _Live, kv_len: int) -> None:
        take_pages(self.free_pages, state.pages, kv_len, plan=self.plan, step=self.step_index)

    def step(self, force_tokens: Sequence[int] | None = None) -> DecodeStep | None:
        """Run one step (``None`` when no request is live this step). ``force_tokens`` replaces the
        chosen tokens (teacher forcing: a twin follows another loop's stream)."""
        for index, request in enumerate(self.plan.requests):
            if request.join_step == self.step_index or (request.join_step < self.step_index and index not in
                                                        self.tokens and index not in self.live):
                self.live[index] = _Live([], [])
        ids = sorted(self.live)
        self.step_index += 1
        if not ids:
            return None
        new_tokens, positions, lengths, slots, kv_lens, tables = [], [], [], [], [], []
        size = self.plan.block_size
        for index in ids:
            state = self.live[index]
            fresh = list(self.plan.requests[index].prompt) if state.kv_len == 0 else [state.generated[-1]]
            kv_len = state.kv_len + len(fresh)
            self._allocate(state, kv_len)
            new_tokens += fresh
            positions += range(state.kv_len, kv_len)
            slots += [state.pages[p // size] * size + p % size for p in range(state.kv_len, kv_len)]
            lengths.append(len(fresh))
            kv_lens.append(kv_len)
            tables.append(tuple(state.pages))
            state.kv_len = kv_len
        starts, last = request_offsets(lengths)
        kv = PagedKV(torch.tensor(slots, device=self.device), tuple(kv_lens), tuple(tables), size)
        batch = ForwardBatch(torch.tensor(new_tokens, device=self.device), torch.tensor(positions, device=self.device),
                             tuple(lengths), starts, torch.tensor(last, device=self.device), kv=kv)
        logits = self.forward(batch).next_token_logits
        chosen = tuple(int(t) for t in logits.argmax(dim=-1).tolist()) if force_tokens is None else tuple(force_tokens)
        for index, token in zip(ids, chosen):
            state = self.live[index]
            state.generated.append(token)
            self.tokens[index] = list(state.generated)
            if len(state.generated) >= self.plan.requests[index].max_new_tokens:
                self.free_pages += self.live.pop(index).pages  # finished: its slots go to the next request
        return DecodeStep(batch, tuple(ids), chosen, logits)
