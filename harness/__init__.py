"""Correctness and regression harness for LLM-inference graph optimisations: the public facade.

Safe to use: every name in ``__all__`` (the component table, comparison, errors, graph backends).
Components (``harness.graphs``, ``harness.runner``, ``harness.gather``) import on their own; names load
on first use, so ``import harness`` imports no torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.compare import TOLERANCES, Tolerance, assert_equivalent, bitwise_expected, tolerance_for
    from harness.components import COMPONENTS, Component
    from harness.errors import (
        BatchError,
        BucketError,
        CaptureError,
        DiscoveryError,
        GatherContractError,
        GraphHazardError,
        HarnessError,
        ImplementationError,
        MismatchError,
        ReplayError,
        UsageError,
    )
    from harness.graphs import GraphCapturer, break_graph, eager_on_graph, get_backend

# name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(["COMPONENTS", "Component"], "harness.components"),
    **dict.fromkeys(["assert_equivalent", "bitwise_expected", "tolerance_for", "Tolerance", "TOLERANCES"],
                    "harness.compare"),
    **dict.fromkeys(["get_backend", "GraphCapturer", "eager_on_graph", "break_graph"], "harness.graphs"),
    **dict.fromkeys(["HarnessError", "UsageError", "ImplementationError", "CaptureError", "ReplayError",
                     "GraphHazardError", "DiscoveryError", "BatchError", "BucketError", "GatherContractError",
                     "MismatchError"], "harness.errors"),
}

__all__ = [
    "COMPONENTS",
    "Component",
    "assert_equivalent",
    "bitwise_expected",
    "tolerance_for",
    "Tolerance",
    "TOLERANCES",
    "get_backend",
    "GraphCapturer",
    "eager_on_graph",
    "break_graph",
    "HarnessError",
    "UsageError",
    "ImplementationError",
    "CaptureError",
    "ReplayError",
    "GraphHazardError",
    "DiscoveryError",
    "BatchError",
    "BucketError",
    "GatherContractError",
    "MismatchError",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
