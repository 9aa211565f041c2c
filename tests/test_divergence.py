"""Divergence localisation names the layer a replay departs at: the perturb-middle-layer mutant
(which captures an error into the middle decoder layer) is reported at that layer, with the
layers before it bitwise equal on the emulated backend; the reference diverges nowhere."""

from __future__ import annotations

import warnings

import pytest

from harness import impls
from harness.graphs import GraphCapturer, get_backend
from harness.models.transformers_adapter import TransformersAdapter
from harness.models.transformers_zoo import NUM_LAYERS, build_architecture
from harness.runner import ForwardBatch
from harness.runner.divergence import localise


@pytest.mark.parametrize("spec, expected", [("reference", None), ("mutant:perturb-middle-layer", NUM_LAYERS // 2)])
def test_localise_names_the_perturbed_layer(spec, expected):
    adapter = TransformersAdapter(build_architecture("llama", seed=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = impls.load("runner", spec).obj(adapter, buckets=(8,), graphs=GraphCapturer(get_backend("emulated")))
    report = localise(runner, adapter, ForwardBatch.from_lengths([3, 4], vocab_size=150, seed=2))
    assert report.first_divergent == expected, str(report)
    if expected is not None:
        assert report.max_abs_diff[:expected] == (0.0,) * expected, str(report)  # emulated float32: bitwise
        assert report.max_abs_diff[expected] > 1e-3


def test_divergence_table_marks_the_first_divergent_layer():
    from harness.runner.divergence import LayerDivergence, format_divergence_table

    table = format_divergence_table({"llama": LayerDivergence((0.0, 2e-2), 1, 1e-5), "dbrx": "no DbrxConfig"})
    lines = table.splitlines()
    assert lines[1].split()[:3] == ["llama", "0", "0.000e+00"] and "ok" in lines[1]
    assert lines[2].split()[:3] == ["llama", "1", "2.000e-02"] and "FIRST DIVERGENT" in lines[2]
    assert "dbrx" in lines[3] and "unavailable: no DbrxConfig" in lines[3]


@pytest.mark.parametrize("recorded", ["none", "one_layer_empty"])
def test_localise_that_compares_nothing_is_an_error(recorded):
    """A runner whose bucket recorded no (or empty) per-layer outputs must not read as "no divergence"."""
    import torch

    from harness.errors import MismatchError
    from harness.models import build_model

    model = build_model("dense", seed=1)
    batch = ForwardBatch.from_lengths([2, 3], vocab_size=100, seed=2)

    class NothingRecorded:
        layer_model = model.model

        def replay(self, batch):
            return None

        def bucket_for(self, num_tokens):
            return 8

        def layer_outputs(self, batch):
            return [] if recorded == "none" else [torch.zeros(8, model.config.hidden_size), torch.empty(0)]

    with pytest.raises(MismatchError, match="nothing to localise in bucket 8"):
        localise(NothingRecorded(), model, batch)
