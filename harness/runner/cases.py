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

__all__ = [
    "BUCKETS",
    "MAX_TOKENS",
    "SEED",
    "CONFIG",
    "make_batch",
    "eager",
    "eager_padded",
    "eager_forward",
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
    """A batch for zoo model ``model_name``; the side-input model gets a seeded DeepStack input."""
    batch = ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=seed, device=device,
                                      hidden_mode=hidden_mode, all_logits=all_logits)
    if model_name == "side-input":
        generator = torch.Generator().manual_seed(seed + 1)
        side = torch.randn(batch.num_tokens, CONFIG.hidden_size, generator=generator) * side_scale
        batch = batch.with_side_inputs(deepstack_embeds=side.to(device=device, dtype=dtype))
    return batch


def eager(model: torch.nn.Module, batch: ForwardBatch) -> Any:
    """The oracle: the same model run eagerly on the same (unpadded) batch, without autograd."""
    with torch.no_grad():
        return model(batch.input_ids, batch.positions, batch)


def eager_padded(model: torch.nn.Module, batch: ForwardBatch, bucket: int) -> LogitsOutput:
    """Eager on ``batch`` padded to ``bucket`` tokens, per-token outputs cut back to the real tokens:
    the same math as the unpadded oracle, run at the shapes a replay of ``bucket`` runs at."""
    out = eager(model, batch.padded_to(bucket))
    real = batch.num_tokens
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
