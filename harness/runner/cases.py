"""Case builders of the runner suites: buckets, batches, hypothesis strategies and the eager oracle.

:func:`eager` is the oracle (eager, no autograd); :func:`eager_padded` is eager at the replay's shapes,
bitwise where :func:`harness.compare.bitwise_expected` says so."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from harness.batch import ForwardBatch, select_bucket
from harness.models import LogitsOutput, ModelConfig
from harness.runner.runner import map_tensors

__all__ = [
    "BUCKETS",
    "MAX_TOKENS",
    "SEED",
    "CONFIG",
    "make_batch",
    "eager",
    "eager_padded",
    "eager_forward",
    "TwinSteps",
    "STATE_MODULES",
    "ambiguous_requests",
    "stateless_parts",
    "lengths_strategy",
    "split_strategy",
]

BUCKETS = (4, 8, 16, 32)
MAX_TOKENS = BUCKETS[-1]
MAX_REQUESTS = 16
SEED = 1234
CONFIG = ModelConfig()
# Totals at and just past every bucket: where an off-by-one in bucket choice or slicing shows.
BUCKET_EDGES = tuple(sorted({n for b in BUCKETS for n in (b, b + 1) if n <= MAX_TOKENS}))


def make_batch(model_name: str, lengths: list[int] | tuple[int, ...], *, seed: int, dtype: torch.dtype,
               device: torch.device, hidden_mode: str = "none", all_logits: bool = False,
               side_scale: float = 1.0) -> ForwardBatch:
    """A batch for zoo model ``model_name``; the side-input model gets a seeded DeepStack input, the in-place-args
    model a seeded residual (which its stack writes)."""
    batch = ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=seed, device=device,
                                      hidden_mode=hidden_mode, all_logits=all_logits)
    if model_name == "side-input":
        generator = torch.Generator().manual_seed(seed + 1)
        side = torch.randn(batch.num_tokens, CONFIG.hidden_size, generator=generator) * side_scale
        batch = batch.with_side_inputs(deepstack_embeds=side.to(device=device, dtype=dtype))
    elif model_name == "in-place-args":
        generator = torch.Generator().manual_seed(seed + 1)
        residual = torch.randn(batch.num_tokens, CONFIG.hidden_size, generator=generator)
        batch = batch.with_side_inputs(residual=residual.to(device=device, dtype=dtype))
    return batch


def eager(model: torch.nn.Module, batch: ForwardBatch) -> Any:
    """The oracle: the same model run eagerly on the same (unpadded) batch, without autograd."""
    with torch.no_grad():
        return model(batch.input_ids, batch.positions, batch)


def eager_padded(model: torch.nn.Module, batch: ForwardBatch, bucket: int) -> Any:
    """Eager on ``batch`` padded to ``bucket`` tokens, per-token outputs cut back to the real tokens:
    the same math as the unpadded oracle, run at the shapes a replay of ``bucket`` runs at. A model handing out
    another structure than :class:`~harness.models.LogitsOutput` (a dict with auxiliary hidden states) gets every
    tensor of ``bucket`` rows cut."""
    out = eager(model, batch.padded_to(bucket))
    real = batch.num_tokens
    if not isinstance(out, LogitsOutput):
        return map_tensors(out, lambda tensor: tensor[:real] if tensor.dim() and tensor.shape[0] == bucket else tensor)
    logits = out.next_token_logits[:real] if batch.all_logits else out.next_token_logits
    hidden = out.hidden_states[:real] if str(batch.hidden_mode) == "full" else out.hidden_states
    return LogitsOutput(logits, hidden)


def eager_forward(model: torch.nn.Module, *, bitwise: bool) -> Callable[[ForwardBatch], Any]:
    """The oracle as a forward function, for loops that step a model (decode, speculative decoding):
    where the replay is held bitwise, eager at the shapes the replay runs at (the batch padded to its
    bucket of :data:`BUCKETS`); else eager on the batch itself."""

    def forward(batch: ForwardBatch) -> Any:
        if bitwise:
            return eager_padded(model, batch, select_bucket(batch.num_tokens, BUCKETS))
        return eager(model, batch)

    return forward


class TwinSteps:
    """The eager twin of a stepping loop (decode, speculative decoding) whose runner calls are checked against it:
    :meth:`run` is the twin's forward inside the check (the oracle of the runner's call on that batch), and
    :meth:`replay` hands its output to the twin's own loop, which must have built the same batch."""

    def __init__(self, forward: Callable[[ForwardBatch], Any], what: str) -> None:
        self.forward, self.what = forward, what
        self._pending: list[tuple[ForwardBatch, Any]] = []

    def run(self, batch: ForwardBatch) -> Any:
        output = self.forward(batch)
        self._pending.append((batch, output))
        return output

    def replay(self, batch: ForwardBatch) -> Any:
        if len(self._pending) != 1:
            raise AssertionError(f"{self.what}: the twin's loop stepped with {len(self._pending)} checked runner "
                                 "calls pending (one a step)")
        sent, output = self._pending.pop()
        same = (torch.equal(batch.input_ids, sent.input_ids) and torch.equal(batch.positions, sent.positions)
                and (batch.hidden_mode, batch.all_logits) == (sent.hidden_mode, sent.all_logits)
                and (batch.kv is None) == (sent.kv is None)
                and (batch.kv is None or (torch.equal(batch.kv.slot_mapping, sent.kv.slot_mapping)
                                          and batch.kv.kv_lens == sent.kv.kv_lens)))
        if not same:
            raise AssertionError(f"{self.what}: the eager twin's loop built {batch.describe()}, the runner's loop "
                                 f"sent {sent.describe()}")
        return output


def ambiguous_requests(batch: ForwardBatch, buckets: tuple[int, ...] = BUCKETS) -> bool:
    """Whether a runner could not tell ``batch``'s per-request outputs from its per-token ones (outside the
    contract): as many requests as the rows its outputs are cut from, and fewer real tokens. Those rows are the
    bucket's where it replays, the batch's own where it runs eagerly (a fell-back graph runs most batches so)."""
    rows = batch.num_tokens + batch.num_padding
    bucket = select_bucket(rows, buckets) if rows <= max(buckets) else rows
    return batch.num_requests in (bucket, rows) and batch.num_tokens != batch.num_requests


STATE_MODULES = ("kv_cache", "recurrent_state")  # the zoo models' state across calls: a KV cache, a recurrent state


def stateless_parts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's modules other than its state across calls (:data:`STATE_MODULES`): an eager twin writes state of
    its own, which the stepping suites compare with the runner's after every step."""
    return [module for name, module in model.named_children() if name not in STATE_MODULES]


def split_strategy(total: int, max_requests: int = MAX_REQUESTS) -> st.SearchStrategy[list[int]]:
    """Positive request lengths summing to ``total``."""
    most = min(max_requests, total)

    @st.composite
    def split(draw: Any) -> list[int]:
        count = draw(st.integers(1, most))
        cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=count - 1, max_size=count - 1,
                                    unique=True))) if count > 1 else []
        points = [0, *cuts, total]
        return [b - a for a, b in zip(points, points[1:])]

    return split()


def lengths_strategy(max_tokens: int = MAX_TOKENS) -> st.SearchStrategy[list[int]]:
    """1..16 requests whose total is anywhere up to ``max_tokens``, bucket edges favoured."""
    totals = st.one_of(st.sampled_from(BUCKET_EDGES), st.integers(1, max_tokens))
    return totals.flatmap(split_strategy)
