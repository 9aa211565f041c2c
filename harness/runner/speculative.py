"""The speculative-decode loop, as an engine's overlap scheduler runs it (:class:`SpeculativeLoop`).

The relay and gather, a :class:`DraftHead`, a verify batch through the runner and greedy acceptance;
``docs/runner.md`` (Decode and speculative decoding) describes a step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from harness.batch import ForwardBatch, HiddenMode, PagedKV, request_offsets
from harness.errors import UsageError
from harness.gather import SpecExtrasRelay
from harness.models import ModelConfig
from harness.runner.decode import DecodePlan, take_pages

__all__ = ["DraftHead", "SpecStep", "SpeculativeLoop"]


class DraftHead(nn.Module):
    """An EAGLE-style one-layer draft head: ``forward(hidden, tokens) -> (logits, next_hidden)``.

    ``next_hidden = tanh(fuse([hidden, embed(tokens)]))`` and ``logits = head(next_hidden)``;
    ``hidden=None`` (a draft without target hidden states) reads zeros in its place. Weights depend
    only on ``seed``; ``fuse`` starts near the identity on the hidden half, so the draft tracks the
    target's own prediction often enough for acceptance to vary.
    """

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        size = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, size)
        self.fuse = nn.Linear(2 * size, size, bias=False)
        self.head = nn.Linear(size, config.vocab_size, bias=False)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(self.embed.weight.shape, generator=generator))
            identity = torch.cat([torch.eye(size), torch.zeros(size, size)], dim=1)
            self.fuse.weight.copy_(identity + 0.2 * torch.randn(size, 2 * size, generator=generator) * size ** -0.5)
            self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=generator) * size ** -0.5)
        self.requires_grad_(False)
        self.eval()

    @classmethod
    def for_target(cls, target: nn.Module, *, seed: int = 0) -> DraftHead:
        """A draft head sharing the target's LM head (as EAGLE heads do), on its device and dtype."""
        config = target.config
        head = cls(config, seed=seed)
        lm_head = getattr(target, "lm_head", None)
        if lm_head is not None:
            with torch.no_grad():
                head.head.weight.copy_(lm_head.weight.float())
        weight = next(target.parameters())
        return head.to(device=weight.device, dtype=weight.dtype)

    def forward(self, hidden: torch.Tensor | None, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedded = self.embed(tokens)
        hidden = torch.zeros_like(embedded) if hidden is None else hidden.to(embedded.dtype)
        state = torch.tanh(self.fuse(torch.cat([hidden, embedded], dim=-1)))
        return self.head(state), state


@dataclasses.dataclass
class SpecStep:
    """One step: the verify batch, its request ids, each one's drafts (empty when it joined this
    step), the target's argmax at every verified position, the tokens appended (kept drafts and
    the bonus token), the number of drafts kept, and the target's outputs."""

    batch: ForwardBatch
    request_ids: tuple[int, ...]
    drafts: tuple[tuple[int, ...], ...]
    targets: tuple[tuple[int, ...], ...]
    appended: tuple[tuple[int, ...], ...]
    accepted: tuple[int, ...]
    logits: torch.Tensor
    hidden_states: torch.Tensor | None


@dataclasses.dataclass
class _Request:
    slot: int
    generated: list[int]
    pages: list[int]
    kv_len: int = 0


class SpeculativeLoop:
    """Steps a :class:`~harness.runner.decode.DecodePlan` with speculative decoding through
    ``forward(batch) -> LogitsOutput`` and ``relay``; ``tokens[i]`` is request ``i``'s output so far.

    ``hidden_mode`` is the target's hidden mode, ``"last"`` or ``"full"``, or ``"none"`` when the
    draft uses no hidden states (then the relay must keep none: ``hidden_size=None``).
    """

    def __init__(self, plan: DecodePlan, forward: Callable[[ForwardBatch], Any], *, draft: DraftHead,
                 relay: SpecExtrasRelay, num_draft: int = 2, hidden_mode: HiddenMode | str = HiddenMode.FULL,
                 device: torch.device | str = "cpu") -> None:
        self.hidden_mode = HiddenMode(hidden_mode)
        if (relay.hidden_states_buf is None) != (self.hidden_mode == HiddenMode.NONE):
            raise UsageError(f"hidden mode {self.hidden_mode} needs a relay "
                             f"{'without' if self.hidden_mode == HiddenMode.NONE else 'with'} a hidden-states buffer")
        if num_draft < 1:
            raise UsageError(f"num_draft must be >= 1, got {num_draft}")
        if len(plan.requests) > relay.pool:
            raise UsageError(f"{len(plan.requests)} requests may be live at once but the relay has {relay.pool} slots")
        self.plan, self.forward, self.draft, self.relay = plan, forward, draft, relay
        self.num_draft, self.device = num_draft, torch.device(device)
        self.free_pages = list(range(plan.num_pages))
        self.free_slots = list(range(relay.pool))
        self.live: dict[int, _Request] = {}
        self.tokens: dict[int, list[int]] = {}
        self.step_index = 0

    @property
    def done(self) -> bool:
        return self.plan.finished(self.tokens)

    def _admit(self) -> None:
        for index, request in enumerate(self.plan.requests):
            if request.join_step <= self.step_index and index not in self.tokens and index not in self.live:
                self.free_slots.sort()
                self.live[index] = _Request(self.free_slots.pop(0), [], [])

    def _propose(self, running: list[int]) -> dict[int, tuple[int, ...]]:
        """Resolve the running requests' extras through the relay and chain the draft head."""
        if not running:
            return {}
        slots = torch.tensor([self.live[i].slot for i in running], device=self.relay.device)
        extras = self.relay.resolve(slots)
        for position, index in enumerate(running):
            bonus, expected = int(extras.bonus_tokens[position]), self.live[index].generated[-1]
            if bonus != expected:  # the overlap scheduler trusts the relay; a wrong one derails the stream
                raise UsageError(f"step {self.step_index}: request {index} resolved bonus token {bonus} from slot "
                                 f"{self.live[index].slot}, but its last token is {expected}")
        chain = [extras.topk_index[:, 0]]
        hidden = extras.hidden_states
        with torch.no_grad():
            for _ in range(self.num_draft - 1):
                logits, state = self.draft(hidden, chain[-1])
                hidden = None if extras.hidden_states is None else state
                chain.append(logits.argmax(dim=-1))
        drafts = torch.stack(chain, dim=1).tolist()
        return {index: tuple(drafts[position]) for position, index in enumerate(running)}

    def step(self, force: SpecStep | None = None) -> SpecStep | None:
        """Run one step (``None`` when no request is live). ``force`` (teacher forcing, where a twin
        follows another loop within tolerances) replaces the drafts and the target's choices."""
        self._admit()
        ids = sorted(self.live)
        self.step_index += 1
        if not ids:
            return None
        running = [i for i in ids if self.live[i].kv_len]
        proposed = self._propose(running)
        if force is not None:
            if force.request_ids != tuple(ids):
                raise UsageError(f"forced step has requests {force.request_ids}, this loop {tuple(ids)}")
            proposed = {i: d for i, d in zip(ids, force.drafts) if d}
        fresh_of = {i: ([self.live[i].generated[-1], *proposed[i]] if i in proposed
                        else list(self.plan.requests[i].prompt)) for i in ids}
        tokens, positions, slots, lengths, kv_lens, tables = [], [], [], [], [], []
        size = self.plan.block_size
        for index in ids:
            state, fresh = self.live[index], fresh_of[index]
            kv_len = state.kv_len + len(fresh)
            take_pages(self.free_pages, state.pages, kv_len, plan=self.plan, step=self.step_index)
            tokens += fresh
            positions += range(state.kv_len, kv_len)
            slots += [state.pages[p // size] * size + p % size for p in range(state.kv_len, kv_len)]
            lengths.append(len(fresh))
            kv_lens.append(kv_len)
            tables.append(tuple(state.pages))
        starts, last = request_offsets(lengths)
        kv = PagedKV(torch.tensor(slots, device=self.device), tuple(kv_lens), tuple(tables), size)
        batch = ForwardBatch(torch.tensor(tokens, device=self.device), torch.tensor(positions, device=self.device),
                             tuple(lengths), starts, torch.tensor(last, device=self.device), self.hidden_mode,
                             True, kv=kv)
        output = self.forward(batch)
        self._check_output(output, batch)
        argmax = output.next_token_logits.argmax(dim=-1).tolist()
        drafts, targets, appended, accepted, picks = [], [], [], [], []
        for position, (index, start) in enumerate(zip(ids, starts)):
            state, draft = self.live[index], tuple(proposed.get(index, ()))
            verified = tuple(argmax[start:start + lengths[position]])
            if force is not None:
                verified = force.targets[position]
            if draft:
                kept = 0
                while kept < len(draft) and draft[kept] == verified[kept]:
                    kept += 1
                new = (*draft[:kept], verified[kept])
                state.kv_len += 1 + kept  # the bonus token sent and the kept drafts stay in the cache
            else:
                kept, new = 0, (verified[-1],)
                state.kv_len += len(fresh_of[index])
            # The draft reads the target hidden state the bonus token was predicted from ("full"),
            # or the request's last verified token, the only one a "last" capture keeps.
            picks.append(start + (kept if draft else lengths[position] - 1) if self.hidden_mode == HiddenMode.FULL
                         else position)
            budget = self.plan.requests[index].max_new_tokens - len(state.generated)
            state.generated += new[:budget]
            self.tokens[index] = list(state.generated)
            drafts.append(draft)
            targets.append(verified)
            appended.append(new[:budget])
            accepted.append(kept)
        self._stash(ids, picks, output.hidden_states)
        return SpecStep(batch, tuple(ids), tuple(drafts), tuple(targets), tuple(appended), tuple(accepted),
                        output.next_token_logits, output.hidden_states)

    def _check_output(self, output: Any, batch: ForwardBatch) -> None:
        """The verify step reads every token's logits and the hidden states its mode promises."""
        rows = {HiddenMode.FULL: batch.num_tokens, HiddenMode.LAST: batch.num_requests}.get(self.hidden_mode)
        logits, hidden = output.next_token_logits, output.hidden_states
        problems = []
        if logits.shape[0] != batch.num_tokens:
            problems.append(f"logits of shape {tuple(logits.shape)} for {batch.num_tokens} tokens")
        if (hidden is None) != (rows is None) or (hidden is not None and hidden.shape[0] != rows):
            got = None if hidden is None else tuple(hidden.shape)
            problems.append(f"hidden states of shape {got} for hidden mode {self.hidden_mode} ({rows} rows expected)")
        if problems:
            raise UsageError(f"step {self.step_index}: the target returned {' and '.join(problems)} "
                             f"for {batch.describe()}")

    def _stash(self, ids: Sequence[int], picks: Sequence[int], hidden_states: torch.Tensor | None) -> None:
        """Finished requests leave (pages and slot freed); the others stash the draft's next extras."""
        staying = []
        for index, pick in zip(ids, picks):
            state = self.live[index]
            if len(state.generated) >= self.plan.requests[index].max_new_tokens:
                self.free_pages += state.pages
                self.free_slots.append(self.live.pop(index).slot)
            else:
                staying.append((index, pick))
        if not staying:
            return
        bonus = torch.tensor([self.live[i].generated[-1] for i, _ in staying], device=self.device)
        target_hidden = None
        if self.hidden_mode != HiddenMode.NONE:
            target_hidden = hidden_states[torch.tensor([p for _, p in staying], device=hidden_states.device)]
        with torch.no_grad():
            logits, state = self.draft(target_hidden, bonus)
            topk_p, topk_index = logits.float().softmax(dim=-1).topk(self.relay.topk, dim=-1)
        self.relay.stash(torch.tensor([self.live[i].slot for i, _ in staying], device=self.relay.device),
                         topk_p=topk_p, topk_index=topk_index, output_tokens=bonus,
                         hidden_states=None if self.relay.hidden_states_buf is None else state)
