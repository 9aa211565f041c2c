"""Gather cases: layouts really change strides and keep values; cases survive the trip to a child."""

from __future__ import annotations

import math

import pytest
import torch

from harness.errors import GatherContractError
from harness.gather import BufferSpec, GatherCase, gather_dtypes
from harness.gather.cases import INDEX_LAYOUTS, SOURCE_LAYOUTS, random_values, with_layout


@pytest.mark.parametrize("layout", SOURCE_LAYOUTS + INDEX_LAYOUTS[2:])
@pytest.mark.parametrize("shape", [(5,), (5, 3), (4, 2, 3)])
def test_layout_keeps_values_and_changes_strides(layout, shape):
    generator = torch.Generator().manual_seed(0)
    values = random_values(shape, torch.float32, generator=generator)
    laid_out = with_layout(values, layout, generator=generator, device="cpu")
    assert torch.equal(laid_out, values)
    assert (layout == "contiguous") == (laid_out.is_contiguous() and laid_out.storage_offset() == 0
                                        and laid_out.untyped_storage().nbytes() == values.untyped_storage().nbytes())


def test_unknown_layout_is_a_clear_error():
    with pytest.raises(GatherContractError, match="unknown layout 'diagonal'"):
        with_layout(torch.zeros(3), "diagonal", generator=torch.Generator(), device="cpu")


def test_case_round_trips_through_json_and_builds_the_same_bits():
    case = GatherCase(pool=9, count=4, seed=3, index_dtype=torch.int32, index_layout="offset",
                      hidden=BufferSpec((2, 3), torch.float16, "column-major", pool=12), index_values=(0, -1, 8, 2))
    again = GatherCase.from_json(case.to_json())
    assert again == case
    first, second = case.build(), again.build()
    for a, b in zip(first.args, second.args):
        assert torch.equal(a, b) and a.stride() == b.stride()
    assert first.indices.tolist() == [0, -1, 8, 2]
    assert first.buffers[3].shape == (12, 2, 3) and first.buffers[0].shape[0] == 9


def test_bad_case_is_a_clear_error():
    with pytest.raises(GatherContractError, match="pool of at least 1"):
        GatherCase(pool=0, count=0, seed=0)
    with pytest.raises(GatherContractError, match="index_values has 2 entries but count is 3"):
        GatherCase(pool=4, count=3, seed=0, index_values=(1, 2))
    with pytest.raises(GatherContractError, match=r"own pool \(3\) is below the case's pool \(4\)"):
        GatherCase(pool=4, count=0, seed=0, hidden=BufferSpec((2,), torch.float32, pool=3))


@pytest.mark.parametrize("dtype", [d for d in gather_dtypes() if d.is_floating_point], ids=str)
def test_float_sources_hold_values_a_copy_keeps_and_arithmetic_does_not(dtype):
    # -0.0 (x * 1 + 0 is +0.0) and infinities (0 * inf is NaN), or float8's largest finite values.
    values = random_values((64, 8), dtype, generator=torch.Generator().manual_seed(0)).to(torch.float64)
    negative_zero = (values == 0) & torch.signbit(values)
    extreme = values.abs() == (math.inf if dtype.itemsize > 1 else torch.finfo(dtype).max)
    assert bool(negative_zero.any()) and bool(extreme.any()) and not bool(values.isnan().any())


def test_int64_sources_span_beyond_float64_precision():
    values = random_values((256,), torch.int64, generator=torch.Generator().manual_seed(0))
    assert bool((values.abs() > 2**53).any()), "int64 values must reach past 2**53, where float64 loses bits"
