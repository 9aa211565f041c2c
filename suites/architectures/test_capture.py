"""Capturing real transformers layer stacks: replay equals eager for batches of 1 to 8 requests
(a dense, an MoE, a VLM and a hybrid in every profile; the whole capturable zoo under the
``nightly`` hypothesis profile), MoE under a caller's grad mode, the capture matrix as a golden,
and per-layer divergence localisation."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.graphs import get_backend
from harness.models.transformers_zoo import ARCHITECTURES, VOCAB_SIZE, ArchitectureUnavailable
from harness.runner import ForwardBatch
from harness.runner.divergence import localise
from harness.runner.matrices import capture_row

CI_SUBSET = ("llama", "qwen3-moe", "llava", "lfm2")  # dense, MoE, VLM, hybrid (grid layout)
NIGHTLY = settings._current_profile == "nightly"
nightly_only = pytest.mark.skipif(not NIGHTLY, reason="the whole zoo runs under --hypothesis-profile nightly "
                                                      "(minutes on a CPU)")
MAX_TOKENS = 16


def _lengths():
    return st.integers(1, 8).flatmap(lambda count: st.lists(st.integers(1, MAX_TOKENS // count), min_size=count,
                                                            max_size=count))


def _check(architecture_runner, failure_context, name, lengths, seed, device):
    try:
        adapter, runner = architecture_runner(name)
    except ArchitectureUnavailable as error:
        pytest.skip(str(error))
    batch = ForwardBatch.from_lengths(lengths, vocab_size=VOCAB_SIZE - 2, seed=seed, device=device)
    actual = runner.run(batch)
    with torch.no_grad():
        expected = adapter(batch.input_ids, batch.positions, batch)
    try:
        assert_equivalent(actual, expected, exact=False, context=failure_context(model=name, seed=seed, batch=batch.describe()))
    except AssertionError as error:
        layers = localise(runner, adapter, batch) if hasattr(runner, "layer_outputs") else "no per-layer outputs"
        raise AssertionError(f"{error}\nper-layer divergence of {name}:\n{layers}") from None


@pytest.mark.parametrize("name", CI_SUBSET)
@settings(max_examples=3)
@given(lengths=_lengths(), seed=st.integers(0, 2**16))
def test_replay_equals_eager(architecture_runner, failure_context, device, name, lengths, seed):
    _check(architecture_runner, failure_context, name, lengths, seed, device)


@nightly_only
@pytest.mark.parametrize("name", [a.name for a in ARCHITECTURES if a.name not in CI_SUBSET])
@given(lengths=_lengths(), seed=st.integers(0, 2**16))
def test_replay_equals_eager_whole_zoo(architecture_runner, failure_context, device, name, lengths, seed):
    try:
        _check(architecture_runner, failure_context, name, lengths, seed, device)
    except ArchitectureUnavailable as error:
        pytest.skip(str(error))


def test_moe_under_caller_grad_mode(architecture_runner, failure_context, device):
    adapter, runner = architecture_runner("qwen3-moe", requires_grad=True)
    batch = ForwardBatch.from_lengths([3, 4, 1], vocab_size=VOCAB_SIZE - 2, seed=5, device=device)
    with torch.enable_grad():
        actual = runner.run(batch)
    assert actual.next_token_logits.grad_fn is None, "replayed logits carry a grad_fn: autograd was on in the graph"
    with torch.no_grad():
        expected = adapter(batch.input_ids, batch.positions, batch)
    assert_equivalent(actual, expected, exact=False, context=failure_context(model="qwen3-moe", seed=5, batch=batch.describe()))


@pytest.mark.parametrize("name", CI_SUBSET)
def test_no_layer_diverges(architecture_runner, device, name):
    adapter, runner = architecture_runner(name)
    if not hasattr(runner, "layer_outputs"):
        pytest.skip("the runner under test records no per-layer outputs")
    report = localise(runner, adapter, ForwardBatch.from_lengths([2, 5], vocab_size=VOCAB_SIZE - 2, seed=3,
                                                                 device=device))
    assert report.first_divergent is None, f"{name}: replay departs from eager\n{report}"


def _capture_matrix(names, device):
    graphs = __import__("harness.graphs", fromlist=["GraphCapturer"]).GraphCapturer(get_backend(
        "cuda" if device.type == "cuda" else "emulated", device=device if device.type == "cuda" else None))
    matrix = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            try:
                row = capture_row(name, graphs=graphs, device=device)
            except ArchitectureUnavailable as error:
                row = {"unavailable": str(error)}
            row.pop("max_abs_diff", None)  # differs by backend: reported, not pinned
            matrix[name] = row
    return matrix


@nightly_only
def test_capture_matrix_golden(device, snapshot):
    assert _capture_matrix([a.name for a in ARCHITECTURES], device) == snapshot
