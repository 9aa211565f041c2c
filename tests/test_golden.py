"""Golden files: readable JSON, exact for plain data, tolerance-aware for tensors."""

from __future__ import annotations

import json

import pytest
import torch

from harness.golden import GoldenExtension, golden_matches, to_golden


def _tensor(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_golden_is_json_text_without_pickles():
    text = GoldenExtension().serialize({"plan": {"buckets": [4, 8]}, "logits": _tensor()})
    data = json.loads(text)
    assert data["plan"] == {"buckets": [4, 8]}
    assert data["logits"]["__tensor__"]["shape"] == [4, 6]
    assert "pickle" not in text and "\\x80" not in text


def test_tensor_within_its_dtype_tolerance_matches():
    base = _tensor()
    assert golden_matches(to_golden(base + 1e-7), to_golden(base))


@pytest.mark.parametrize(
    "changed",
    [
        lambda t: t + 1e-3,                       # beyond float32's tolerance
        lambda t: t.flip(0),                      # same statistics, permuted values
        lambda t: t.to(torch.float64),            # dtype changed
        lambda t: t.reshape(6, 4),                # shape changed
    ],
    ids=["shifted", "permuted", "dtype", "shape"],
)
def test_changed_tensor_does_not_match(changed):
    base = _tensor()
    assert not golden_matches(to_golden(changed(base)), to_golden(base))


def test_plain_data_is_exact():
    assert golden_matches(to_golden({"segments": 3}), to_golden({"segments": 3}))
    assert not golden_matches(to_golden({"segments": 3}), to_golden({"segments": 4}))
    assert not golden_matches(to_golden({"segments": 3}), to_golden({"segments": 3, "breaks": 2}))


def test_unknown_objects_are_refused_rather_than_pickled():
    with pytest.raises(TypeError, match="cannot store"):
        to_golden(object())
