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
def test_counts_and_names(graph_capturer, make_tensor):
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

    graph = graph_capturer.capture(fn)
    assert (graph.segment_count, graph.break_count) == (4, 3)
    # Qualified names: two breaks named alike in different scopes (each block's `forward`) stay apart.
    names = list(graph.break_names)
    assert len(names) == 3 and names[0] == first.__qualname__ and names[2] == second.__qualname__, names
    assert names[1].rsplit(".", 1)[-1] == "_empty_break", names


def test_segments_and_breaks_replay_in_capture_order(graph_capturer, make_tensor, exact):
    x = make_tensor(5, seed=2)
    log: list[str] = []

    @eager_on_graph
    def scale(h, tag):
        log.append(tag)
        return h * 10

    def fn():
        a = scale(x + 1, "a")
        b = scale(a + 1, "b")
        return b + 1

    graph = graph_capturer.capture(fn)
    x.copy_(make_tensor(5, seed=3))
    log.clear()
    result = graph.replay()
    assert log == ["a", "b"]
    assert_equivalent(result, ((x + 1) * 10 + 1) * 10 + 1, exact=exact)


def test_break_reads_live_python_state_at_replay(graph_capturer, make_tensor, exact):
    """Attention breaks read per-request metadata at replay: that state must not be frozen."""
    x = make_tensor(6, seed=4)
    live = {"scale": 2.0}

    @eager_on_graph
    def attention_like(h):
        return h * live["scale"]

    graph = graph_capturer.capture(lambda: attention_like(x + 1) + 1)
    live["scale"] = -3.0
    assert_equivalent(graph.replay(), (x + 1) * -3.0 + 1, exact=exact)


def test_every_replay_reruns_every_break(graph_capturer, make_tensor):
    x = make_tensor(3, seed=5)
    calls = {"first": 0, "last": 0}

    @eager_on_graph
    def first(h):
        calls["first"] += 1
        return h + 1

    @eager_on_graph
    def last(h):
        calls["last"] += 1
        return h * 2

    graph = graph_capturer.capture(lambda: last(first(x) + 1))
    before = dict(calls)
    graph.replay()
    graph.replay()
    assert calls == {"first": before["first"] + 2, "last": before["last"] + 2}


@pytest.mark.clause("write-back")
@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict", "object"])
def test_break_outputs_are_written_back_for_every_kind(graph_capturer, make_tensor, exact, kind):
    x = make_tensor(4, 2, seed=6)
    counter = {"n": 0}

    @eager_on_graph
    def produce(h):
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

    def fn():
        out = produce(x + 1)
        if kind == "tensor":
            return out, out + 1
        if kind in ("tuple", "list"):
            return out, out[0] + out[1]
        if kind == "dict":
            return out, out["double"] + out["triple"]
        return out, out.values + 1

    graph = graph_capturer.capture(fn)
    x.copy_(make_tensor(4, 2, seed=7))
    returned, downstream = graph.replay()
    h = x + 1
    if kind == "tensor":
        assert_equivalent(returned, h * 2, exact=exact)
        assert_equivalent(downstream, h * 2 + 1, exact=exact)
    elif kind in ("tuple", "list"):
        assert_equivalent(list(returned[:2]), [h * 2, h * 3], exact=exact)
        assert_equivalent(downstream, h * 2 + h * 3, exact=exact)
        if kind == "list":
            assert returned[2] == counter["n"], "a non-tensor list entry kept its capture-time value"
    elif kind == "dict":
        assert_equivalent(returned["double"], h * 2, exact=exact)
        assert returned["calls"] == counter["n"], "a non-tensor dict value kept its capture-time value"
        assert returned.get("added_later") == counter["n"], "a key the break added at replay was dropped"
        assert_equivalent(downstream, h * 2 + h * 3, exact=exact)
    else:
        assert_equivalent(returned.values, h * 2, exact=exact)
        assert returned.step == counter["n"], "a non-tensor attribute kept its capture-time value"
        assert_equivalent(downstream, h * 2 + 1, exact=exact)


@pytest.mark.clause("changes-raise")
def test_break_changing_output_shape_at_replay_is_an_error(graph_capturer, make_tensor):
    x = make_tensor(4, seed=8)
    size = {"n": 4}

    @eager_on_graph
    def produce(h):
        return h[: size["n"]] * 2

    graph = graph_capturer.capture(lambda: produce(x) + 1)
    size["n"] = 2
    with pytest.raises(ReplayError, match="shape"):
        graph.replay()


@pytest.mark.clause("nested-breaks-inline")
def test_break_called_inside_a_break_runs_inline(graph_capturer, make_tensor, exact):
    x = make_tensor(3, seed=9)

    @eager_on_graph
    def inner(h):
        assert not is_capturing()
        return h + 1

    @eager_on_graph
    def outer(h):
        return inner(h) * 2

    graph = graph_capturer.capture(lambda: outer(x) - 1)
    assert graph.break_count == 1
    x.copy_(make_tensor(3, seed=10))
    assert_equivalent(graph.replay(), (x + 1) * 2 - 1, exact=exact)


@pytest.mark.clause("frozen-capture")
def test_disabled_break_is_captured_like_plain_code(graph_capturer, make_tensor, exact):
    x = make_tensor(3, seed=11)

    @eager_on_graph(enable=False)
    def plain(h):
        return h * 4

    graph = graph_capturer.capture(lambda: plain(x) + 1)
    assert graph.break_count == 0 and graph.segment_count == 1
    x.copy_(make_tensor(3, seed=12))
    assert_equivalent(graph.replay(), x * 4 + 1, exact=exact)


def test_methods_can_be_breaks(graph_capturer, make_tensor, exact):
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
    graph = graph_capturer.capture(lambda: block(x))
    assert graph.break_count == 1 and list(graph.break_names) == [Block.attend.__qualname__], graph.break_names
    block.offset = 1.5  # live Python state read by the eager break
    assert_equivalent(graph.replay(), (x * 2 + 1.5) * 3, exact=exact)


@pytest.mark.clause("write-back")
def test_replay_returns_the_output_it_refreshes(graph_capturer, make_tensor, exact):
    """``replay()`` returns ``graph.output`` itself: a handle a caller took from one replay (a runner
    keeps the logits' buffer) reads the next replay's values, for segment and break outputs alike."""
    x = make_tensor(3, 4, seed=14)

    @eager_on_graph
    def attend(h):
        return h.flip(0) + 1

    graph = graph_capturer.capture(lambda: {"hidden": x * 2, "attended": attend(x - 1)})
    handle = graph.replay()
    assert handle is graph.output, "replay() must return graph.output, not a copy of it"
    for seed in (15, 16):
        x.copy_(make_tensor(3, 4, seed=seed))
        assert graph.replay() is handle
        assert_equivalent(handle, {"hidden": x * 2, "attended": (x - 1).flip(0) + 1}, exact=exact,
                          context={"problem": "a handle returned by an earlier replay", "seed": seed})


def test_outside_a_capture_a_break_is_a_plain_call(make_tensor):
    x = make_tensor(3, seed=14)
    marked = eager_on_graph(lambda h: h * 2)
    assert not is_capturing()
    assert_equivalent(marked(x), x * 2, exact=True)
    break_graph()  # no capture: nothing to break, nothing raised


@pytest.mark.clause("per-thread")
def test_capture_state_is_per_thread(graph_capturer, make_tensor):
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

    graph_capturer.capture(fn)
    assert seen == {"capturing": False, "here": True}
