"""Batch sizes: every request's logits and hidden states equal eager on the same batch, for 1 to 16
requests up to the largest bucket, at and just past bucket edges, whatever shares the batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.errors import BucketError
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import BUCKET_EDGES, BUCKETS, MAX_TOKENS, lengths_strategy, make_batch, split_strategy

CASES = [
    ("dense", torch.float32),
    ("moe", torch.float32),
    ("vlm", torch.float32),
    ("side-input", torch.float32),
    ("dense", torch.bfloat16),
    ("moe", torch.bfloat16),
    ("dense", torch.float16),
]
MODES = st.sampled_from(["none", "last", "full"])
SEEDS = st.integers(0, 2**16)


def _case_id(case: tuple[str, torch.dtype]) -> str:
    return f"{case[0]}-{str(case[1]).removeprefix('torch.')}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@given(lengths=lengths_strategy(), seed=SEEDS, mode=MODES, all_logits=st.booleans())
def test_replay_matches_eager(zoo_runner, assert_matches_eager, device, case, lengths, seed, mode, all_logits):
    name, dtype = case
    model, runner = zoo_runner(name, dtype)
    batch = make_batch(name, lengths, seed=seed, dtype=dtype, device=device, hidden_mode=mode, all_logits=all_logits)
    bucket = select_bucket(batch.num_tokens, BUCKETS)
    before = (runner.stats.replays, runner.stats.eager_fallbacks, runner.stats.replays_by_bucket.get(bucket, 0))

    assert runner.can_run(batch), f"runner refuses {batch.describe()} though bucket {bucket} holds it"
    actual = runner.run(batch)

    after = (runner.stats.replays, runner.stats.eager_fallbacks, runner.stats.replays_by_bucket.get(bucket, 0))
    assert after == (before[0] + 1, before[1], before[2] + 1), (
        f"{batch.describe()} should replay bucket {bucket} once (replays, eager fallbacks, replays of bucket "
        f"{bucket}): before {before}, after {after}; replays by bucket {runner.stats.replays_by_bucket}")
    assert_matches_eager(actual, model, batch, dtype=dtype, name=name, seed=seed)


@pytest.mark.parametrize("total", BUCKET_EDGES)
def test_bucket_edges_replay_in_the_smallest_bucket(zoo_runner, assert_matches_eager, device, total):
    model, runner = zoo_runner("dense")
    assert runner.bucket_for(total) == select_bucket(total, BUCKETS)
    for lengths in ([total], [1] * min(total, 16) if total <= 16 else [total - 15] + [1] * 15):
        batch = make_batch("dense", lengths, seed=total, dtype=torch.float32, device=device, hidden_mode="full")
        bucket = select_bucket(total, BUCKETS)
        before = runner.stats.replays_by_bucket.get(bucket, 0)
        actual = runner.run(batch)
        assert runner.stats.replays_by_bucket.get(bucket, 0) == before + 1, (
            f"{batch.describe()} did not replay bucket {bucket}: {runner.stats.replays_by_bucket}")
        assert_matches_eager(actual, model, batch, dtype=torch.float32, name="dense", seed=total)


def test_past_the_largest_bucket_runs_eagerly(zoo_runner, assert_matches_eager, device):
    model, runner = zoo_runner("dense")
    batch = make_batch("dense", [MAX_TOKENS - 3, 4], seed=7, dtype=torch.float32, device=device, hidden_mode="last")
    assert not runner.can_run(batch)
    with pytest.raises(BucketError, match=str(MAX_TOKENS + 1)):
        runner.bucket_for(batch.num_tokens)
    with pytest.raises(BucketError):
        runner.replay(batch)
    fallbacks, replays = runner.stats.eager_fallbacks, runner.stats.replays
    actual = runner.run(batch)
    assert (runner.stats.eager_fallbacks, runner.stats.replays) == (fallbacks + 1, replays)
    assert_matches_eager(actual, model, batch, dtype=torch.float32, name="dense", replayed=False, seed=7)


@given(data=st.data(), total=st.integers(2, MAX_TOKENS), seed=SEEDS)
def test_equal_totals_with_different_splits(zoo_runner, assert_matches_eager, device, data, total, seed):
    model, runner = zoo_runner("moe")
    for split in (data.draw(split_strategy(total), label="split a"), data.draw(split_strategy(total), label="split b")):
        batch = make_batch("moe", split, seed=seed, dtype=torch.float32, device=device, hidden_mode="full")
        assert_matches_eager(runner.run(batch), model, batch, dtype=torch.float32, name="moe", seed=seed)


@pytest.mark.parametrize("name", ["dense", "side-input"])
@given(target=st.integers(1, 8), others=st.lists(st.integers(1, 6), min_size=1, max_size=6), data=st.data(), seed=SEEDS)
def test_a_request_does_not_depend_on_its_batchmates(zoo_runner, failure_context, device, name, target, others,
                                                     data, seed):
    model, runner = zoo_runner(name)
    alone = make_batch(name, [target], seed=seed, dtype=torch.float32, device=device, hidden_mode="full",
                       all_logits=True)
    split = data.draw(st.integers(0, len(others)), label="position among batchmates")
    before = sum(others[:split])
    head = make_batch(name, others[:split], seed=seed + 1, dtype=torch.float32, device=device, hidden_mode="full",
                      all_logits=True) if split else None
    parts = [p for p in (head, alone) if p is not None]
    if split < len(others):
        parts.append(make_batch(name, others[split:], seed=seed + 2, dtype=torch.float32, device=device,
                                hidden_mode="full", all_logits=True))
    shared = ForwardBatch.concatenate(parts)
    solo_out, shared_out = runner.run(alone), runner.run(shared)
    rows = slice(before, before + target)
    # Different buckets run different GEMM shapes, so this is a tolerance comparison on every backend.
    assert_equivalent(
        (shared_out.next_token_logits[rows], shared_out.hidden_states[rows]),
        (solo_out.next_token_logits, solo_out.hidden_states), exact=False,
        context=failure_context(model=name, seed=seed, batch=shared.describe(), dtype="torch.float32",
                                compared=f"the request of {target} tokens at position {split}, alone vs shared"),
    )
