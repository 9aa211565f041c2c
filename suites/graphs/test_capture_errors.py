"""Illegal ops fail the capture; failed and nested captures leave nothing behind."""

from __future__ import annotations

import pytest
import torch

from harness.compare import assert_equivalent
from harness.errors import CaptureError
from harness.graphs import eager_on_graph, is_capturing

HOST_SYNC_PROGRAMS = {
    "item": lambda x: x * x.sum().item(),
    "bool": lambda x: x * 2 if bool(x.sum() > 0) else x,
    "nonzero": lambda x: torch.nonzero(x > 0).float().sum() + x,
    "masked_select": lambda x: torch.masked_select(x, x > 0).sum() + x,
    "unique": lambda x: torch.unique(x.round()).sum() + x,
    "boolean_mask_index": lambda x: x[x > 0].sum() + x,
}


def _assert_capture_usable_afterwards(graph_capturer, make_tensor):
    assert not is_capturing(), "a failed capture left a capture active"
    x = make_tensor(4, seed=99)
    graph = graph_capturer.capture(lambda: x * 2)
    x.copy_(make_tensor(4, seed=100))
    assert_equivalent(graph.replay(), x * 2, exact=True)


@pytest.mark.parametrize("program", sorted(HOST_SYNC_PROGRAMS))
def test_host_sync_or_data_dependent_op_fails_capture(graph_capturer, make_tensor, program):
    x = make_tensor(16, seed=1)
    HOST_SYNC_PROGRAMS[program](x)  # eager is fine
    with pytest.raises(CaptureError):
        graph_capturer.capture(lambda: HOST_SYNC_PROGRAMS[program](x))
    _assert_capture_usable_afterwards(graph_capturer, make_tensor)


def test_copy_to_host_fails_capture(graph_capturer, make_tensor, device):
    if device.type == "cpu":
        pytest.skip("tensors already live on the host: there is no device-to-host copy to refuse")
    x = make_tensor(8, seed=2)
    with pytest.raises(CaptureError):
        graph_capturer.capture(lambda: x.cpu() * 2)
    _assert_capture_usable_afterwards(graph_capturer, make_tensor)


def test_emulated_error_names_the_op(graph_capturer, graph_backend, make_tensor):
    if graph_backend.name != "emulated":
        pytest.skip("CUDA reports a generic capture error without the op's name")
    x = make_tensor(4, seed=3)
    with pytest.raises(CaptureError, match="nonzero"):
        graph_capturer.capture(lambda: torch.nonzero(x))


class _Interrupt(BaseException):
    pass


@pytest.mark.parametrize("error_type", [ValueError, _Interrupt])
@pytest.mark.parametrize("where", ["segment", "break"])
def test_exception_during_capture_propagates_and_leaves_no_state(graph_capturer, make_tensor, error_type, where):
    x = make_tensor(4, seed=4)

    @eager_on_graph
    def failing_break(h):
        raise error_type("boom")

    def fn():
        h = x + 1
        if where == "break":
            return failing_break(h)
        raise error_type("boom")

    with pytest.raises(error_type, match="boom"):
        graph_capturer.capture(fn)
    _assert_capture_usable_afterwards(graph_capturer, make_tensor)


def test_nested_capture_raises(graph_capturer, make_tensor):
    x = make_tensor(4, seed=5)

    def outer():
        graph_capturer.capture(lambda: x * 2)
        return x + 1

    with pytest.raises(CaptureError, match="re-entrant"):
        graph_capturer.capture(outer)
    _assert_capture_usable_afterwards(graph_capturer, make_tensor)


def test_capture_inside_a_break_body_raises(graph_capturer, make_tensor):
    x = make_tensor(4, seed=6)

    @eager_on_graph
    def sneaky(h):
        graph_capturer.capture(lambda: h * 2)
        return h

    with pytest.raises(CaptureError, match="re-entrant"):
        graph_capturer.capture(lambda: sneaky(x + 1))
    _assert_capture_usable_afterwards(graph_capturer, make_tensor)
