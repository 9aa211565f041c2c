"""A layer stack that writes its own arguments in place (zoo model ``in-place-args``: a fused add-RMSNorm writes
the residual sum into the residual side input it is handed, and the positions advance by one, as a multi-step draft
loop steps them). Eager writes the caller's tensors; a replay writes the graph's static copies, so a runner must
hand the writes back: after every call the batch holds exactly what eager leaves in its twin, at every bucket (an
exact fill, where the padded batch is the caller's own, and a partial one, where the runner pads a copy), for a
batch that arrived padded, and past the largest bucket (the eager fallback). Every call goes through ``check_run``
(harness.oracle) with ``writes_batch``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.oracle import CALLING_MODES
from harness.runner import select_bucket
from harness.runner.cases import BUCKETS, MAX_TOKENS, make_batch, split_strategy

pytestmark = pytest.mark.clause("argument-writes")

NAME = "in-place-args"
# Every bucket filled exactly and partly, and past the largest.
TOTALS = tuple(sorted({n for bucket in BUCKETS for n in (bucket - 1, bucket)} | {MAX_TOKENS + 3}))


@pytest.mark.parametrize("total", TOTALS)
@given(data=st.data(), seed=st.integers(0, 2**16), calling=st.sampled_from(CALLING_MODES))
def test_the_caller_sees_what_eager_writes_into_the_arguments(zoo_runner, check_run, device, total, data, seed,
                                                               calling):
    model, runner = zoo_runner(NAME)
    lengths = data.draw(split_strategy(total), label="lengths")
    batch = make_batch(NAME, lengths, seed=seed, dtype=torch.float32, device=device)
    before = (batch.positions.clone(), batch.side_inputs["residual"].clone())
    check_run(runner, model, batch, mode=calling, writes_batch=True, model=NAME, seed=seed)
    # The model really writes both arguments: otherwise the check above proves nothing.
    assert torch.equal(batch.positions, before[0] + 1) and not torch.equal(batch.side_inputs["residual"], before[1])


@pytest.mark.parametrize("arrived_padded_to", [5, 8])
def test_a_batch_that_arrived_padded_gets_every_row_it_carries_written(zoo_runner, check_run, device,
                                                                       arrived_padded_to):
    model, runner = zoo_runner(NAME)
    batch = make_batch(NAME, [2, 1], seed=7, dtype=torch.float32, device=device).padded_to(arrived_padded_to)
    bucket = select_bucket(arrived_padded_to, BUCKETS)
    check_run(runner, model, batch, writes_batch=True, model=NAME, bucket=bucket)
