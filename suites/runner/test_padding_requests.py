"""Padding requests: a batch whose request count a scheduler padded with zero-length requests replays like eager.

Engines pad the request count of a batch to a size they captured with trailing requests that have no
tokens (vLLM); cumulative sequence lengths then repeat their last entry, and attention that runs as an
eager break must handle a request with no tokens (vLLM #49302: zero-length padding requests crashed
eager attention breaks). Batches here carry padding requests (``ForwardBatch.padded_requests_to``),
beyond the bucket's token count too, with and without padding tokens, on the dense, MoE and
``index-checked`` models (whose attention walks cumulative sequence lengths and checks every row it
reads). Every call goes through ``check_run``: each request's logits and hidden states, the padding
requests' included, equal eager's on the same batch.

A runner tells per-token outputs (cut to the real tokens) from per-request ones (kept) by their leading
dimension, the bucket's rows: a batch with as many requests as its bucket has rows, and fewer real
tokens, is ambiguous, outside the contract (docs/runner.md), and never sent."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.models.index_checked import with_pool_slots
from harness.oracle import CALLING_MODES
from harness.plugin.profiles import capped_examples
from harness.runner import ForwardBatch
from harness.runner.cases import CONFIG, ambiguous_requests, lengths_strategy

pytestmark = pytest.mark.clause("several-requests")

MODELS = ("dense", "moe", "index-checked")
POOL_REQUESTS = 7  # the index-checked model's pool has 7 request slots (slot 0 is reserved for padding)

# (real request lengths, requests after padding, rows the batch arrives with or None, hidden mode, all logits)
CASES = [
    ((3,), 2, None, "none", False),  # one real request and one padding request
    ((1, 1, 1), 8, None, "last", False),  # decode requests padded past the bucket's 4 tokens
    ((5, 2, 6), 4, None, "full", False),
    ((2, 2), 4, None, "last", True),  # an exact fill of bucket 4: as many requests as rows, nothing cut
    ((4, 4), 5, None, "full", True),
    ((7, 9, 3, 1, 2), 16, None, "last", False),
    ((2, 3), 4, 7, "full", False),  # padding tokens it arrived with, and padding requests
    ((1,), 6, 3, "last", True),
    ((20, 15), 4, None, "last", False),  # past the largest bucket: runs eagerly
]


def _batch(model: Any, name: str, lengths: tuple[int, ...], requests: int, rows: int | None, *, seed: int,
           device: torch.device, hidden_mode: str, all_logits: bool) -> tuple[ForwardBatch, list[int]]:
    batch = ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=seed, device=device,
                                      hidden_mode=hidden_mode, all_logits=all_logits)
    slots: list[int] = []
    if name == "index-checked":
        slots = list(range(1, len(lengths) + 1))
        for slot, length in zip(slots, lengths):
            model.request_pool.allocate(slot, length)
        batch = with_pool_slots(batch, slots)
    batch = batch.padded_requests_to(requests)
    return (batch if rows is None else batch.padded_to(rows)), slots


@pytest.mark.parametrize("name", MODELS)
def test_padding_requests_replay_like_eager(zoo_runner, check_run, device, name):
    model, runner = zoo_runner(name)
    for index, (lengths, requests, rows, hidden_mode, all_logits) in enumerate(CASES):
        batch, slots = _batch(model, name, lengths, requests, rows, seed=index, device=device,
                              hidden_mode=hidden_mode, all_logits=all_logits)
        assert not ambiguous_requests(batch), f"case {index} is outside the contract: {batch.describe()}"
        try:
            check_run(runner, model, batch, mode=CALLING_MODES[index % len(CALLING_MODES)], model=name, case=index)
        finally:
            for slot in slots:
                model.request_pool.free(slot)


@pytest.mark.parametrize("name", ["dense", "index-checked"])
@capped_examples(10)
@given(lengths=lengths_strategy(), extra=st.integers(1, 12), seed=st.integers(0, 2**16),
       hidden_mode=st.sampled_from(["none", "last", "full"]), all_logits=st.booleans(),
       calling=st.sampled_from(CALLING_MODES))
def test_padding_requests_any_composition(zoo_runner, check_run, device, name, lengths, extra, seed, hidden_mode,
                                          all_logits, calling):
    """Any composition up to the largest bucket with 1-12 padding requests (one more where that count would be
    ambiguous)."""
    model, runner = zoo_runner(name)
    lengths = tuple(lengths if name != "index-checked" else lengths[:POOL_REQUESTS])
    batch, slots = _batch(model, name, lengths, len(lengths) + extra, None, seed=seed, device=device,
                          hidden_mode=hidden_mode, all_logits=all_logits)
    while ambiguous_requests(batch):
        batch = batch.padded_requests_to(batch.num_requests + 1)
    try:
        check_run(runner, model, batch, mode=calling, model=name, seed=seed)
    finally:
        for slot in slots:
            model.request_pool.free(slot)

