"""The engine inputs (harness.batch) and the zoo's inputs: bad input gives an error that names the problem."""

from __future__ import annotations

import pytest
import torch

from harness.errors import BatchError, BucketError, UsageError
from harness.models import MODEL_NAMES, build_model
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import BUCKETS


@pytest.mark.parametrize("lengths, problem", [([], "at least one request"), ([3, 0], "request 1 has length 0"),
                                              ([2, -1], "request 1 has length -1")])
def test_bad_batches_name_the_problem(lengths, problem):
    with pytest.raises(BatchError, match=problem):
        ForwardBatch.from_lengths(lengths, vocab_size=8)


def test_bad_hidden_mode_is_named():
    with pytest.raises(BatchError, match="sometimes"):
        ForwardBatch.from_lengths([2], vocab_size=8, hidden_mode="sometimes")


def test_padding_keeps_requests_and_appends_zeros():
    batch = ForwardBatch.from_lengths([2, 3], vocab_size=8, seed=1)
    padded = batch.padded_to(8)
    assert (padded.num_tokens, padded.num_padding, padded.seq_lens) == (5, 3, (2, 3))
    assert torch.equal(padded.input_ids[:5], batch.input_ids) and not padded.input_ids[5:].any()
    assert padded.positions.tolist() == [0, 1, 0, 1, 2, 0, 0, 0]
    assert padded.last_indices.tolist() == [1, 4]


@pytest.mark.parametrize("num_tokens", range(1, BUCKETS[-1] + 2))
def test_smallest_bucket_that_fits(num_tokens):
    fitting = [b for b in BUCKETS if b >= num_tokens]
    if fitting:
        assert select_bucket(num_tokens, BUCKETS) == fitting[0]
    else:
        with pytest.raises(BucketError, match=f"{num_tokens} tokens fits no bucket"):
            select_bucket(num_tokens, BUCKETS)


def test_unknown_model_is_named():
    with pytest.raises(UsageError, match="'llama-9000'.*dense"):
        build_model("llama-9000")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_zoo_models_are_deterministic_from_the_seed(name):
    first, second, other = (build_model(name, seed=s) for s in (5, 5, 6))
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))


def test_concatenate_keeps_every_request_and_its_offsets():
    first = ForwardBatch.from_lengths([2, 3], vocab_size=8, seed=1)
    second = ForwardBatch.from_lengths([1], vocab_size=8, seed=2)
    joined = ForwardBatch.concatenate([first, second])
    assert joined.seq_lens == (2, 3, 1) and joined.start_offsets == (0, 2, 5)
    assert joined.last_indices.tolist() == [1, 4, 5]  # closed form: start + length - 1
    assert torch.equal(joined.input_ids, torch.cat([first.input_ids, second.input_ids]))


def test_concatenate_refuses_padded_batches():
    with pytest.raises(BatchError, match="none of them padded"):
        ForwardBatch.concatenate([ForwardBatch.from_lengths([2], vocab_size=8).padded_to(4)])


def test_padding_requests_have_no_tokens_and_repeat_the_last_offset():
    batch = ForwardBatch.from_lengths([2, 3], vocab_size=8, seed=1).padded_requests_to(4).padded_to(8)
    assert (batch.seq_lens, batch.start_offsets, batch.num_padding_requests) == ((2, 3, 0, 0), (0, 2, 5, 5), 2)
    assert (batch.num_requests, batch.num_real_requests, batch.num_tokens, batch.num_padding) == (4, 2, 5, 3)
    assert batch.last_indices.tolist() == [1, 4, 4, 4]  # a padding request's last index is the last real token
    assert "2 of them padding requests" in batch.describe()
    with pytest.raises(BatchError, match="down to 3"):
        batch.padded_requests_to(3)


@pytest.mark.parametrize("lengths, padding, problem", [
    ((2, 0, 3), 1, "request 1 has length 0"),  # only trailing requests may be empty, and only as padding
    ((2, 1), 1, "request 1 is a padding request .* has length 1"),
    ((0,), 1, "pads 0 to 0"),  # at least one real request
])
def test_bad_padding_requests_name_the_problem(lengths, padding, problem):
    from harness.batch import request_offsets

    starts, last = request_offsets(lengths)
    with pytest.raises(BatchError, match=problem):
        ForwardBatch(torch.zeros(sum(lengths), dtype=torch.long), torch.zeros(sum(lengths), dtype=torch.long),
                     lengths, starts, torch.tensor(last), num_padding_requests=padding)
