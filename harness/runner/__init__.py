"""The layer-stack breakable-graph runner: batches, module discovery, the reference runner.

``runner`` implementations are factories ``factory(model, *, buckets, graphs, strict_discovery=False)``
returning a runner; ``docs/runner.md`` gives the interface the suites use."""

from __future__ import annotations

from harness.batch import ForwardBatch, HiddenMode, current_batch, forward_context, select_bucket, validate_buckets
from harness.runner.discovery import (
    DEFAULT_RULES,
    RULES,
    DiscoveryRefused,
    DiscoveryResult,
    DiscoveryRule,
    DiscoveryWarning,
    discover_layer_model,
    harness_rule,
    layer_list,
    sglang_pr24662_rule,
)
from harness.runner.runner import LayerStackRunner, RunnerStats, StaticInputs

__all__ = [
    "ForwardBatch",
    "forward_context",
    "current_batch",
    "HiddenMode",
    "select_bucket",
    "validate_buckets",
    "DiscoveryResult",
    "DiscoveryRule",
    "DiscoveryWarning",
    "DiscoveryRefused",
    "DEFAULT_RULES",
    "discover_layer_model",
    "sglang_pr24662_rule",
    "harness_rule",
    "RULES",
    "layer_list",
    "LayerStackRunner",
    "RunnerStats",
    "StaticInputs",
]
