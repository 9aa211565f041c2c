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
def test_tensorless_break_output_reaches_a_later_break(graph_oracle, make_tensor, kind):
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

    graph = graph_oracle.capture(fn)
    for replay, k in enumerate([5, 7, 4, 10]):
        state["k"] = k
        x.copy_(make_tensor(2, 3, seed=10 + replay))
        graph_oracle.replay(graph, fn, inputs=[x], kind=kind, replay=replay, k=k,
                            checking="a later break reading the tensorless output")


def test_tensorless_break_output_is_the_graph_output(graph_oracle, make_tensor):
    x = make_tensor(3, seed=2)
    state = {"k": 0}

    @eager_on_graph
    def plan(h):
        return {"lengths": [state["k"]] * (state["k"] % 3), "done": state["k"] > 4}

    program = lambda: plan(x + 1)  # noqa: E731
    graph = graph_oracle.capture(program)
    for k in [1, 5, 3]:
        state["k"] = k  # what replay() returns, graph.output and the handle held since capture: all this k's plan
        graph_oracle.replay(graph, program, inputs=[x], k=k)


@pytest.mark.clause("immutable-values-refused")
@pytest.mark.parametrize("output", ["int", "tuple_with_a_count", "nested_tuple_with_a_flag"])
def test_python_value_outside_a_container_is_refused_at_capture(graph_oracle, make_tensor, output):
    """An int returned bare, or inside tuples only, can never be updated in place: the holders of the
    captured output would read its capture-time value forever. The capture says so."""
    x = make_tensor(3, seed=3)
    built = {"int": lambda h: 3, "tuple_with_a_count": lambda h: (h * 2, 3),
             "nested_tuple_with_a_flag": lambda h: (h, (h + 1, True))}[output]
    breaker = eager_on_graph(built)
    graph_oracle.capture_fails(lambda: breaker(x + 1), CaptureError, match="cannot be updated in place", output=output)


def test_non_dense_views_are_written_back_element_by_element(graph_oracle, make_tensor):
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

    graph = graph_oracle.capture(fn)
    for replay in range(2):
        x.copy_(make_tensor(rows, width, seed=20 + replay))
        graph_oracle.replay(graph, fn, inputs=[x, weight], replay=replay)


def test_moving_window_of_a_ring_buffer_is_read_at_its_new_position(graph_oracle, make_tensor):
    """``ring[start:start + rows]`` with ``start`` advancing. Segments after the break read the
    captured window's memory, so the new window's values are copied there (that memory is the
    capture-time window of the ring, which the contract lets the write-back overwrite: docs/graphs.md);
    the rest of the ring must hold exactly what the eager twin's holds."""
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

    def state(w: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"x": w["x"], "ring outside the capture-time window": w["ring"][rows:]}

    captured, twin = world(6), world(6)
    graph, eager = graph_oracle.capture(program(captured)), program(twin)
    for replay, start in enumerate([rows, rows // 2, 3 * rows]):  # rows // 2 overlaps the captured window
        for w in (captured, twin):
            w["start"] = start
            w["x"].copy_(make_tensor(rows, width, seed=30 + replay))
        graph_oracle.replay(graph, eager, inputs=state(captured), eager_inputs=state(twin), replay=replay,
                            start=start)


@pytest.mark.clause("live-breaks")
def test_random_draws_inside_a_break_are_fresh_and_in_the_eager_stream(graph_oracle, make_tensor):
    """A sampler or dropout in an eager region: each replay draws new numbers, exactly those eager
    execution draws from the same generator state, and leaves the generator where eager leaves it (the
    checker runs the replay and its eager twin from one generator state and compares both)."""
    x = make_tensor(8, 5, seed=7)

    @eager_on_graph
    def sample(h):
        return h + torch.rand(h.shape, device=h.device) + torch.nn.functional.dropout(h, p=0.5, training=True)

    def fn():
        return sample(x * 2) * 3

    graph = graph_oracle.capture(fn)
    for replay in range(3):
        torch.manual_seed(100 + replay)
        graph_oracle.replay(graph, fn, inputs=[x], replay=replay, seed=100 + replay)
        graph_oracle.replay(graph, fn, inputs=[x], replay=replay, seed="the stream moved on")  # no reseed
