"""Batch sizes: every request's logits and hidden states equal eager on the same batch, for 1 to 16
requests up to the largest bucket, at and just past bucket edges, whatever shares the batch, in any
order of sizes and with the buckets given in any order; past the largest bucket a batch runs eagerly.
Every call goes through ``check_run`` (harness.oracle) under a drawn calling mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.errors import BucketError
from harness.models import build_model
from harness.oracle import CALLING_MODES
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import (
    BUCKET_EDGES,
    BUCKETS,
    MAX_TOKENS,
    SEED,
    lengths_strategy,
    make_batch,
    split_strategy,
)

CASES = [
    ("dense", torch.float32),
    ("moe", torch.float32),
    ("vlm", torch.float32),
    ("side-input", torch.float32),
    ("dense", torch.bfloat16),
    ("moe", torch.bfloat16),
    ("dense", torch.float16),
]
pytestmark = pytest.mark.clause("replay-equals-eager")

MODES = st.sampled_from(["none", "last", "full"])
CALLING = st.sampled_from(CALLING_MODES)
SEEDS = st.integers(0, 2**16)


def _case_id(case: tuple[str, torch.dtype]) -> str:
    return f"{case[0]}-{str(case[1]).removeprefix('torch.')}"


def _counters(runner, bucket: int | None) -> tuple[int, int, int]:
    stats = runner.stats
    return stats.replays, stats.eager_fallbacks, stats.replays_by_bucket.get(bucket, 0) if bucket else 0


def _assert_one_call_counted(runner, batch: ForwardBatch, bucket: int | None, before: tuple[int, int, int]) -> None:
    __tracebackhide__ = True
    after = _counters(runner, bucket)
    wanted = (before[0] + 1, before[1], before[2] + 1) if bucket else (before[0], before[1] + 1, before[2])
    assert after == wanted, (
        f"{batch.describe()} should " + (f"replay bucket {bucket} once" if bucket else "run eagerly once (no bucket "
                                         "holds it)")
        + f" (replays, eager fallbacks, replays of that bucket): before {before}, after {after}; replays by bucket "
        f"{runner.stats.replays_by_bucket}")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@given(lengths=lengths_strategy(MAX_TOKENS + 4), seed=SEEDS, mode=MODES, all_logits=st.booleans(), calling=CALLING)
def test_replay_matches_eager(zoo_runner, check_run, device, case, lengths, seed, mode, all_logits, calling):
    name, dtype = case
    model, runner = zoo_runner(name, dtype)
    batch = make_batch(name, lengths, seed=seed, dtype=dtype, device=device, hidden_mode=mode, all_logits=all_logits)
    fits = batch.num_tokens <= MAX_TOKENS
    bucket = select_bucket(batch.num_tokens, BUCKETS) if fits else None
    before = _counters(runner, bucket)

    assert runner.can_run(batch) == fits, (
        f"can_run is {not fits} for {batch.describe()}: " + (f"bucket {bucket} holds it" if fits else
                                                             f"no bucket of {list(BUCKETS)} holds it"))
    check_run(runner, model, batch, mode=calling, dtype=dtype, model=name, seed=seed)
    _assert_one_call_counted(runner, batch, bucket, before)


@pytest.mark.clause("buckets-and-padding")
@pytest.mark.parametrize("total", BUCKET_EDGES)
def test_bucket_edges_replay_in_the_smallest_bucket(zoo_runner, check_run, device, total):
    model, runner = zoo_runner("dense")
    assert runner.bucket_for(total) == select_bucket(total, BUCKETS)
    for lengths in ([total], [1] * min(total, 16) if total <= 16 else [total - 15] + [1] * 15):
        batch = make_batch("dense", lengths, seed=total, dtype=torch.float32, device=device, hidden_mode="full")
        bucket = select_bucket(total, BUCKETS)
        before = _counters(runner, bucket)
        check_run(runner, model, batch, model="dense", seed=total)
        _assert_one_call_counted(runner, batch, bucket, before)


@pytest.mark.clause("buckets-and-padding")
def test_past_the_largest_bucket_runs_eagerly(zoo_runner, check_run, device):
    model, runner = zoo_runner("dense")
    batch = make_batch("dense", [MAX_TOKENS - 3, 4], seed=7, dtype=torch.float32, device=device, hidden_mode="last")
    assert not runner.can_run(batch)
    with pytest.raises(BucketError, match=str(MAX_TOKENS + 1)):
        runner.bucket_for(batch.num_tokens)
    with pytest.raises(BucketError):
        runner.replay(batch)
    before = _counters(runner, None)
    check_run(runner, model, batch, model="dense", seed=7)
    _assert_one_call_counted(runner, batch, None, before)


@pytest.mark.clause("several-requests")
@given(data=st.data(), total=st.integers(2, MAX_TOKENS), seed=SEEDS, calling=CALLING)
def test_equal_totals_with_different_splits(zoo_runner, check_run, device, data, total, seed, calling):
    model, runner = zoo_runner("moe")
    for split in (data.draw(split_strategy(total), label="split a"), data.draw(split_strategy(total), label="split b")):
        batch = make_batch("moe", split, seed=seed, dtype=torch.float32, device=device, hidden_mode="full")
        check_run(runner, model, batch, mode=calling, model="moe", seed=seed)


@pytest.mark.clause("several-requests")
@pytest.mark.parametrize("name", ["dense", "side-input"])
@given(target=st.integers(1, 8), others=st.lists(st.integers(1, 6), min_size=1, max_size=6), data=st.data(), seed=SEEDS,
       calling=CALLING)
def test_a_request_does_not_depend_on_its_batchmates(zoo_runner, check_run, failure_context, device, name, target,
                                                     others, data, seed, calling):
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
    solo_out = check_run(runner, model, alone, mode=calling, model=name, seed=seed)
    shared_out = check_run(runner, model, shared, mode=calling, model=name, seed=seed)
    rows = slice(before, before + target)
    # Different buckets run different GEMM shapes, so this is a tolerance comparison on every backend.
    assert_equivalent(
        (shared_out.next_token_logits[rows], shared_out.hidden_states[rows]),
        (solo_out.next_token_logits, solo_out.hidden_states), exact=False,
        context=failure_context(model=name, seed=seed, batch=shared.describe(), dtype="torch.float32",
                                compared=f"the request of {target} tokens at position {split}, alone vs shared"),
    )


ORDER_BUCKETS = (2, 4, 8)
# The forms a caller may give ``buckets`` in: any iterable of ints (docs/runner.md: ``Iterable[int]``), a one-shot
# generator included. numpy and 0-d tensor scalars are not ints: a runner takes them as their values or refuses
# them with BucketError, never builds something else from them.
BUCKET_FORMS = {
    "tuple": tuple,
    "list": list,
    "generator": lambda sizes: (size for size in sizes),
    "numpy scalars": lambda sizes: [np.int64(size) for size in sizes],
    "0-d tensors": lambda sizes: [torch.tensor(size) for size in sizes],
}
_SCALAR_FORMS = ("numpy scalars", "0-d tensors")


@pytest.mark.clause("buckets-and-padding")
@example(buckets=[8, 2], calls=[[3], [2]], seed=0, calling=CALLING_MODES[0], form="generator").via("one-shot buckets")
@given(buckets=st.lists(st.sampled_from(ORDER_BUCKETS), min_size=1, max_size=4),
       calls=st.lists(st.integers(1, ORDER_BUCKETS[-1] + 2).flatmap(lambda total: split_strategy(total, 4)),
                      min_size=2, max_size=4),
       seed=SEEDS, calling=CALLING, form=st.sampled_from(sorted(BUCKET_FORMS)))
def test_buckets_and_batch_sizes_in_any_order(build_runner, check_run, device, buckets, calls, seed, calling, form):
    """Configuration orders and forms: the buckets given in any order and any form a caller may use (repeated ones
    refused with BucketError), then batch sizes in any order, repeated, and past the largest bucket; each call
    replays the smallest bucket holding it (or runs eagerly) and equals eager, whatever ran before it."""
    model = build_model("dense", seed=SEED, device=device)
    given_as = BUCKET_FORMS[form]
    if len(set(buckets)) != len(buckets):
        with pytest.raises(BucketError):
            build_runner(model, buckets=given_as(buckets))
        return
    if form in _SCALAR_FORMS:
        try:
            runner = build_runner(model, buckets=given_as(buckets))
        except BucketError:
            return  # refused loudly, as the contract allows for scalars that are not ints
    else:
        runner = build_runner(model, buckets=given_as(buckets))
    ordered = tuple(sorted(buckets))
    assert tuple(runner.buckets) == ordered, f"buckets given as {buckets} must read ascending: {runner.buckets}"
    sizes = [sum(lengths) for lengths in calls]
    for step, (lengths, total) in enumerate(zip(calls, sizes)):
        batch = make_batch("dense", lengths, seed=seed + step, dtype=torch.float32, device=device,
                           hidden_mode="full", all_logits=step % 2 == 1)
        bucket = select_bucket(total, ordered) if total <= ordered[-1] else None
        before = _counters(runner, bucket)
        check_run(runner, model, batch, mode=calling, buckets=ordered, model="dense", seed=seed + step,
                  buckets_given=list(buckets), buckets_form=form, call=f"{step + 1} of {len(calls)}: sizes {sizes}")
        _assert_one_call_counted(runner, batch, bucket, before)
