"""Scale (issue 45): a long run of a drawn number of calls (up to hundreds) on the smallest zoo model.

Every call is made and its result held to the end; every few calls also go through ``check_run`` (eager on the same
batch is the oracle, and the checker keeps its last results), and at the end every held result is compared with
eager's result of its own batch, computed when the call was made: a runner that goes wrong after N calls (a counter
that wraps, a cache evicted, a static buffer handed out again N calls later) shows however large N is."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.plugin.profiles import capped_examples
from harness.runner.cases import BUCKET_EDGES, MAX_TOKENS, eager, make_batch, split_strategy

pytestmark = pytest.mark.clause("replay-equals-eager")

NAME = "dense"
_MAX_CALLS = 200
_CHECKED_EVERY = 25


# The batches' sizes, used in turn: bucket edges favoured, past the largest bucket included.
_SHAPES = st.lists(st.one_of(st.sampled_from(BUCKET_EDGES), st.integers(1, MAX_TOKENS + 2)).flatmap(split_strategy),
                   min_size=1, max_size=8)


@capped_examples(1)
@example(calls=_MAX_CALLS, seed=45, shapes=[[4], [3, 1, 1], [8], [9], [16], [5, 12], [32], [30, 4]]).via(
    "the longest run drawn, every bucket filled and just past it")
@given(calls=st.integers(1, _MAX_CALLS), seed=st.integers(0, 2**16), shapes=_SHAPES)
def test_a_long_run_keeps_every_result(zoo_runner, check_run, device, calls, seed, shapes):
    model, runner = zoo_runner(NAME)
    totals = [sum(lengths) for lengths in shapes]
    held, expected = [], []
    for call in range(calls):
        lengths = shapes[call % len(shapes)]
        batch = make_batch(NAME, lengths, seed=seed + call, dtype=torch.float32, device=device,
                           hidden_mode=("none", "last", "full")[call % 3])
        if call % _CHECKED_EVERY == 0:
            result = check_run(runner, model, batch, model=NAME, seed=seed + call, call=call, calls=calls)
        else:
            result = runner.run(batch)
        held.append(result)
        expected.append(eager(model, batch))
    assert_equivalent(held, expected, exact=False, context=dict(
        model=NAME, seed=seed, calls=calls, totals=totals,
        compared="every result held to the end, against eager's of its own batch"))
