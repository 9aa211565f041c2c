"""The zoo's index-checked attention (harness.models.index_checked): it raises, naming the row, for every kind of
metadata a paged kernel would index memory out of bounds with, and skips requests with no tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.batch import ForwardBatch
from harness.errors import IllegalIndexError, UsageError
from harness.models import build_model
from harness.models.index_checked import TOKEN_SLOTS, with_pool_slots


def _run(model, batch):
    with torch.no_grad():
        return model(batch.input_ids, batch.positions, batch)


@pytest.fixture
def model():
    model = build_model("index-checked", seed=3)
    model.request_pool.allocate(1, 3)
    model.request_pool.allocate(2, 2)
    return model


def _batch(**changes):
    batch = with_pool_slots(ForwardBatch.from_lengths([3, 2], vocab_size=96, seed=1), [1, 2]).padded_to(8)
    return dataclasses.replace(batch, **changes)


def _with(tensor, row, value):
    tensor = tensor.clone()
    tensor[row] = value
    return tensor


def test_valid_metadata_runs_and_pad_rows_are_counted(model):
    _run(model, _batch())
    assert model.request_pool.padding_rows_checked == 3 * model.config.num_layers


@pytest.mark.parametrize("change, problem", [
    (lambda b: {"side_inputs": {TOKEN_SLOTS: _with(b.side_inputs[TOKEN_SLOTS], 1, 8)}},
     r"row 1 \(a token of request 0\) holds request-pool index 8, outside \[0, 8\)"),
    (lambda b: {"side_inputs": {TOKEN_SLOTS: _with(b.side_inputs[TOKEN_SLOTS], 6, -1)}},
     r"row 6 \(a padding row: the live batch has 5 real tokens in 8 rows\) holds request-pool index -1"),
    (lambda b: {"positions": _with(b.positions, 4, 64)}, r"row 4 \(a token of request 1\) holds position 64, outside"),
    (lambda b: {"positions": _with(b.positions, 2, 3)},
     r"row 2 \(a token of request 0\) reads req_to_token\[1, 3\], which is not allocated \(slot 1 holds 3"),
    (lambda b: {"side_inputs": {TOKEN_SLOTS: _with(b.side_inputs[TOKEN_SLOTS], 7, 5)}},
     r"row 7 .* reads req_to_token\[5, 0\], which is not allocated"),
    (lambda b: {"positions": _with(b.positions, 5, 1)},
     r"row 5 \(a padding row.*\) holds request-pool index 0 at position 1, not the padding fill"),
    (lambda b: {"side_inputs": {TOKEN_SLOTS: _with(b.side_inputs[TOKEN_SLOTS], 7, 2)}},
     r"row 7 \(a padding row.*\) holds request-pool index 2 at position 0, not the padding fill"),
])
def test_bad_metadata_raises_naming_the_row(model, change, problem):
    batch = _batch()
    with pytest.raises(IllegalIndexError, match=problem):
        _run(model, dataclasses.replace(batch, **change(batch)))


def test_freed_slots_are_not_allocated(model):
    model.request_pool.free(2)
    with pytest.raises(IllegalIndexError, match=r"row 3 \(a token of request 1\) reads req_to_token\[2, 0\]"):
        _run(model, _batch())


def test_padding_requests_are_skipped_like_the_dense_model():
    dense, checked = build_model("dense", seed=3), build_model("index-checked", seed=3)
    batch = ForwardBatch.from_lengths([3, 1, 2], vocab_size=96, seed=2)
    checked.request_pool.allocate(1, 3)
    padded = batch.padded_requests_to(5)
    expected = _run(dense, padded).next_token_logits
    # a padding request's row is its last index's, the last real token's (equal up to the GEMM's row blocking)
    assert expected.shape[0] == 5 and torch.allclose(expected[3:], expected[2:3].expand(2, -1), atol=1e-6)
    assert torch.allclose(_run(checked, padded).next_token_logits, expected)  # slot 0 for every row: no pool needed


def test_the_pool_refuses_bad_use(model):
    with pytest.raises(UsageError, match="reserved for padding"):
        model.request_pool.allocate(0, 2)
    with pytest.raises(UsageError, match="slot 1 is in use"):
        model.request_pool.allocate(1, 2)
    with pytest.raises(UsageError, match="does not fit"):
        model.request_pool.allocate(3, 65)
