"""The runner benchmark's instruments on the emulated backend: what they hand the runner is the truth.

The glue measurement stubs the layer stack with its recorded output, so the stubbed model must
return bitwise what the model returns eagerly (oracle: the unpatched model), and leave the model
unpatched afterwards; the instrumented capturer must record one capture per bucket with the
graph's own segment and break counts.
"""

from __future__ import annotations

import torch

from harness.bench.runner import InstrumentedCapturer, _leading_size, _stubbed_stack
from harness.graphs import get_backend
from harness.models import LogitsOutput, build_model
from harness.runner import ForwardBatch, LayerStackRunner


def test_stubbed_stack_keeps_the_models_output_and_restores_the_forward():
    model = build_model("moe", seed=3)
    batch = ForwardBatch.from_lengths([3, 1, 2], vocab_size=model.config.vocab_size, seed=5, hidden_mode="full",
                                      all_logits=True)
    with torch.no_grad():
        expected = model(batch.input_ids, batch.positions, batch)
    stack = model.model
    with _stubbed_stack(model, batch):
        assert "forward" in stack.__dict__
        with torch.no_grad():
            stubbed = model(batch.input_ids, batch.positions, batch)
    assert "forward" not in stack.__dict__
    assert torch.equal(stubbed.next_token_logits, expected.next_token_logits)
    assert torch.equal(stubbed.hidden_states, expected.hidden_states)


def test_instrumented_capturer_records_each_bucket_with_its_plan():
    model = build_model("dense", seed=0)
    capturer = InstrumentedCapturer(get_backend("emulated"))
    runner = LayerStackRunner(model, buckets=(4, 8, 16), graphs=capturer)
    assert sorted(c["tokens"] for c in capturer.captures) == [4, 8, 16]
    graphs = {bucket: runner._captured[bucket].graph for bucket in runner.captured_buckets()}
    for capture in capturer.captures:
        graph = graphs[capture["tokens"]]
        assert (capture["segments"], capture["breaks"]) == (graph.segment_count, graph.break_count)
        assert capture["capture_s"] is None and capture["pool_mib"] is None  # emulation: counts only
    # Uninstrumented replays (probe off) give the eager result: the timing subclass changes nothing.
    # The batch fills its bucket exactly, so replay and eager run the same shapes: bitwise in float32.
    batch = ForwardBatch.from_lengths([3, 5], vocab_size=model.config.vocab_size, seed=1)
    with torch.no_grad():
        expected = model(batch.input_ids, batch.positions, batch)
    assert torch.equal(runner.run(batch).next_token_logits, expected.next_token_logits)


def test_leading_size_finds_the_first_tensor():
    assert _leading_size((None, [torch.zeros(5, 2)], torch.zeros(3))) == 5
    assert _leading_size({"a": torch.tensor(1.0), "b": torch.zeros(7)}) == 7
    assert _leading_size(None) is None
    assert _leading_size(LogitsOutput(torch.zeros(2, 9), torch.zeros(6, 4))) == 2
