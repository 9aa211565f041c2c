"""Gather cases: layouts really change strides and keep values; cases survive the trip to a child."""

from __future__ import annotations

import pytest
import torch

from harness.errors import GatherContractError
from harness.gather import BufferSpec, GatherCase
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
                      hidden=BufferSpec((2, 3), torch.float16, "column-major"), index_values=(0, -1, 8, 2))
    again = GatherCase.from_json(case.to_json())
    assert again == case
    first, second = case.build(), again.build()
    for a, b in zip(first.args, second.args):
        assert torch.equal(a, b) and a.stride() == b.stride()
    assert first.indices.tolist() == [0, -1, 8, 2]


def test_bad_case_is_a_clear_error():
    with pytest.raises(GatherContractError, match="pool of at least 1"):
        GatherCase(pool=0, count=0, seed=0)
    with pytest.raises(GatherContractError, match="index_values has 2 entries but count is 3"):
        GatherCase(pool=4, count=3, seed=0, index_values=(1, 2))
