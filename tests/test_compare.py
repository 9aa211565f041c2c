"""The comparison module: verdicts against closed-form cases and the content of failure messages."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from harness.compare import TOLERANCES, ComputeSettings, assert_equivalent, tolerance_for
from harness.errors import MismatchError


def test_identical_structures_pass_bitwise():
    x = torch.arange(12.0).reshape(3, 4)
    assert_equivalent({"a": (x, None, 3), "b": [x.int()]}, {"a": (x.clone(), None, 3), "b": [x.int()]}, exact=True)


def test_message_counts_mismatches_and_locates_the_largest():
    expected = torch.zeros(4, 5)
    actual = expected.clone()
    actual[1, 2] = 0.5
    actual[3, 4] = -2.0
    with pytest.raises(MismatchError) as caught:
        assert_equivalent(actual, expected, exact=True, context={"seed": 7, "reproduce": "pytest x"})
    message = str(caught.value)
    assert "2 / 20 elements mismatch" in message
    assert "greatest absolute difference 2 at index (3, 4)" in message
    assert re.search(r"seed: 7", message) and "reproduce: pytest x" in message


def test_bitwise_distinguishes_signed_zero_and_tolerance_does_not():
    with pytest.raises(MismatchError):
        assert_equivalent(torch.tensor([-0.0]), torch.tensor([0.0]), exact=True)
    assert_equivalent(torch.tensor([-0.0]), torch.tensor([0.0]), exact=False)


@pytest.mark.parametrize("dtype", sorted((key for key in TOLERANCES if isinstance(key, torch.dtype)), key=str))
def test_tolerance_accepts_within_and_rejects_beyond(dtype):
    tolerance = tolerance_for(dtype)
    expected = torch.ones(8, dtype=dtype)
    assert_equivalent(expected + tolerance.atol / 4, expected, exact=False)
    with pytest.raises(MismatchError, match=re.escape(str(dtype))):
        assert_equivalent(expected + 0.5, expected, exact=False)


def test_integers_are_always_exact():
    assert tolerance_for(torch.int64).atol == 0
    with pytest.raises(MismatchError):
        assert_equivalent(torch.tensor([1, 2]), torch.tensor([1, 3]), exact=False)


@pytest.mark.parametrize(
    ("actual", "expected", "pattern"),
    [
        (torch.zeros(2, 3), torch.zeros(3, 2), "shape mismatch"),
        (torch.zeros(2, dtype=torch.float16), torch.zeros(2), "dtype mismatch"),
        ({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, "keys differ"),
        ((torch.zeros(1),), (torch.zeros(1), torch.zeros(1)), "structure differs"),
        (None, torch.zeros(1), "expected a tensor"),
        (3, 4, "values differ"),
    ],
)
def test_structural_differences_are_named(actual, expected, pattern):
    with pytest.raises(MismatchError, match=pattern):
        assert_equivalent(actual, expected, exact=True)


def test_nan_in_the_same_place_is_equal():
    value = torch.tensor([1.0, float("nan")])
    assert_equivalent(value, value.clone(), exact=True)
    assert_equivalent(value, value.clone(), exact=False)


def test_leaves_compared_element_wise_are_equal_only_where_every_element_is():
    assert_equivalent({"a": [np.array([1, 2])]}, {"a": [np.array([1, 2])]}, exact=True)
    with pytest.raises(MismatchError, match=r"values differ at \['a'\]\[0\]"):
        assert_equivalent({"a": [np.array([1, 3])]}, {"a": [np.array([1, 2])]}, exact=True)


@pytest.mark.parametrize(("precision", "row"), [("high", "tf32"), ("medium", torch.bfloat16)])
def test_float32_compared_at_the_matmul_precision_the_caller_set(precision, row):
    """Under a lowered float32 matmul precision the values were computed in TF32 or bfloat16: their row's
    tolerance applies, read from the settings in force (or those handed in), and the message says so."""
    expected = torch.ones(8)
    within = expected + TOLERANCES[row].atol / 2  # beyond float32's own tolerance
    with pytest.raises(MismatchError, match="float32"):
        assert_equivalent(within, expected, exact=False)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        assert_equivalent(within, expected, exact=False)
        settings = ComputeSettings.now()
    finally:
        torch.set_float32_matmul_precision(before)
    assert_equivalent(within, expected, exact=False, settings=settings)
    with pytest.raises(MismatchError, match="computed in"):
        assert_equivalent(expected + 0.5, expected, exact=False, settings=settings)
    assert tolerance_for(torch.float64, settings=settings) == TOLERANCES[torch.float64], "float64 is never lowered"


def test_autocast_on_the_values_device_type_lowers_their_tolerance_and_on_another_does_not():
    expected = torch.ones(8)
    within = expected + TOLERANCES[torch.bfloat16].atol / 2
    on_cpu = ComputeSettings(autocast=(("cpu", torch.bfloat16),))
    assert_equivalent(within, expected, exact=False, settings=on_cpu)
    with pytest.raises(MismatchError):
        assert_equivalent(within, expected, exact=False, settings=ComputeSettings(autocast=(("cuda", torch.bfloat16),)))
    assert tolerance_for(torch.int64, settings=on_cpu).atol == 0
