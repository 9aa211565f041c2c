"""The runner benchmark's instruments on the emulated backend: what they hand the runner is the truth.

The glue measurement stubs the layer stack with its recorded output, so the stubbed model must
return bitwise what the model returns eagerly (oracle: the unpatched model), and leave the model
unpatched afterwards; the instrumented capturer must record one capture per bucket with the
graph's own segment and break counts. The split's host figures are measured on any device (its GPU
figures need CUDA events), and the figures a baseline gates are exactly the counts, each row's segment
GPU time and the host-overhead ratios grouped by model.
"""

from __future__ import annotations

import torch

from harness.bench.report import Stat
from harness.bench.runner import (
    InstrumentedCapturer,
    _leading_size,
    _stubbed_stack,
    figures_of,
    host_reference,
    measure_split,
)
from harness.bench.variants import EagerFallbackRunner
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


def test_the_split_on_the_emulation_times_the_host_path_and_leaves_the_probe_off():
    model = build_model("dense", seed=0)
    cpu = torch.device("cpu")
    batch = ForwardBatch.from_lengths([2, 1], vocab_size=model.config.vocab_size, seed=1)
    capturer = InstrumentedCapturer(get_backend("emulated"))
    runner = LayerStackRunner(model, buckets=(4,), graphs=capturer)
    split = measure_split(lambda: runner.run(batch), capturer, host_reference(cpu), device=cpu, samples=5)
    assert split["segments_gpu"] is None and split["breaks_gpu"] is None  # no CUDA events off CUDA
    for name in ("breaks_host", "runner_host", "host_reference", "host_ratio"):
        assert split[name].repeats == 5 and split[name].median > 0, name
    assert not capturer.probe.enabled and capturer.probe.pending == []
    # A runner that never replays its graphs has no segment or break figures, only its host time.
    capturer = InstrumentedCapturer(get_backend("emulated"))
    eager = EagerFallbackRunner(model, buckets=(4,), graphs=capturer)
    split = measure_split(lambda: eager.run(batch), capturer, host_reference(cpu), device=cpu, samples=4)
    assert split["segments_gpu"] is None and split["breaks_host"] is None and split["runner_host"].median > 0


def test_figures_gate_segment_gpu_time_and_each_models_host_ratio_and_report_the_rest():
    stat = Stat(1.0, 0.05, 40)
    row = {"model": "dense", "size": "large", "kind": "batch", "batch": "1", "launches_eager": 532,
           "launches_run": 119, "eager_fallbacks": 0, "eager": stat, "run": stat, "speedup": stat,
           "segments_gpu": stat, "breaks_gpu": stat, "breaks_host": stat, "runner_host": stat, "host_ratio": stat}
    figures = figures_of([row])
    assert {key for key, figure in figures.items() if figure.gated} == {
        "dense/large/1/launches_eager", "dense/large/1/launches_run", "dense/large/1/eager_fallbacks",
        "dense/large/1/segments_gpu_ms", "dense/large/1/runner_host_ratio"}
    host, segments = figures["dense/large/1/runner_host_ratio"], figures["dense/large/1/segments_gpu_ms"]
    assert (host.group, host.repeats, segments.group, segments.repeats) == ("dense/large", 40, None, 40)
    assert {figures[f"dense/large/1/{name}"].gated for name in (
        "eager_ms", "run_ms", "speedup", "breaks_gpu_ms", "breaks_host_ms", "runner_host_ms")} == {False}
    # A row of gate version 1 (segments and overhead timed with the host's launch latency inside): no gated time.
    old = {key: value for key, value in row.items() if key not in ("segments_gpu", "host_ratio", "runner_host",
                                                                     "breaks_gpu", "breaks_host")}
    old.update(segments=stat, breaks=stat, overhead=stat, glue=stat)
    assert {figure.kind for figure in figures_of([old]).values() if figure.gated} == {"count"}
