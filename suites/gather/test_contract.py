"""The gather contract, every call checked against eager advanced indexing (``check_gather``, harness.oracle).

Deterministic tests pin one clause each; the property test sweeps the whole in-process contract
(pools 1..4096, index counts 0..2*pool with duplicates, widths above 1024, every dtype and layout,
both index dtypes, with and without hidden states) and the calling context: the caller's autograd mode, and a
later call on the same buffers with another count, refilled indices and sources, another mode.
Negative and out-of-range indices live in ``test_index_domain.py``: they run in a child process.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.gather import BufferSpec, GatherCase, gather_dtypes
from harness.gather.cases import SOURCE_LAYOUTS, random_values
from harness.gather.strategies import gather_cases, index_counts
from harness.oracle import CALLING_MODES

pytestmark = pytest.mark.clause("bit-identical")


def test_typical_decode_step(check_gather):
    # The shapes an engine sees: fp32 top-k probabilities, int64 ids, bf16 hidden states, an odd count.
    check_gather(GatherCase(pool=48, count=7, seed=1))


@pytest.mark.clause("no-hidden")
def test_missing_hidden_buffer_gives_none(check_gather):
    actual = check_gather(GatherCase(pool=48, count=7, seed=2, hidden=None))
    assert actual[3] is None, f"hidden_states_buf=None must give hidden_states=None, got {type(actual[3]).__name__}"


@pytest.mark.clause("layouts")
@pytest.mark.parametrize("layout", [layout for layout in SOURCE_LAYOUTS if layout != "contiguous"])
def test_strided_and_offset_sources(check_gather, layout):
    spec = lambda trailing, dtype: BufferSpec(trailing, dtype, layout)  # noqa: E731
    check_gather(GatherCase(pool=40, count=11, seed=3, index_layout="strided",
                            topk_p=spec((5,), torch.float32), topk_index=spec((5,), torch.int64),
                            output_tokens=spec((), torch.int64), hidden=spec((33,), torch.bfloat16)))


def _dtype_groups() -> list[tuple[torch.dtype, ...]]:
    # Four dtypes per case, one per buffer: every dtype is covered with a quarter of the graphs
    # (each dtype combination is a compile, and CI has two cores).
    dtypes = gather_dtypes()
    return [tuple(dtypes[(start + i) % len(dtypes)] for i in range(4)) for start in range(0, len(dtypes), 4)]


@pytest.mark.parametrize("dtypes", _dtype_groups(),
                         ids=lambda group: "-".join(str(d).removeprefix("torch.") for d in group))
def test_every_dtype(check_gather, dtypes):
    topk_p, topk_index, output_tokens, hidden = dtypes
    check_gather(GatherCase(pool=30, count=9, seed=4, topk_p=BufferSpec((4,), topk_p),
                            topk_index=BufferSpec((4,), topk_index), output_tokens=BufferSpec((), output_tokens),
                            hidden=BufferSpec((3, 5), hidden)))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_empty_indices_keep_trailing_dims(check_gather, index_dtype):
    actual = check_gather(GatherCase(pool=16, count=0, seed=5, index_dtype=index_dtype,
                                     hidden=BufferSpec((3, 7), torch.float16)))
    shapes = [tuple(out.shape) for out in actual]
    assert shapes == [(0, 8), (0, 8), (0,), (0, 3, 7)], f"empty gather lost its trailing dims: {shapes}"


@pytest.mark.clause("fresh-outputs")
def test_full_arange_gives_new_tensors(check_gather):
    # Reading every slot in order is the case where returning the buffer itself is tempting.
    check_gather(GatherCase(pool=24, count=24, seed=6, index_values=tuple(range(24))))


@pytest.mark.clause("fresh-outputs")
def test_duplicates_give_new_tensors(check_gather):
    check_gather(GatherCase(pool=24, count=6, seed=7, index_values=(5, 5, 5, 0, 23, 5)))


def _refill_sources(buffers, generator: torch.Generator) -> None:
    """A decode step stashed new extras into the same buffers, in place (their layouts kept)."""
    for buffer in buffers:
        if buffer is not None:
            buffer.copy_(random_values(buffer.shape, buffer.dtype, generator=generator))


def test_index_values_change_between_calls(check_gather, device):
    # Engines refill one index tensor in place every step, and pass the same buffers, which the
    # step before stashed new extras into: a result keyed on shapes, addresses or the index
    # tensor's own writes would be stale. Steps refill the indices, the sources, or both.
    case = GatherCase(pool=64, count=6, seed=8)
    inputs = case.build(device)
    generator = torch.Generator().manual_seed(case.seed)
    for step, refill in enumerate(("indices", "sources", "both", "sources")):
        if refill != "sources":
            inputs.indices.copy_(torch.randperm(case.pool, generator=generator)[: case.count].to(inputs.indices))
        if refill != "indices":
            _refill_sources(inputs.buffers, generator)
        check_gather.args(*inputs.args, case=case, step=step, refilled=refill,
                          index_values_now=inputs.indices.tolist())


# Two shards (with and without a hidden-states buffer), each with half the profile's examples: the
# same budget as one test, but pytest-xdist can run the shards (each compiling its own graphs) at once.
# An example is a first call on the drawn case, then maybe a later call on the same buffers with a count drawn
# anew (edges, repeats, either order), its indices refilled in place where the count is unchanged (else a new
# tensor), the sources refilled in place or not; the caller's mode is drawn for every call. Longer sequences are
# the deterministic tests' (and the compile stream's): each later call may cost a compile (its mode, its count's
# class), and a second one added a third to the property tests' CPU time under the kill matrix's ci profile.
_LATER_CALLS = 1


@pytest.mark.long_running
@pytest.mark.parametrize("with_hidden", [True, False], ids=["hidden", "no-hidden"])
@settings(max_examples=max(1, settings().max_examples // 2))
@given(data=st.data())
def test_matches_eager_oracle_over_the_contract(check_gather, device, with_hidden, data):
    case = data.draw(gather_cases(with_hidden=with_hidden), label="case")
    first_mode = data.draw(st.sampled_from(CALLING_MODES), label="mode")
    later = data.draw(st.lists(st.tuples(index_counts(case.pool), st.sampled_from(CALLING_MODES), st.booleans()),
                               max_size=_LATER_CALLS), label="later calls (count, mode, sources refilled)")
    calls = check_gather.anew()
    inputs = case.build(device)
    calls.args(*inputs.args, case=case, mode=first_mode, call=0)
    indices, generator = inputs.indices, torch.Generator().manual_seed(case.seed)
    for call, (count, mode, refill_sources) in enumerate(later, start=1):
        fresh = case.other_indices(count, seed=case.seed + call, device=device)
        indices = indices.copy_(fresh) if count == indices.numel() else fresh
        if refill_sources:
            _refill_sources(inputs.buffers, generator)
        calls.args(indices, *inputs.buffers, case=case, mode=mode, call=call, index_count=count,
                   indices_refilled_in_place=indices is inputs.indices, sources_refilled=refill_sources)


@pytest.mark.clause("index-domain")
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_negative_indices_in_range_wrap(check_gather, index_dtype):
    """In-range negative indices are safe to run in-process (no kernel reads out of bounds on them)
    and must wrap as Python indexing does, each by its own buffer's pool: the hidden-states buffer
    here has more slots than the others (an engine may size it apart), so -1 is its slot 22, not 16.
    The edges of the range are probed in child processes."""
    values = (-17, -1, 0, 16, -5, 3, -17, 8, -2)
    check_gather(GatherCase(pool=17, count=len(values), seed=11, index_dtype=index_dtype, index_values=values,
                            hidden=BufferSpec((64,), torch.bfloat16, pool=23)))


@pytest.mark.clause("fresh-outputs")
@pytest.mark.parametrize("next_count", [6, 3], ids=["same-count", "other-count"])
def test_results_outlive_the_next_call(check_gather, device, next_count):
    """A caller keeps one step's extras while the next step gathers (the relay hands them to the
    scheduler): the checker holds each call's results and fails a later call that changes them."""
    case = GatherCase(pool=64, count=6, seed=12)
    inputs = case.build(device)
    check_gather.args(*inputs.args, case=case, step="first")
    generator = torch.Generator().manual_seed(case.seed)
    for step in range(2):
        indices = torch.randperm(case.pool, generator=generator)[:next_count].to(inputs.indices)
        check_gather.args(indices, *inputs.args[1:], case=case, step=step, later_indices=indices.tolist())
