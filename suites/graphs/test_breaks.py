"""Breakable graphs: counts, order, eager re-execution and in-place writeback of break outputs."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.compare import assert_equivalent
from harness.errors import ReplayError
from harness.graphs import break_graph, eager_on_graph, is_capturing

pytestmark = pytest.mark.clause("live-breaks")


class _Pack:
    """An object with tensor attributes and a plain attribute, as engines return from attention."""

    def __init__(self, values: torch.Tensor, step: int) -> None:
        self.values = values
        self.step = step


@pytest.mark.clause("accounting")
def test_counts_and_names(graph_oracle, make_tensor):
    x = make_tensor(4, seed=1)

    @eager_on_graph
    def first(h):
        return h + 1

    @eager_on_graph
    def second(h):
        return h * 2

    def fn():
        h = first(x * 3)
        break_graph()
        return second(h) - 1

    graph = graph_oracle.capture(fn)
    assert (graph.segment_count, graph.break_count) == (4, 3)
    # Qualified names: two breaks named alike in different scopes (each block's `forward`) stay apart.
    names = list(graph.break_names)
    assert len(names) == 3 and names[0] == first.__qualname__ and names[2] == second.__qualname__, names
    assert names[1].rsplit(".", 1)[-1] == "_empty_break", names


def test_segments_and_breaks_replay_in_capture_order(graph_oracle, make_tensor):
    x = make_tensor(5, seed=2)

    def make_program(log):
        @eager_on_graph
        def scale(h, tag):
            log.append(tag)
            return h * 10

        def fn():
            a = scale(x + 1, "a")
            b = scale(a + 1, "b")
            return b + 1

        return fn

    log: list[str] = []
    graph = graph_oracle.capture(make_program(log))
    x.copy_(make_tensor(5, seed=3))
    log.clear()
    graph_oracle.replay(graph, make_program([]), inputs=[x])
    assert log == ["a", "b"]


def test_break_reads_live_python_state_at_replay(graph_oracle, make_tensor):
    """Attention breaks read per-request metadata at replay: that state must not be frozen."""
    x = make_tensor(6, seed=4)
    live = {"scale": 2.0}

    @eager_on_graph
    def attention_like(h):
        return h * live["scale"]

    program = lambda: attention_like(x + 1) + 1  # noqa: E731
    graph = graph_oracle.capture(program)
    live["scale"] = -3.0
    graph_oracle.replay(graph, program, inputs=[x])


def test_every_replay_reruns_every_break(graph_oracle, make_tensor):
    x = make_tensor(3, seed=5)

    def make_program(calls):
        @eager_on_graph
        def first(h):
            calls["first"] += 1
            return h + 1

        @eager_on_graph
        def last(h):
            calls["last"] += 1
            return h * 2

        return lambda: last(first(x) + 1)

    calls, twin_calls = {"first": 0, "last": 0}, {"first": 0, "last": 0}  # the graph's breaks', the eager twin's
    graph = graph_oracle.capture(make_program(calls))
    before = dict(calls)
    for replay in range(2):
        graph_oracle.replay(graph, make_program(twin_calls), inputs=[x], replay=replay)
    assert calls == {"first": before["first"] + 2, "last": before["last"] + 2}


@pytest.mark.clause("write-back")
@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict", "object"])
def test_break_outputs_are_written_back_for_every_kind(graph_oracle, make_tensor, kind):
    x = make_tensor(4, 2, seed=6)
    captured_counter, twin_counter = {"n": 0}, {"n": 0}  # the break's Python state; the eager twin has its own

    def make_program(counter):
        @eager_on_graph
        def produce(h):
            return _produce(h, counter)

        def fn():
            out = produce(x + 1)
            if kind == "tensor":
                return out, out + 1
            if kind in ("tuple", "list"):
                return out, out[0] + out[1]
            if kind == "dict":
                return out, out["double"] + out["triple"]
            return out, out.values + 1

        return fn

    def _produce(h, counter):
        counter["n"] += 1
        double, triple = h * 2, h * 3
        if kind == "tensor":
            return double
        if kind == "tuple":
            return double, triple
        if kind == "list":
            return [double, triple, counter["n"]]
        if kind == "dict":
            result = {"double": double, "triple": triple, "calls": counter["n"]}
            if counter["n"] > 1:
                result["added_later"] = counter["n"]
            return result
        return _Pack(double, counter["n"])

    graph = graph_oracle.capture(make_program(captured_counter))
    twin_counter.update(captured_counter)  # CUDA ran the break at warm-up and capture, the emulation once
    eager = make_program(twin_counter)
    for replay, seed in enumerate((7, 8)):
        x.copy_(make_tensor(4, 2, seed=seed))
        # non-tensor members (the call count, a key added at replay) must be this replay's, as eager's are
        graph_oracle.replay(graph, eager, inputs=[x], kind=kind, replay=replay)


@pytest.mark.clause("changes-raise")
def test_break_changing_output_shape_at_replay_is_an_error(graph_oracle, make_tensor):
    x = make_tensor(4, seed=8)
    size = {"n": 4}

    @eager_on_graph
    def produce(h):
        return h[: size["n"]] * 2

    graph = graph_oracle.capture(lambda: produce(x) + 1)
    size["n"] = 2
    graph_oracle.replay_fails(graph, ReplayError, match="shape")


@pytest.mark.clause("nested-breaks-inline")
def test_break_called_inside_a_break_runs_inline(graph_oracle, make_tensor):
    x = make_tensor(3, seed=9)

    @eager_on_graph
    def inner(h):
        assert not is_capturing()
        return h + 1

    @eager_on_graph
    def outer(h):
        return inner(h) * 2

    program = lambda: outer(x) - 1  # noqa: E731
    graph = graph_oracle.capture(program)
    assert graph.break_count == 1
    x.copy_(make_tensor(3, seed=10))
    graph_oracle.replay(graph, program, inputs=[x])


@pytest.mark.clause("frozen-capture")
def test_disabled_break_is_captured_like_plain_code(graph_oracle, make_tensor):
    x = make_tensor(3, seed=11)

    @eager_on_graph(enable=False)
    def plain(h):
        return h * 4

    program = lambda: plain(x) + 1  # noqa: E731
    graph = graph_oracle.capture(program)
    assert graph.break_count == 0 and graph.segment_count == 1
    x.copy_(make_tensor(3, seed=12))
    graph_oracle.replay(graph, program, inputs=[x])


def test_methods_can_be_breaks(graph_oracle, make_tensor):
    x = make_tensor(2, 4, seed=13)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = 0.5

        @eager_on_graph
        def attend(self, h):
            return h + self.offset

        def forward(self, h):
            return self.attend(h * 2) * 3

    block = Block()
    program = lambda: block(x)  # noqa: E731
    graph = graph_oracle.capture(program, modules=[block])
    assert graph.break_count == 1 and list(graph.break_names) == [Block.attend.__qualname__], graph.break_names
    block.offset = 1.5  # live Python state read by the eager break
    graph_oracle.replay(graph, program, inputs=[x], modules=[block])


@pytest.mark.clause("write-back")
def test_replay_returns_the_output_it_refreshes(graph_oracle, make_tensor):
    """``replay()`` returns ``graph.output`` itself: a handle a caller took from one replay (a runner
    keeps the logits' buffer) reads the next replay's values, for segment and break outputs alike."""
    x = make_tensor(3, 4, seed=14)

    @eager_on_graph
    def attend(h):
        return h.flip(0) + 1

    program = lambda: {"hidden": x * 2, "attended": attend(x - 1)}  # noqa: E731
    graph = graph_oracle.capture(program)
    handle = graph_oracle.replay(graph, program, inputs=[x])
    assert handle is graph.output, "replay() must return graph.output, not a copy of it"
    for seed in (15, 16):
        x.copy_(make_tensor(3, 4, seed=seed))
        assert graph_oracle.replay(graph, program, inputs=[x], seed=seed) is handle


def test_outside_a_capture_a_break_is_a_plain_call(make_tensor):
    x = make_tensor(3, seed=14)
    marked = eager_on_graph(lambda h: h * 2)
    assert not is_capturing()
    assert_equivalent(marked(x), x * 2, exact=True)
    break_graph()  # no capture: nothing to break, nothing raised


@pytest.mark.clause("per-thread")
def test_capture_state_is_per_thread(graph_oracle, make_tensor):
    x = make_tensor(3, seed=15)
    seen = {}

    def other_thread():
        seen["capturing"] = is_capturing()

    def fn():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        seen["here"] = is_capturing()
        return x + 1

    graph_oracle.capture(fn)
    assert seen == {"capturing": False, "here": True}
