"""Hooks on the layer stack run as often per replay as eagerly, and every bucket records its layers.

* Forward pre-hooks and forward hooks registered on the layer module run in Python around the
  patched forward at every replay, exactly once each, as in an eager forward; hooks registered on
  each decoder layer were captured with the layer, so their work (here: a device-side counter and
  a change of the layer's output) replays exactly once per replay too. Not twice, not never.
* A runner that records per-layer outputs records one per decoder layer in every bucket, and the
  layer-by-layer localisation of a replay against eager compares each of them (a localisation with
  nothing to compare is an error, never a pass).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from harness.models import build_model
from harness.runner import ForwardBatch
from harness.runner.cases import BUCKETS, SEED, eager, make_batch
from harness.runner.discovery import layer_list
from harness.runner.divergence import localise

pytestmark = pytest.mark.clause("runs-once")


def _hooked_model(device: torch.device):
    """The dense zoo model with hooks on its layer stack and on each decoder layer, counting calls in
    Python and on the device, and changing what they return (so running one twice changes the logits)."""
    model = build_model("dense", seed=SEED, dtype=torch.float32, device=device)
    stack = model.model
    layers = list(stack.layers)
    python_calls = {"stack pre-hook": 0, "stack hook": 0}
    device_calls = torch.zeros(2 + 2 * len(layers), device=device)  # stack pre, stack post, each layer pre/post

    def stack_pre_hook(module, args):
        python_calls["stack pre-hook"] += 1
        device_calls[0].add_(1)

    def stack_hook(module, args, output):
        python_calls["stack hook"] += 1
        device_calls[1].add_(1)
        return output * 1.5

    def layer_hooks(index: int):
        def pre(module, args):
            device_calls[2 + 2 * index].add_(1)
            positions, hidden = args
            return positions, hidden * 0.75

        def post(module, args, output):
            device_calls[3 + 2 * index].add_(1)
            return output + 0.25

        return pre, post

    stack.register_forward_pre_hook(stack_pre_hook)
    stack.register_forward_hook(stack_hook)
    for index, layer in enumerate(layers):
        pre, post = layer_hooks(index)
        layer.register_forward_pre_hook(pre)
        layer.register_forward_hook(post)
    return model, python_calls, device_calls


def test_hooks_on_the_stack_and_its_layers_run_once_per_replay_as_eagerly(build_runner, check_run, device,
                                                                          failure_context):
    model, python_calls, device_calls = _hooked_model(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = build_runner(model)
    once = {"stack pre-hook": 1, "stack hook": 1}
    seen: dict[str, Any] = {}
    for replay, lengths in enumerate([(3, 5), (1,), (7, 2, 6)]):
        batch = make_batch("dense", list(lengths), seed=40 + replay, dtype=torch.float32, device=device)
        context = failure_context(replay=replay, batch=batch.describe())
        counts, on_device = dict(python_calls), device_calls.clone()
        eager(model, batch)
        eager_python = {name: python_calls[name] - counts[name] for name in counts}
        assert eager_python == once and bool((device_calls - on_device == 1).all()), (
            "the eager oracle itself did not run each hook once")
        seen.clear()

        def measured_replay(batch: ForwardBatch) -> Any:  # what the hooks did inside the runner's call only
            counts, on_device = dict(python_calls), device_calls.clone()
            try:
                return runner.replay(batch)
            finally:
                seen["python"] = {name: python_calls[name] - counts[name] for name in counts}
                seen["device"] = (device_calls - on_device).tolist()

        # The hooks change the layers' outputs, so running one twice or never changes the values too.
        check_run(runner, model, batch, via=measured_replay, model="dense with hooks", replay=replay)
        assert seen["python"] == once, (
            f"hooks on the layer module ran {seen['python']} times in one replay, eagerly {once}: {context}")
        assert seen["device"] == [1.0] * len(device_calls), (
            f"per replay the hooks' device work ran {seen['device']} times (stack pre, stack post, then each layer's "
            f"pre and post), eagerly once each: {context}")


@pytest.mark.clause("layer-outputs")
def test_every_bucket_records_and_localises_each_decoder_layer(zoo_runner, check_run, device, failure_context):
    model, runner = zoo_runner("dense")
    if not hasattr(runner, "layer_outputs"):
        pytest.skip("the runner under test records no per-layer outputs (optional: it only localises failures)")
    layer_count = len(layer_list(runner.layer_model)[1])
    for bucket in BUCKETS:
        batch = make_batch("dense", [bucket - 1, 1], seed=50 + bucket, dtype=torch.float32, device=device)
        assert runner.bucket_for(batch.num_tokens) == bucket
        check_run(runner, model, batch, via="replay", model="dense", seed=50 + bucket)
        report = localise(runner, model, batch)
        recorded = runner.layer_outputs(batch)
        context = failure_context(bucket=bucket, batch=batch.describe())
        assert len(recorded) == layer_count and all(tuple(t.shape[:1]) == (bucket,) for t in recorded), (
            f"bucket {bucket} recorded {[tuple(t.shape) for t in recorded]} for {layer_count} decoder layers: "
            f"{context}")
        assert len(report.max_abs_diff) == layer_count and report.first_divergent is None, f"{report}\n{context}"
