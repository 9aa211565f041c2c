"""The emulated stream model: what it reports, what it lets through, and that the relay's stream suite needs it.

Each case is a few ops on two streams whose CUDA verdict is known from CUDA's rules (stream order, waits,
events, host syncs, ``record_stream`` and the caching allocator's per-stream reuse)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import suites.gather.test_relay_streams as stream_suite
from harness.errors import StreamHazardError
from harness.gather import SpecExtrasRelay, compiled_gather
from harness.graphs import Streams, emulated_streams, streams_for
from suites.gather.conftest import GatherCalls


def _read_side_write(streams, side, *, wait: bool, event: bool = False):
    with streams.on(side):
        written = torch.ones(4) * 2
        mark = streams.mark()
    if wait and event:
        streams.wait(mark)
    elif wait:
        streams.wait_stream(side)
    result = written + 1
    streams.record(written)  # the main stream read it: its release is then safe on CUDA too
    return result


def _side_reads_then_released(streams, side, *, protect: str | None):
    made = torch.arange(4)  # allocated on the main stream
    main = streams.current()
    with streams.on(side):
        streams.wait_stream(main)
        if protect == "record":
            streams.record(made)
        doubled = made * 2
        if protect == "host sync":
            bool(doubled.sum() > 0)
    if protect == "main waits":
        streams.wait_stream(side)
    del made
    torch.zeros(4)  # the main stream's next tensor: on CUDA it may take the block just freed
    return doubled


def _main_overwrites_what_side_reads(streams, side, *, wait: bool):
    made = torch.arange(4)
    main = streams.current()
    with streams.on(side):
        streams.wait_stream(main)
        doubled = made * 2
    if wait:
        streams.wait_stream(side)
    made.fill_(3)
    return doubled


CASES = {
    "read of another stream's write, unordered": (lambda s, side: _read_side_write(s, side, wait=False), "reads"),
    "read after wait_stream": (lambda s, side: _read_side_write(s, side, wait=True), None),
    "read after an event": (lambda s, side: _read_side_write(s, side, wait=True, event=True), None),
    "released while another stream reads it": (
        lambda s, side: _side_reads_then_released(s, side, protect=None), "was released while side stream"),
    "released, recorded on the reader": (lambda s, side: _side_reads_then_released(s, side, protect="record"), None),
    "released after the reader's host sync": (
        lambda s, side: _side_reads_then_released(s, side, protect="host sync"), None),
    "released after the owner waited": (
        lambda s, side: _side_reads_then_released(s, side, protect="main waits"), None),
    "write over another stream's read, unordered": (
        lambda s, side: _main_overwrites_what_side_reads(s, side, wait=False), "writes"),
    "write after wait_stream": (lambda s, side: _main_overwrites_what_side_reads(s, side, wait=True), None),
}


@pytest.mark.parametrize("case", CASES)
def test_the_model_reports_what_cuda_could_get_wrong_and_nothing_else(case):
    body, hazard = CASES[case]

    def run():
        with emulated_streams() as streams:
            body(streams, streams.new_stream())

    if hazard is None:
        run()
    else:
        with pytest.raises(StreamHazardError, match=hazard):
            run()


def test_views_and_shape_reads_touch_no_memory():
    with emulated_streams() as streams:
        side = streams.new_stream()
        with streams.on(side):
            written = torch.ones(4) * 2
        view = written[1:]
        like = torch.empty_like(view)  # neither reads side's write
        streams.wait_stream(side)
        assert (view + like.fill_(0)).tolist() == [2.0, 2.0, 2.0]
        streams.record(written)


def test_a_cpu_has_one_stream_outside_the_model():
    streams = streams_for("cpu")
    assert type(streams) is Streams and streams.new_stream() == streams.current()
    with emulated_streams() as model:
        assert streams_for(torch.device("cpu")) is model
    assert streams_for("cpu") is streams


def _unrecorded(self, *tensors):
    pass


@contextlib.contextmanager
def _unordered(self):
    yield


@pytest.mark.parametrize("stash_on, resolve_on", [("side", "main"), ("main", "side")])
@pytest.mark.parametrize("weakened, attribute", [(_unrecorded, "_keep"), (_unordered, "_in_turn")],
                         ids=["no-record", "no-order"])
def test_the_stream_suite_fails_a_relay_without_its_stream_protection(monkeypatch, weakened, attribute, stash_on,
                                                                      resolve_on):
    """The relay is the harness's, so no mutant of the gather component reaches its protections: a relay that drops
    either (recording what it is given, ordering its calls) must fail the stream suite on the CPU."""
    monkeypatch.setattr(SpecExtrasRelay, attribute, weakened)
    device = torch.device("cpu")
    with pytest.raises(StreamHazardError):
        stream_suite.test_relay_across_two_streams_matches_the_eager_relay(
            GatherCalls(compiled_gather, device, lambda **details: details), device, stash_on, resolve_on, None)
