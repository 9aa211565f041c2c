"""The layer-stack breakable-graph runner: batch description, module discovery, the reference runner.

The ``runner`` component's implementations are factories called as
``factory(model, *, buckets, graphs, strict_discovery=False)`` returning a runner object; see
``docs/runner.md`` for the interface the suites use.
"""

from __future__ import annotations

from typing import Any

from harness import impls
from harness.errors import ImplementationError
from harness.runner.batch import ForwardBatch, HiddenMode, select_bucket, validate_buckets
from harness.runner.discovery import (
    DEFAULT_RULES,
    DiscoveryResult,
    DiscoveryRule,
    DiscoveryWarning,
    discover_layer_model,
    sglang_rule,
)
from harness.runner.runner import LayerStackRunner, RunnerStats, StaticInputs

__all__ = [
    "ForwardBatch",
    "HiddenMode",
    "select_bucket",
    "validate_buckets",
    "DiscoveryResult",
    "DiscoveryRule",
    "DiscoveryWarning",
    "DEFAULT_RULES",
    "discover_layer_model",
    "sglang_rule",
    "LayerStackRunner",
    "RunnerStats",
    "StaticInputs",
]


def _validate_runner_factory(candidate: Any, spec: str) -> Any:
    """A ``runner`` implementation is a callable ``factory(model, *, buckets, graphs, strict_discovery)``."""
    if not callable(candidate):
        raise ImplementationError(
            f"--impl {spec}: expected a class or factory called as factory(model, *, buckets, graphs, "
            f"strict_discovery=False) that returns a runner (see docs/runner.md); got {type(candidate).__name__}"
        )
    return candidate


impls.register_component("runner", validator=_validate_runner_factory, providers=["harness.mutants.runner"])
impls.register("runner", "reference", LayerStackRunner)
