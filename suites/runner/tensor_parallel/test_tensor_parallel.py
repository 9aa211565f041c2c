"""The runner on tensor-parallel models: every rank runs the runner under test on its shard of a zoo
model (harness.models.tensor_parallel), in a pool of rank processes (``--tp`` ranks, gloo on the CPU).

Contract: replay equals eager on every rank, for every batch composition and both ways of running
collectives (inside the captured segments, or as eager breaks), each call checked on its rank by
harness.oracle against eager on the shard at the group's shapes (everything a caller observes); the
ranks pick the same bucket for a batch whatever padding each rank's batch arrives with, or all run it
eagerly; after an error the layer stack's forward is restored on every rank; a rank that raises leaves
no rank hung (the step fails, naming each rank's fate, within its deadline)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.distributed.rank_pool import RankFailure
from harness.models import ModelConfig
from harness.oracle import CALLING_MODES
from harness.plugin.profiles import capped_examples
from harness.runner import tensor_parallel as tp_cases
from harness.runner.candidate import fixed_capture_plan
from harness.runner.tensor_parallel import Composition

# Every process that runs one of these tests starts the session's pool of rank processes (seconds: each
# rank imports torch): one xdist worker runs them all, one pool.
pytestmark = [pytest.mark.same_worker("rank-pool"), pytest.mark.clause("tensor-parallel")]

# MoE first: the pool forks its ranks after the MoE combine is compiled here (see TensorParallelSession.setup).
SETUPS = [("moe", "graph"), ("moe", "break"), ("dense", "graph"), ("dense", "break")]

# Bucket edges of TP_BUCKETS (3, 8), several requests, every hidden-state mode, all-logits, and a
# batch past the largest bucket (run eagerly by every rank).
COMPOSITIONS = [
    Composition((1,), seed=1),
    Composition((2, 1), seed=2, hidden_mode="full", all_logits=True),
    Composition((3, 1), seed=3, hidden_mode="last"),
    Composition((3, 3, 2), seed=4, hidden_mode="full"),
    Composition((6, 3), seed=5),
]

# The same requests on every rank, arriving with different padding: the group's largest arrival
# decides. Rank 0 exactly fills bucket 3 while rank 1 needs bucket 8; rank 0 is the larger; the
# largest arrival fits no bucket, so every rank runs eagerly though rank 0 alone would replay.
ARRIVALS = [
    Composition((2, 1), seed=6, padding=(0, 2)),
    Composition((2,), seed=7, hidden_mode="full", padding=(5, 1)),
    Composition((1, 1), seed=8, padding=(0, 7)),
]


@pytest.mark.parametrize("model,collectives", SETUPS, ids=[f"{m}-{c}" for m, c in SETUPS])
def test_replay_equals_eager_on_every_rank(tp, assert_ranks_match_eager, model, collectives):
    setup = tp.setup(model=model, collectives=collectives)
    results = tp.pool.run(f"run {len(COMPOSITIONS)} compositions ({setup.describe()})", tp_cases.run_compositions,
                          setup, COMPOSITIONS)
    for index, composition in enumerate(COMPOSITIONS):
        assert_ranks_match_eager(setup, composition, [per_rank[index] for per_rank in results])


@pytest.mark.parametrize("collectives", ["graph", "break"])
def test_ranks_agree_on_the_bucket_whatever_padding_arrives(tp, assert_ranks_match_eager, collectives):
    setup = tp.setup(model="dense", collectives=collectives)
    results = tp.pool.run(f"run differently padded arrivals ({setup.describe()})", tp_cases.run_compositions,
                          setup, ARRIVALS)
    for index, composition in enumerate(ARRIVALS):
        assert_ranks_match_eager(setup, composition, [per_rank[index] for per_rank in results])


@pytest.mark.clause("accounting")
@pytest.mark.parametrize("collectives", ["graph", "break"])
def test_collectives_are_captured_where_the_model_puts_them(tp, collectives):
    """Segments and breaks per bucket, from the model's structure: attention is a break in every
    layer; in break mode so is every all-reduce (the embedding's, and two per layer)."""
    setup = tp.setup(model="dense", collectives=collectives)
    layers = ModelConfig().num_layers
    breaks = layers if collectives == "graph" else layers + 2 * layers + 1
    for rank, plan in enumerate(tp.pool.run("capture plan", tp_cases.capture_plan, setup)):
        got = {int(bucket): graph for bucket, graph in fixed_capture_plan(plan).items()}
        assert got == {bucket: {"segments": breaks + 1, "breaks": breaks} for bucket in setup.buckets}, (
            f"rank {rank}: capture plan {plan['graphs']} for {setup.describe()}; expected {breaks} breaks and "
            f"{breaks + 1} segments per bucket")


@capped_examples(4)
@given(lengths=st.lists(st.integers(1, 4), min_size=1, max_size=4), seed=st.integers(0, 2**16),
       mode=st.sampled_from(["none", "last", "full"]), all_logits=st.booleans(),
       padding=st.lists(st.integers(0, 4), min_size=1, max_size=4), model=st.sampled_from(["dense", "moe"]),
       collectives=st.sampled_from(["graph", "break"]), calling=st.sampled_from(CALLING_MODES))
def test_random_compositions_on_every_rank(tp, assert_ranks_match_eager, lengths, seed, mode, all_logits, padding,
                                           model, collectives, calling):
    setup = tp.setup(model=model, collectives=collectives)
    composition = Composition(tuple(lengths), seed=seed, hidden_mode=mode, all_logits=all_logits,
                              padding=tuple(padding))
    results = tp.pool.run(f"run {composition.describe()} under {calling}", tp_cases.run_compositions, setup,
                          [composition], calling)
    assert_ranks_match_eager(setup, composition, [per_rank[0] for per_rank in results])


@pytest.mark.clause("forward-restored")
def test_error_on_every_rank_restores_the_forward_everywhere(tp, assert_ranks_match_eager):
    setup = tp.setup(model="dense", collectives="graph")
    composition = Composition((2, 1), seed=9)
    reports = tp.pool.run("raise in the first attention break on every rank", tp_cases.raise_in_replay, setup,
                          composition, tuple(range(tp.world_size)))
    for rank, report in enumerate(reports):
        assert report["restored"] and not report["published"], (
            f"rank {rank}: after the replay raised, the layer stack's forward is "
            f"{'restored' if report['restored'] else 'still patched'} and the batch "
            f"{'still published' if report['published'] else 'unpublished'}")
    assert_ranks_match_eager(setup, composition, [report["after"] for report in reports])


@pytest.mark.clause("rank-errors-raise")
def test_error_on_one_rank_fails_the_step_without_a_hang(tp):
    """Rank 1 raises inside the replay; the others are then blocked in the next all-reduce. The step
    must fail within its deadline, name every rank's fate, and every runner must have restored its
    forward (the blocked ranks' collectives raise once the failed rank is gone)."""
    setup = tp.setup(model="dense", collectives="graph")
    started = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        tp.pool.run("raise on rank 1 only", tp_cases.raise_in_replay, setup, Composition((2, 1), seed=10), (1,))
    elapsed = time.monotonic() - started
    fates = failure.value.fates
    assert "InjectedError" in fates[1], f"rank 1 should report the injected error; fates {fates}"
    assert all(fate.startswith("raised") for fate in fates.values()), (
        f"every rank must fail fast (rank 1 raised, its peers' collectives lost their peer); fates {fates}")
    assert all("forward was restored" in fate for fate in fates.values()), f"fates {fates}"
    assert elapsed < tp.pool.step_timeout, f"the failure took {elapsed:.1f} s, past the step deadline"
