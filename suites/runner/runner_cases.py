"""Batches, strategies and the comparison rule shared by the runner suites."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from harness.models import LogitsOutput, ModelConfig
from harness.runner import ForwardBatch

__all__ = [
    "BUCKETS",
    "MAX_TOKENS",
    "SEED",
    "CONFIG",
    "make_batch",
    "eager",
    "bitwise_possible",
    "eager_padded",
    "smallest_bucket",
    "lengths_strategy",
    "split_strategy",
    "concatenate",
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


def smallest_bucket(num_tokens: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    return min(b for b in buckets if b >= num_tokens)


def bitwise_possible(backend_name: str, dtype: torch.dtype) -> bool:
    """Whether a replay can be held to bitwise equality: the one rule every runner suite uses.

    Only float32 on the emulated backend, which replays eager's own kernels, and only against eager
    at the same shapes (:func:`eager_padded`): CPU BLAS picks kernels by the row count, so a row of
    a 2-row product may differ from the same row of a 4-row one (measured: ~5e-7). CUDA, where a
    captured GEMM may pick another algorithm, and bf16/fp16 use the tolerance table.
    """
    return backend_name == "emulated" and dtype == torch.float32


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


def concatenate(batches: list[ForwardBatch]) -> ForwardBatch:
    """One batch holding the requests of ``batches`` in order, with the same tokens and side inputs."""
    lengths = tuple(n for batch in batches for n in batch.seq_lens)
    starts = tuple(sum(lengths[:i]) for i in range(len(lengths)))
    first = batches[0]
    last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths)], device=first.device)
    sides = {name: torch.cat([b.side_inputs[name] for b in batches]) for name in first.side_inputs}
    return ForwardBatch(torch.cat([b.input_ids for b in batches]), torch.cat([b.positions for b in batches]),
                        lengths, starts, last, first.hidden_mode, first.all_logits, sides)
