"""Breaks that raise during capture, handled by the captured program (an attention backend that refuses a shape,
then a fallback): the handler is recorded as the program ran it, so the replay equals eager; the break runs again
at replay and must raise as it did, else the replay fails loudly (eager would leave the captured path)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness.errors import ReplayError
from harness.graphs import eager_on_graph

pytestmark = pytest.mark.clause("handled-break-errors")


class Unsupported(NotImplementedError):
    """What a fast path raises for a case it does not support."""


def _fast_path(state):
    @eager_on_graph
    def fast(h):
        if state["unsupported"]:
            raise Unsupported("no fast path for this shape")
        return h * 2

    return fast


@pytest.mark.parametrize("fallback", ["eager-math", "another-break"])
def test_a_handled_break_error_replays_the_handler(graph_oracle, make_tensor, fallback):
    x = make_tensor(3, 4, seed=11)
    state = {"unsupported": True}
    fast = _fast_path(state)

    @eager_on_graph
    def slow(h):
        return h * 3 - 1

    def fn():
        h = x + 1
        try:
            a = fast(h)
        except Unsupported:
            a = h * 10  # the handler's own ops: recorded, replayed with this replay's x
            if fallback == "another-break":
                a = slow(a)
        return a.sin() + 1

    graph = graph_oracle.capture(fn)
    for seed in (12, 13):
        x.copy_(make_tensor(3, 4, seed=seed))
        graph_oracle.replay(graph, fn, inputs=[x], seed=seed, fallback=fallback)


def test_a_retried_break_replays_both_attempts(graph_oracle, make_tensor):
    x = make_tensor(5, seed=21)
    attempts: list[str] = []

    @eager_on_graph
    def arm():
        attempts.clear()  # a break: each run of the program (and each replay) starts with one refusal

    @eager_on_graph
    def flaky(h):
        attempts.append("try")
        if len(attempts) == 1:
            raise Unsupported("busy")
        return h * 2

    def fn():
        arm()
        h = x.exp()
        try:
            a = flaky(h)
        except Unsupported:
            a = flaky(h + 1)  # the retry sees the handler's input
        return a - 1

    graph = graph_oracle.capture(fn)
    x.copy_(make_tensor(5, seed=22))
    graph_oracle.replay(graph, fn, inputs=[x])
    assert attempts == ["try", "try"], f"each run of the program tries twice; the last one tried {attempts}"


def test_a_failed_break_redoes_its_partial_work(graph_oracle, make_tensor):
    """The break writes a buffer, then refuses; the handler reads the buffer. Eager redoes the write every run."""
    x = make_tensor(4, seed=31)
    scratch, eager_scratch = torch.zeros_like(x), torch.zeros_like(x)
    buffers = {"scratch": scratch}

    @eager_on_graph
    def half_done(h):
        buffers["scratch"].copy_(h * 5)
        raise Unsupported("gave up after the first stage")

    def fn():
        with contextlib.suppress(Unsupported):
            half_done(x + 1)
        return buffers["scratch"] + x

    graph = graph_oracle.capture(fn)
    x.copy_(make_tensor(4, seed=32))

    def eager():
        buffers["scratch"] = eager_scratch
        try:
            return fn()
        finally:
            buffers["scratch"] = scratch

    graph_oracle.replay(graph, eager, inputs=[x, scratch], eager_inputs=[x, eager_scratch])


def test_a_break_that_no_longer_raises_fails_the_replay(graph_oracle, make_tensor):
    x = make_tensor(4, seed=41)
    state = {"unsupported": True}
    fast = _fast_path(state)

    def fn():
        try:
            return fast(x)
        except Unsupported:
            return x * 10

    graph = graph_oracle.capture(fn)
    state["unsupported"] = False  # eager would now take the fast path, which the capture never recorded
    graph_oracle.replay_fails(graph, ReplayError, match=r"raised Unsupported at capture.*at replay it returned")
    state["unsupported"] = True
    graph_oracle.replay(graph, fn, inputs=[x])


def test_a_break_that_starts_raising_at_replay_fails_the_replay(graph_oracle, make_tensor):
    """Captured on the fast path; at replay the fast path refuses. Eager would run the handler, which the capture
    never recorded: the replay must not return a value, the break's error reaches the caller (fault-recovery), and
    once the fast path is back the next replay equals eager again."""
    x = make_tensor(4, seed=51)
    state = {"unsupported": False}
    fast = _fast_path(state)

    def fn():
        try:
            return fast(x) + 1
        except Unsupported:
            return x * 10

    graph = graph_oracle.capture(fn)
    state["unsupported"] = True
    graph_oracle.replay_fails(graph, Unsupported)
    state["unsupported"] = False
    x.copy_(make_tensor(4, seed=52))
    graph_oracle.replay(graph, fn, inputs=[x])
