"""Correctness and regression harness for LLM-inference graph optimisations.

The public facade: the component table, comparison, errors and graph backends. Components
(``harness.graphs``, ``harness.runner``, ``harness.gather``) are importable on their own; the
engine inputs they share (batches, hidden-state modes, the forward context) are ``harness.batch``.
"""

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
