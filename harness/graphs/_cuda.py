"""The CUDA graph backend: real ``torch.cuda.CUDAGraph`` segments.

``docs/graphs.md`` (Graph backends) describes its warm-up, pools and capture stream."""

from __future__ import annotations

import contextlib
import gc
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.errors import CaptureError
from harness.graphs._backend import GraphBackend
from harness.graphs._seam import current_break_receiver

__all__ = ["CudaBackend"]

# Fragments of the messages CUDA and torch produce when capture meets a forbidden operation.
_CAPTURE_FAILURE_MARKERS = (
    "capturing",
    "stream capture",
    "cudaErrorStreamCapture",
    "not permitted when stream is capturing",
    "operation not permitted",
    "during CUDA graph capture",
    "uncaptured work",  # cudaErrorStreamCaptureIsolation: a wait on a stream outside the capture
)


@contextlib.contextmanager
def _on_own_stream(stream: torch.cuda.Stream) -> Iterator[None]:
    """``stream`` current inside the block, set without ``torch.cuda.set_stream``, which the race widener
    (:func:`harness.hazards.widened_races`) patches: the backend's own warm-up and capture streams are ordered
    with the caller's, and a spin on them would only slow every capture."""
    previous = torch.cuda.current_stream(stream.device)
    torch.cuda._set_stream_by_id(stream.stream_id, stream.device_index, stream.device_type)
    try:
        yield
    finally:
        torch.cuda._set_stream_by_id(previous.stream_id, previous.device_index, previous.device_type)


def _capturing(stream: torch.cuda.Stream) -> bool:
    """Whether ``stream`` is capturing, asked without ``torch.cuda.set_stream`` (which the race widener patches)."""
    with _on_own_stream(stream):
        return torch.cuda.is_current_stream_capturing()


_wait_lock = threading.Lock()
_wait_watchers = 0
_plain_wait_stream: Callable[..., None] = torch.cuda.Stream.wait_stream


def _watched_wait_stream(stream: torch.cuda.Stream, other: Any) -> None:
    # CUDA lets a capturing stream's wait on an event recorded outside the capture through, drops it, or refuses
    # it (cudaErrorStreamCaptureIsolation), depending on whether the event has completed: the capture's receiver
    # decides once, the same way every time.
    if _capturing(stream) and not _capturing(other):
        decide = getattr(current_break_receiver(), "wait_on_uncaptured_stream", None)
        if decide is not None:
            decide(stream, other)
            return
    _plain_wait_stream(stream, other)


@contextlib.contextmanager
def _waits_on_uncaptured_streams_decided() -> Iterator[None]:
    """Inside the block (in any thread), ``torch.cuda.Stream.wait_stream`` from a capturing stream on a stream that
    is not capturing goes to the capture receiver's ``wait_on_uncaptured_stream(stream, other)`` where it has one."""
    global _wait_watchers, _plain_wait_stream
    with _wait_lock:
        if _wait_watchers == 0:
            _plain_wait_stream = torch.cuda.Stream.wait_stream
            torch.cuda.Stream.wait_stream = _watched_wait_stream  # type: ignore[method-assign,assignment]
        _wait_watchers += 1
    try:
        yield
    finally:
        with _wait_lock:
            _wait_watchers -= 1
            if _wait_watchers == 0:
                torch.cuda.Stream.wait_stream = _plain_wait_stream  # type: ignore[method-assign]


@contextlib.contextmanager
def _empty_graphs_allowed() -> Iterator[None]:
    # A segment between two adjacent breaks, or one aborted early, legitimately holds no kernels.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        yield


class _CudaSegment:
    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


class _CudaRecording:
    def __init__(self, backend: CudaBackend, pool: Any) -> None:
        self.backend = backend
        self.graph = torch.cuda.CUDAGraph()
        self.graph.capture_begin(pool=pool)

    def end(self) -> _CudaSegment:
        with _empty_graphs_allowed():
            self.graph.capture_end()
        self.backend.join_capture_stream()
        return _CudaSegment(self.graph)

    def abort(self) -> None:
        # A failed capture leaves the stream in capture mode; ending it may raise "invalidated".
        try:
            with _empty_graphs_allowed():
                self.graph.capture_end()
        except RuntimeError:
            pass
        self.backend.join_capture_stream()


class CudaBackend(GraphBackend):
    name = "cuda"
    warms_up_outside_the_graph = True

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device or "cuda")
        self._capture_stream: torch.cuda.Stream | None = None
        self._caller_stream: torch.cuda.Stream | None = None
        self._stream_of_every_capture: torch.cuda.Stream | None = None

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def warm_up(self, fn: Callable[[], Any]) -> None:
        # On the stream the capture will use: a library that keeps state per stream (a workspace registry keyed by
        # stream, which refuses to create an entry during a capture) finds the capture stream's entry made here.
        stream = self._capture_stream_of_this_backend()
        caller = torch.cuda.current_stream(self.device)
        stream.wait_stream(caller)
        with torch.cuda.device(self.device), _on_own_stream(stream):
            fn()
        caller.wait_stream(stream)

    def _capture_stream_of_this_backend(self) -> torch.cuda.Stream:
        if self._stream_of_every_capture is None:
            self._stream_of_every_capture = torch.cuda.Stream(device=self.device)
        return self._stream_of_every_capture

    @contextlib.contextmanager
    def capture_context(self) -> Iterator[None]:
        torch.cuda.synchronize(self.device)
        # Destroying an unreachable CUDAGraph (cudaGraphExecDestroy) during a capture invalidates the
        # capture ("operation not permitted when stream is capturing"): collect garbage first, and keep
        # the cyclic collector from running until the capture ends (seen on the H200 when a stateful
        # test dropped graphs of earlier examples).
        gc.collect()
        collector_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with self._capture_streams():
                yield
        finally:
            if collector_was_enabled:
                gc.enable()

    @contextlib.contextmanager
    def _capture_streams(self) -> Iterator[None]:
        self._caller_stream = torch.cuda.current_stream(self.device)
        self._capture_stream = self._capture_stream_of_this_backend()
        self._capture_stream.wait_stream(self._caller_stream)
        try:
            with (torch.cuda.device(self.device), _on_own_stream(self._capture_stream),
                  _waits_on_uncaptured_streams_decided()):
                yield
        finally:
            self._caller_stream.wait_stream(self._capture_stream)
            self._capture_stream = self._caller_stream = None

    def join_capture_stream(self) -> None:
        if self._caller_stream is not None and self._capture_stream is not None:
            self._caller_stream.wait_stream(self._capture_stream)

    def begin_segment(self, pool: Any) -> _CudaRecording:
        return _CudaRecording(self, pool)

    def translate_errors(self, error: BaseException) -> BaseException:
        text = str(error)
        if isinstance(error, RuntimeError) and not isinstance(error, CaptureError) and any(
            marker in text for marker in _CAPTURE_FAILURE_MARKERS
        ):
            return CaptureError(
                "CUDA refused an operation during graph capture (a host synchronisation such as .item(), "
                "a data-dependent shape such as nonzero, a copy to the host, or a wait on a stream outside the "
                "capture). CUDA said: "
                + text.strip().splitlines()[0]
            )
        return error
