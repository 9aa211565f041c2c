"""Random programs: after refilling their inputs, a replayed graph equals eager on the same inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.graphs import eager_on_graph

pytestmark = pytest.mark.clause("replay-equals-eager")

OPS = ("add_input", "scale", "relu", "tanh", "matmul", "center", "transpose_view", "inplace_mul",
       "slice_add", "softmax", "break")


@eager_on_graph
def _eager_affine(h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return h * 0.5 + bias


def _run_program(ops: list[tuple[str, float]], inputs: list[torch.Tensor], weight: torch.Tensor,
                 bias: torch.Tensor) -> torch.Tensor:
    h = inputs[0] * 1.0  # a fresh intermediate, so in-place ops never touch the static inputs
    for step, (op, value) in enumerate(ops):
        x = inputs[step % len(inputs)]
        if op == "add_input":
            h = h + x
        elif op == "scale":
            h = h * value  # a Python scalar: frozen into the graph
        elif op == "relu":
            h = torch.relu(h)
        elif op == "tanh":
            h = torch.tanh(h)
        elif op == "matmul":
            h = h @ weight
        elif op == "center":
            h = h - h.mean(dim=-1, keepdim=True)
        elif op == "transpose_view":
            h = h.t().contiguous().t()
        elif op == "inplace_mul":
            h.mul_(value)
        elif op == "slice_add":
            h = h.clone()
            h[: max(1, h.shape[0] // 2)] += x[: max(1, h.shape[0] // 2)]
        elif op == "softmax":
            h = torch.softmax(h, dim=-1)
        elif op == "break":
            h = _eager_affine(h, bias)
    return h


programs = st.lists(
    st.tuples(st.sampled_from(OPS), st.sampled_from((0.5, -1.25, 2.0))), min_size=1, max_size=12
)


@given(ops=programs, rows=st.integers(1, 9), width=st.integers(1, 9), input_count=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1))
def test_replay_after_refill_equals_eager(graph_capturer, make_tensor, exact, failure_context, ops, rows, width,
                                          input_count, seed):
    inputs = [make_tensor(rows, width, seed=seed + i) for i in range(input_count)]
    weight = make_tensor(width, width, seed=seed + 100) / width**0.5
    bias = make_tensor(width, seed=seed + 101)
    graph = graph_capturer.capture(lambda: _run_program(ops, inputs, weight, bias))
    assert graph.break_count == sum(op == "break" for op, _ in ops)
    for refill in range(2):
        for i, tensor in enumerate(inputs):
            tensor.copy_(make_tensor(rows, width, seed=seed + 1000 * (refill + 1) + i))
        bias.copy_(make_tensor(width, seed=seed + 7000 + refill))
        replayed = graph.replay().clone()
        expected = _run_program(ops, inputs, weight, bias)
        assert_equivalent(replayed, expected, exact=exact, context=failure_context(
            program=ops, shape=(rows, width), seed=seed, refill=refill))
