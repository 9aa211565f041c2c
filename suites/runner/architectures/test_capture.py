"""Capturing real transformers layer stacks: replay equals eager for batches of 1 to 8 requests in
every hidden-state mode (a dense, an MoE, a VLM and a hybrid in every profile, the whole zoo under
``nightly``), MoE under a caller's grad mode, per-layer divergence localisation, and the capture
matrix (every architecture against every discovery rule) as a golden."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent, equivalent
from harness.graphs import GraphCapturer
from harness.models.transformers_zoo import ARCHITECTURES, VOCAB_SIZE, ArchitectureUnavailable
from harness.pytest_support import capped_examples, current_hypothesis_profile
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import eager, eager_padded
from harness.runner.divergence import localise
from harness.runner.matrices import capture_row

CI_SUBSET = ("llama", "qwen3-moe", "llava", "lfm2")  # dense, MoE, VLM, hybrid (grid layout)
# Stacks no graph can capture, with the op that stops them; test_uncapturable_stacks_are_the_known_ones
# keeps this in step with the capture matrix.
UNCAPTURABLE = {"jetmoe": "aten._local_scalar_dense (Tensor.tolist)"}  # routing reads expert counts on the host
# Every profile runs the subset; nightly the whole capturable zoo (its examples cost seconds on a CPU).
ZOO = (tuple(a.name for a in ARCHITECTURES if a.name not in UNCAPTURABLE) if current_hypothesis_profile() == "nightly"
       else CI_SUBSET)
MAX_TOKENS = 16


def _lengths():
    return st.integers(1, 8).flatmap(lambda count: st.lists(st.integers(1, MAX_TOKENS // count), min_size=count,
                                                            max_size=count))


def _runner(architecture_runner, name, **options):
    try:
        return architecture_runner(name, **options)
    except ArchitectureUnavailable as error:
        pytest.skip(str(error))  # the installed transformers lacks it: the reason is in the message


@pytest.mark.parametrize("name", ZOO)
@capped_examples(3)
@given(lengths=_lengths(), seed=st.integers(0, 2**16), mode=st.sampled_from(["none", "last", "full"]),
       all_logits=st.booleans())
def test_replay_equals_eager(architecture_runner, architecture_buckets, exact_comparison, failure_context, device,
                             name, lengths, seed, mode, all_logits):
    """Two oracles, as in the runner suites: eager at the replay's shapes (the batch padded to its bucket),
    bitwise where :func:`harness.compare.bitwise_expected` says so; and eager on the batch itself within the
    tolerance table. Some architectures are not shape-invariant in eager: qwen3-next's chunked linear
    attention gives logits ~2e-5 apart for the same requests padded and unpadded (fp32, measured here).
    Where eager disagrees with itself beyond the table, the tolerance check is made against eager at the
    replay's shapes, which the replay must then match; the message says so."""
    adapter, runner = _runner(architecture_runner, name)
    batch = ForwardBatch.from_lengths(lengths, vocab_size=VOCAB_SIZE - 2, seed=seed, device=device,
                                      hidden_mode=mode, all_logits=all_logits)
    actual = runner.run(batch)
    at_replay_shapes = eager_padded(adapter, batch, select_bucket(batch.num_tokens, architecture_buckets))
    unpadded = eager(adapter, batch)
    shape_invariant = equivalent(at_replay_shapes, unpadded)
    try:
        if exact_comparison(torch.float32):
            assert_equivalent(actual, at_replay_shapes, exact=True, context=failure_context(
                model=name, seed=seed, batch=batch.describe(), comparison="bitwise against eager at the replay's shapes"))
        assert_equivalent(actual, unpadded if shape_invariant else at_replay_shapes, exact=False, context=failure_context(
            model=name, seed=seed, batch=batch.describe(),
            comparison="against eager on the batch itself" if shape_invariant else
            "against eager at the replay's shapes (eager on the unpadded batch differs from it beyond the table)"))
    except AssertionError as error:
        layers = localise(runner, adapter, batch) if hasattr(runner, "layer_outputs") else "no per-layer outputs"
        raise AssertionError(f"{error}\nper-layer divergence of {name}:\n{layers}") from None


def test_moe_under_caller_grad_mode(architecture_runner, failure_context, device):
    adapter, runner = _runner(architecture_runner, "qwen3-moe", requires_grad=True)
    batch = ForwardBatch.from_lengths([3, 4, 1], vocab_size=VOCAB_SIZE - 2, seed=5, device=device)
    with torch.enable_grad():
        actual = runner.run(batch)
    assert actual.next_token_logits.grad_fn is None, "replayed logits carry a grad_fn: autograd was on in the graph"
    with torch.no_grad():
        expected = adapter(batch.input_ids, batch.positions, batch)
    assert_equivalent(actual, expected, exact=False,
                      context=failure_context(model="qwen3-moe", seed=5, batch=batch.describe()))


@pytest.mark.parametrize("name", CI_SUBSET)
def test_no_layer_diverges(architecture_runner, device, name):
    adapter, runner = _runner(architecture_runner, name)
    if not hasattr(runner, "layer_outputs"):
        pytest.skip("the runner under test records no per-layer outputs (optional: it only localises failures)")
    report = localise(runner, adapter, ForwardBatch.from_lengths([2, 5], vocab_size=VOCAB_SIZE - 2, seed=3,
                                                                 device=device))
    assert report.first_divergent is None, f"{name}: replay departs from eager\n{report}"


@pytest.fixture(scope="module")
def capture_matrix(graph_backend, device):
    """Every architecture against every rule (reference runner, selected graph backend)."""
    graphs = GraphCapturer(graph_backend)
    matrix = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for arch in ARCHITECTURES:
            try:
                matrix[arch.name] = capture_row(arch.name, graphs=graphs, device=device)
            except ArchitectureUnavailable as error:
                matrix[arch.name] = {"unavailable": error.reason}
    return matrix


def test_harness_rule_stacks_replay_like_eager(capture_matrix):
    # The whole capturable zoo: where the harness rule's stack captures, several requests replay it
    # and match eager. Stacks that do not capture are recorded in the golden with the op that stopped them.
    wrong = {name: row["harness"] for name, row in capture_matrix.items() if "harness" in row
             and row["harness"]["captures"]
             and not (row["harness"]["replays_several_requests"] and row["harness"]["replay_matches_eager"])}
    assert not wrong, f"harness-rule stacks that capture but do not replay several requests like eager: {wrong}"


def test_uncapturable_stacks_are_the_known_ones(capture_matrix, graph_backend):
    refused = {name: row["harness"]["stopped_by"] for name, row in capture_matrix.items()
               if "harness" in row and not row["harness"]["captures"]}
    if graph_backend.name != "emulated":  # CUDA refuses without naming the op: compare which stacks only
        refused = {name: UNCAPTURABLE.get(name, message) for name, message in refused.items()}
    assert refused == UNCAPTURABLE, (
        f"the harness rule's stacks that do not capture changed: {refused} (expected {UNCAPTURABLE}); a stack that "
        "now captures joins the nightly replay tests once it leaves UNCAPTURABLE")


def test_capture_matrix_golden(capture_matrix, snapshot):
    # A transformers upgrade that makes a stack capturable or not shows here as a reviewable diff. The
    # largest difference and the error's text differ by backend: reported (bench, GPU script), not
    # pinned; the op that stops each stack is checked above (UNCAPTURABLE).
    pinned = {name: {rule: {key: value for key, value in cell.items() if key not in ("max_abs_diff", "stopped_by")}
                     for rule, cell in row.items()} if "unavailable" not in row else row
              for name, row in capture_matrix.items()}
    assert pinned == snapshot
