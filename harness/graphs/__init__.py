"""Graph backends behind one small interface, and breakable graphs on top of them.

Safe to use: :func:`get_backend`, :class:`GraphCapturer` and its graphs, the break markers
(:func:`eager_on_graph`, :func:`break_graph`), the break seam :func:`receive_breaks`, and the streams of a
device (:func:`streams_for`, with a CPU model of CUDA's inside :func:`emulated_streams`).
``docs/graphs.md`` is the contract, the seams and a worked adapter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.devices import BACKEND_CHOICES, Placement
from harness.errors import UsageError
from harness.graphs._backend import GraphBackend
from harness.graphs._breakable import (
    Break,
    BreakableGraph,
    CaptureSession,
    GraphCapturer,
    RaisedBreak,
    break_graph,
    copy_tensor,
    eager_on_graph,
    is_capturing,
    run_outside_graph,
    write_back,
)
from harness.graphs._capture_rules import HOST_SYNC_OPS, check_capturable
from harness.graphs._cuda import CudaBackend
from harness.graphs._emulated import EmulatedBackend
from harness.graphs._engine import EngineBreaks, EngineCapturer, EngineGraph
from harness.graphs._seam import (
    INLINE_BREAKS,
    BreakReceiver,
    EngineBreakBody,
    current_break_receiver,
    receive_breaks,
)
from harness.graphs._streams import CudaStreams, EmulatedStreams, Streams, emulated_streams, streams_for

__all__ = [
    "BACKEND_NAMES",
    "GraphBackend",
    "CudaBackend",
    "EmulatedBackend",
    "get_backend",
    "backend_for",
    "GraphCapturer",
    "BreakableGraph",
    "CaptureSession",
    "Break",
    "RaisedBreak",
    "eager_on_graph",
    "break_graph",
    "is_capturing",
    "run_outside_graph",
    "receive_breaks",
    "BreakReceiver",
    "INLINE_BREAKS",
    "EngineBreakBody",
    "EngineBreaks",
    "EngineCapturer",
    "EngineGraph",
    "current_break_receiver",
    "write_back",
    "copy_tensor",
    "check_capturable",
    "HOST_SYNC_OPS",
    "run_eagerly",
    "Streams",
    "CudaStreams",
    "EmulatedStreams",
    "streams_for",
    "emulated_streams",
]

BACKEND_NAMES = BACKEND_CHOICES  # one list: harness.devices resolves the options


def get_backend(name: str = "auto", *, device: torch.device | str | None = None) -> GraphBackend:
    """Return the backend called ``name``; ``auto`` is ``cuda`` when a GPU is present, else ``emulated``."""
    if name not in BACKEND_NAMES:
        raise UsageError(f"unknown graph backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "emulated"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                "graph backend 'cuda' was requested but torch sees no CUDA device "
                f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); use --graph-backend emulated"
            )
        return CudaBackend(device)
    return EmulatedBackend(device)


def backend_for(placement: Placement) -> GraphBackend:
    """The backend a resolved request (:func:`harness.devices.resolve`) names, bound to its device."""
    device = placement.device if placement.device_type == "cuda" else None
    return get_backend(placement.graph_backend, device=device)


def run_eagerly(fn: Callable[[], Any]) -> Any:
    """The oracle of the ``graphs`` component: ``fn`` run eagerly, its breaks as plain calls.

    A replay of ``fn``'s capture, with the static inputs refilled, must equal this (bitwise on the
    emulated backend, within the tolerance table on CUDA; see :func:`harness.compare.bitwise_expected`).
    """
    return fn()
