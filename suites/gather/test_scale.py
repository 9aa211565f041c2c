"""Scale and form (issue 45): sizes at and around powers of two, long runs, and writes that bypass the version counter.

Every call goes through ``check_gather`` (eager indexing of the same arguments is the oracle). The sizes are swept,
not sampled: a kernel that goes wrong at one block edge is met for certain. A long run holds every result it was
handed and compares them all with eager's at the end, so a result overwritten many calls later shows, beyond the
few calls the checker itself keeps."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.gather import BufferSpec, GatherCase, eager_gather
from harness.gather.cases import random_values
from harness.gather.strategies import around_powers_of_two
from harness.plugin.profiles import capped_examples
from harness.writes import BYPASSING_WRITES, bypassing_writes_for

pytestmark = pytest.mark.clause("bit-identical")

# Narrow buffers: the sweep is about row counts, and 4097 rows of these cost little.
_NARROW = dict(topk_p=BufferSpec((2,), torch.float32), topk_index=BufferSpec((2,), torch.int64),
               output_tokens=BufferSpec((), torch.int64), hidden=BufferSpec((3,), torch.bfloat16))
_SWEPT_POOLS = (1, 2, 3, 15, 16, 17, 255, 256, 257, 4095, 4096, 4097)
# A long run's calls: every call is made and its result held; every _CHECKED_EVERY-th call also goes through the
# checker (the rest are compared with eager's results at the end), which keeps hundreds of calls cheap.
_MAX_CALLS = 300
_CHECKED_EVERY = 16


@pytest.mark.parametrize("pool", _SWEPT_POOLS)
def test_counts_around_powers_of_two_and_the_pool(check_gather, device, pool):
    """Index counts at and around every power of two up to twice the pool, and around the pool itself, on pools at
    and around powers of two: each call equals eager indexing (a kernel's block count, tail or vector width goes
    wrong at one such edge only)."""
    case = GatherCase(pool=pool, count=0, seed=pool, **_NARROW)
    inputs = case.build(device)
    counts = sorted(set(around_powers_of_two(0, 2 * pool)) | {pool - 1, pool, pool + 1})
    for count in counts:
        indices = case.other_indices(count, seed=count, device=device)
        check_gather.args(indices, *inputs.buffers, case=case, index_count=count)


@example(calls=_MAX_CALLS, count=8, seed=45)
@example(calls=65, count=1, seed=46)
@capped_examples(2)
@given(calls=st.integers(1, _MAX_CALLS), count=st.sampled_from((1, 2, 7, 8, 9)), seed=st.integers(0, 2**16))
def test_a_long_run_keeps_every_result(check_gather, device, calls, count, seed):
    """A decode loop of a drawn number of calls (up to hundreds) on one set of sources, refilled in place between
    calls, with index tensors of one count: every result the caller still holds at the end equals eager's result of
    its own call (an output buffer reused after N calls overwrites a result the checker no longer keeps)."""
    calls_checked = check_gather.anew()
    case = GatherCase(pool=32, count=count, seed=seed, **_NARROW)
    inputs = case.build(device)
    generator = torch.Generator().manual_seed(seed)
    held, expected = [], []
    for call in range(calls):
        indices = case.other_indices(count, seed=seed + call, device=device)
        if call % 3 == 0:
            _refill(inputs.buffers, generator)
        if call % _CHECKED_EVERY == 0:
            result = calls_checked.args(indices, *inputs.buffers, case=case, call=call, calls=calls)
        else:
            result = check_gather.gather(indices, *inputs.buffers)
        held.append(result)
        expected.append(tuple(None if out is None else out.clone()
                              for out in eager_gather(indices, *inputs.buffers)))
    assert_equivalent(held, expected, exact=True, context=dict(
        case=case.describe(), calls=calls, compared="every result held to the end, against eager's of its own call"))


def _refill(buffers, generator: torch.Generator) -> None:
    for buffer in buffers:
        if buffer is not None:
            buffer.copy_(random_values(buffer.shape, buffer.dtype, generator=generator))


@pytest.mark.parametrize("route", sorted(BYPASSING_WRITES))
def test_writes_that_bypass_the_version_counter_are_seen(check_gather, device, route):
    """Between two calls on the same tensors, new index values and new source values are written through an alias
    that has a version counter of its own (:data:`harness.writes.BYPASSING_WRITES`), so the tensors' own counters do
    not move: the second call must still equal eager indexing of the values now there, as eager's does."""
    if route not in bypassing_writes_for(device):
        pytest.skip(f"a {route} write reaches host memory only, not {device}")
    write = BYPASSING_WRITES[route]
    case = GatherCase(pool=16, count=5, seed=7, **_NARROW)
    inputs = case.build(device)
    inputs = type(inputs)(inputs.indices.contiguous(), tuple(None if buf is None else buf.contiguous()
                                                             for buf in inputs.buffers))
    check_gather.args(*inputs.args, case=case, call="before the write")
    versions = [tensor._version for tensor in inputs.args if tensor is not None]
    generator = torch.Generator().manual_seed(8)
    write(inputs.indices, torch.randint(0, case.pool, (case.count,), generator=generator).to(inputs.indices))
    for buffer in inputs.buffers:
        if buffer is not None:
            write(buffer, random_values(buffer.shape, buffer.dtype, generator=generator).to(buffer.device))
    assert [tensor._version for tensor in inputs.args if tensor is not None] == versions, (
        f"the {route} write moved a version counter: the test would not check what it claims")
    check_gather.args(*inputs.args, case=case, call=f"after a {route} write", route=route)
