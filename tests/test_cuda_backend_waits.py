"""The CUDA backend's watch on waits during a capture, on the CPU: which waits go to the capture's receiver.

A captured segment cannot keep its order with a stream outside the capture; inside the backend's capture,
``torch.cuda.Stream.wait_stream`` from a capturing stream on a stream that is not capturing goes to the receiver's
``wait_on_uncaptured_stream`` (the reference refuses), and every other wait goes through. Which stream captures is
asked of CUDA, stood in for here by a set of capturing streams."""

from __future__ import annotations

import pytest
import torch

from harness.errors import CaptureError
from harness.graphs import _cuda, receive_breaks
from harness.graphs._breakable import CaptureSession


class _PlainReceiver:
    """A capturer's receiver that leaves waits to CUDA (it has no ``wait_on_uncaptured_stream``)."""

    def run_break(self, fn, args, kwargs):  # pragma: no cover - no break is called here
        return fn(*args, **kwargs)


class _Receiver(_PlainReceiver):
    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def wait_on_uncaptured_stream(self, stream, other) -> None:
        self.asked.append((stream, other))


@pytest.fixture
def watched(monkeypatch):
    """The watched wait with "capture" capturing and every other stream not, and the plain waits it lets through."""
    plain: list[tuple[str, str]] = []
    monkeypatch.setattr(_cuda, "_capturing", lambda stream: stream == "capture")
    monkeypatch.setattr(_cuda, "_plain_wait_stream", lambda stream, other: plain.append((stream, other)))
    return plain


def test_a_capturing_streams_wait_on_an_outside_stream_goes_to_the_receiver(watched):
    receiver = _Receiver()
    with receive_breaks(receiver):
        _cuda._watched_wait_stream("capture", "side")
        _cuda._watched_wait_stream("side", "capture")  # a fork into the capture: the side stream joins it
        _cuda._watched_wait_stream("caller", "side")  # outside any capture
    assert receiver.asked == [("capture", "side")]
    assert watched == [("side", "capture"), ("caller", "side")]


def test_without_a_receiver_that_decides_the_wait_is_cudas(watched):
    _cuda._watched_wait_stream("capture", "side")
    with receive_breaks(_PlainReceiver()):
        _cuda._watched_wait_stream("capture", "side")
    assert watched == [("capture", "side"), ("capture", "side")]


def test_the_reference_session_refuses_the_wait_naming_the_stream():
    session = CaptureSession.__new__(CaptureSession)
    with pytest.raises(CaptureError, match="waits for stream 'side', which is not part of the capture"):
        session.wait_on_uncaptured_stream("capture", "side")


def test_the_watch_is_installed_once_for_nested_blocks_and_removed_after_the_last(monkeypatch):
    original = torch.cuda.Stream.wait_stream
    with _cuda._waits_on_uncaptured_streams_decided():
        with _cuda._waits_on_uncaptured_streams_decided():
            assert torch.cuda.Stream.wait_stream is _cuda._watched_wait_stream
        assert torch.cuda.Stream.wait_stream is _cuda._watched_wait_stream
    assert torch.cuda.Stream.wait_stream is original
