"""The transformers adapter against an independent oracle: each request run alone through the
transformers model (``output_hidden_states=True``). Packing several requests (block-diagonal mask,
per-request positions) or laying them out in rows must change nothing, in every hidden-state mode."""

from __future__ import annotations

import warnings

import pytest
import torch

from harness.compare import assert_equivalent
from harness.errors import UsageError
from harness.models.transformers_adapter import TransformersAdapter
from harness.models.transformers_zoo import VOCAB_SIZE, architecture, build_architecture
from harness.runner import ForwardBatch

LENGTHS = [3, 5, 1, 4]


def _alone(model, batch):
    """Per request, on its own: every token's logits and final hidden states (the LM head's input)."""
    logits, hidden = [], []
    for start, length in zip(batch.start_offsets, batch.seq_lens):
        with torch.no_grad():
            output = model(input_ids=batch.input_ids[start:start + length][None], use_cache=False,
                           output_hidden_states=True)
        logits.append(output.logits[0])
        hidden.append(output.hidden_states[-1][0])
    return logits, hidden


@pytest.fixture(scope="module", params=["llama", "lfm2"], ids=["packed-llama", "grid-lfm2"])
def adapter(request):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: more threads only spin on a shared CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield TransformersAdapter(build_architecture(request.param, seed=4), layout=architecture(request.param).layout)
    torch.set_num_threads(previous)


@pytest.mark.parametrize("mode", ["none", "last", "full"])
@pytest.mark.parametrize("all_logits", [False, True], ids=["last-logits", "all-logits"])
def test_adapter_equals_each_request_alone(adapter, mode, all_logits):
    batch = ForwardBatch.from_lengths(LENGTHS, vocab_size=VOCAB_SIZE - 2, seed=9, hidden_mode=mode,
                                      all_logits=all_logits)
    with torch.no_grad():
        output = adapter(batch.input_ids, batch.positions, batch)
    logits, hidden = _alone(adapter.wrapped, batch)
    pick = (lambda rows: torch.cat(rows)) if all_logits else (lambda rows: torch.stack([r[-1] for r in rows]))
    context = {"model": adapter.wrapped.zoo_name, "lengths": LENGTHS, "mode": mode, "all_logits": all_logits}
    assert_equivalent(output.next_token_logits, pick(logits), exact=False, context=context)
    expected_hidden = {"none": None, "last": torch.stack([h[-1] for h in hidden]), "full": torch.cat(hidden)}[mode]
    assert_equivalent(output.hidden_states, expected_hidden, exact=False, context=context)


def test_unknown_layout_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown layout 'rows'"):
        TransformersAdapter(torch.nn.Linear(2, 2), layout="rows")
