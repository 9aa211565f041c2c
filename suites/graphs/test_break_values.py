"""What a break hands to what follows it: outputs without tensors, views, moving windows, random draws.

Each test holds one clause of the write-back contract (docs/graphs.md) against an oracle computed
eagerly: the same function run outside any capture, on the same or a twin state.

* A break output that holds no tensor (a list of lengths, a plan dict of ints, an empty list) is
  written back in place, so a later break that received it at capture reads this replay's values; a
  Python value no list, dict or object encloses cannot be, and the capture refuses it.
* A break that returns a non-dense view (a column slice of a fused qkv buffer, a transposed view)
  gets its new values written element by element through the captured view's strides.
* A break that returns a window of a persistent ring buffer at a position that moves between
  replays: later segments read this replay's window, not the capture-time one.
* A break that draws random numbers draws fresh ones at every replay, from the same generator
  stream as eager execution.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from harness.compare import assert_equivalent
from harness.errors import CaptureError
from harness.graphs import eager_on_graph

pytestmark = pytest.mark.clause("write-back")


@dataclasses.dataclass
class Plan:
    """A scheduling plan as an engine passes it between eager regions: Python values only."""

    lengths: list[int]
    step: int


# name -> the tensorless output a break builds from the live Python state ``k``
TENSORLESS_OUTPUTS = {
    "list_of_values": lambda k: [k, k * 2],
    "nested_containers": lambda k: {"lengths": [k, [k + 1, k + 2]], "plan": {"step": k}},
    "empty_then_filled": lambda k: list(range(k % 4)),
    "object_of_values": lambda k: Plan([k] * (k % 3), k),
}


def _total(value: Any) -> float:
    if isinstance(value, dict):
        return sum(_total(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum((i + 1) * _total(item) for i, item in enumerate(value)) + len(value)
    if isinstance(value, Plan):
        return _total(value.lengths) + 3 * value.step
    return float(value)


@pytest.mark.parametrize("kind", sorted(TENSORLESS_OUTPUTS))
def test_tensorless_break_output_reaches_a_later_break(graph_capturer, make_tensor, exact, failure_context, kind):
    x = make_tensor(2, 3, seed=1)
    state = {"k": 4}  # k % 4 == 0: "empty_then_filled" is empty at capture

    @eager_on_graph
    def make_values(h):
        return TENSORLESS_OUTPUTS[kind](state["k"])

    @eager_on_graph
    def use_values(h, values):
        return h * _total(values)

    def fn():
        y = x * 2
        return use_values(y, make_values(y)) + 1

    graph = graph_capturer.capture(fn)
    for replay, k in enumerate([5, 7, 4, 10]):
        state["k"] = k
        x.copy_(make_tensor(2, 3, seed=10 + replay))
        assert_equivalent(graph.replay(), fn(), exact=exact,
                          context=failure_context(kind=kind, replay=replay, k=k,
                                                  checking="a later break reading the tensorless output"))


def test_tensorless_break_output_is_the_graph_output(graph_capturer, make_tensor, failure_context):
    x = make_tensor(3, seed=2)
    state = {"k": 0}

    @eager_on_graph
    def plan(h):
        return {"lengths": [state["k"]] * (state["k"] % 3), "done": state["k"] > 4}

    graph = graph_capturer.capture(lambda: plan(x + 1))
    handle = graph.output
    for k in [1, 5, 3]:
        state["k"] = k
        expected = {"lengths": [k] * (k % 3), "done": k > 4}
        assert graph.replay() == expected and handle == expected, failure_context(
            k=k, returned=graph.output, held=handle, expected=expected)


@pytest.mark.clause("immutable-values-refused")
@pytest.mark.parametrize("output", ["int", "tuple_with_a_count", "nested_tuple_with_a_flag"])
def test_python_value_outside_a_container_is_refused_at_capture(graph_capturer, make_tensor, output):
    """An int returned bare, or inside tuples only, can never be updated in place: the holders of the
    captured output would read its capture-time value forever. The capture says so."""
    x = make_tensor(3, seed=3)
    built = {"int": lambda h: 3, "tuple_with_a_count": lambda h: (h * 2, 3),
             "nested_tuple_with_a_flag": lambda h: (h, (h + 1, True))}[output]
    breaker = eager_on_graph(built)
    with pytest.raises(CaptureError, match="cannot be updated in place"):
        graph_capturer.capture(lambda: breaker(x + 1))


def test_non_dense_views_are_written_back_element_by_element(graph_capturer, make_tensor, exact, failure_context):
    """A fused qkv projection split into column slices (strided, not dense) and a transposed view."""
    rows, width = 4, 3
    x, weight = make_tensor(rows, width, seed=4), make_tensor(width, 3 * width, seed=5)

    @eager_on_graph
    def project_qkv(h):
        q, k, v = (h @ weight).split(width, dim=1)  # each (rows, width) with row stride 3 * width
        return q, k.t(), v

    def fn():
        q, k_t, v = project_qkv(x * 1.0)
        assert not q.is_contiguous() and not k_t.is_contiguous()
        return {"q": q * 1.0, "k_t": k_t * 1.0, "v": v * 1.0, "attended": (q @ k_t) @ v}

    graph = graph_capturer.capture(fn)
    for replay in range(2):
        x.copy_(make_tensor(rows, width, seed=20 + replay))
        assert_equivalent(graph.replay(), fn(), exact=exact, context=failure_context(replay=replay))


def test_moving_window_of_a_ring_buffer_is_read_at_its_new_position(graph_capturer, make_tensor, exact,
                                                                     failure_context):
    """``ring[start:start + rows]`` with ``start`` advancing. Segments after the break read the
    captured window's memory, so the new window's values are copied there (that memory is the
    capture-time window of the ring: docs/graphs.md); a current window apart from it must hold exactly
    what the break wrote, as in the eager twin."""
    rows, width = 4, 3

    def world(seed: int) -> dict[str, Any]:
        return {"x": make_tensor(rows, width, seed=seed), "ring": torch.zeros(4 * rows, width, device=make_tensor(
            1, seed=0).device), "start": 0}

    def program(w: dict[str, Any]):
        @eager_on_graph
        def append(h):
            window = w["ring"][w["start"]:w["start"] + rows]
            window.copy_(h * 2)
            return window

        return lambda: append(w["x"] * 1.0) + 1

    captured, twin = world(6), world(6)
    graph, eager = graph_capturer.capture(program(captured)), program(twin)
    for replay, start in enumerate([rows, rows // 2, 3 * rows]):  # rows // 2 overlaps the captured window
        for w in (captured, twin):
            w["start"] = start
            w["x"].copy_(make_tensor(rows, width, seed=30 + replay))
        context = failure_context(replay=replay, start=start)
        assert_equivalent(graph.replay(), eager(), exact=exact, context={**context, "checking": "replay() result"})
        if start >= rows:  # a window overlapping the captured one shares the memory the write-back fills
            assert_equivalent(captured["ring"][start:start + rows], twin["ring"][start:start + rows], exact=exact,
                              context={**context, "checking": "the ring's current window"})


def _generator_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


@pytest.mark.clause("live-breaks")
def test_random_draws_inside_a_break_are_fresh_and_in_the_eager_stream(graph_capturer, make_tensor, device, exact,
                                                                        failure_context):
    """A sampler or dropout in an eager region: each replay draws new numbers, exactly those eager
    execution draws from the same generator state, and leaves the generator where eager leaves it."""
    x = make_tensor(8, 5, seed=7)

    @eager_on_graph
    def sample(h):
        return h + torch.rand(h.shape, device=h.device) + torch.nn.functional.dropout(h, p=0.5, training=True)

    def fn():
        return sample(x * 2) * 3

    graph = graph_capturer.capture(fn)
    previous = None
    for replay in range(3):
        torch.manual_seed(100 + replay)
        replayed = graph.replay().clone()
        after_replay = _generator_states(device)
        torch.manual_seed(100 + replay)
        expected = fn()
        context = failure_context(replay=replay, seed=100 + replay)
        assert_equivalent(replayed, expected, exact=exact, context={**context, "checking": "the break's draws"})
        for state, eager_state in zip(after_replay, _generator_states(device)):
            assert torch.equal(state, eager_state), (
                f"after replay {replay} the generator is not where eager execution leaves it: {context}")
        again = graph.replay().clone()  # no reseed: the stream moves on, so must the draws
        assert not torch.equal(again, replayed), f"two replays drew the same numbers in a break: {context}"
        assert previous is None or not torch.equal(previous, replayed), context
        previous = replayed
