"""Random programs: after refilling their inputs, a replayed graph equals eager on the same inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.errors import ReplayError
from harness.graphs import eager_on_graph
from harness.oracle import CALLING_MODES

pytestmark = pytest.mark.clause("replay-equals-eager")

OPS = ("add_input", "scale", "relu", "tanh", "matmul", "center", "transpose_view", "inplace_mul",
       "slice_add", "softmax", "break", "nested_break", "fallback_math", "fallback_break", "retry")
# A fast path that refuses wide rows, as an attention backend refuses a shape it does not support: the program
# handles the refusal during capture (falls back to eager math or to another break, or retries in a form the
# fast path takes), and the replay must replay that handler (clause handled-break-errors).
GUARDED = ("fallback_math", "fallback_break", "retry")
FAST_PATH_WIDTH = 4
# How the program passes a break its arguments: every break call of one program (those that raise at capture, and
# those a break body makes, which run inline) takes them in one of these forms.
CONVENTIONS = ("positional", "keyword", "all_keyword")


class Refused(NotImplementedError):
    """The fast path does not support this shape."""


@eager_on_graph
def _eager_affine(h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return h * 0.5 + bias


def _call(brk: Callable[..., torch.Tensor], form: str, h: torch.Tensor, bias: torch.Tensor,
          **options: Any) -> torch.Tensor:
    """``brk`` called with ``h`` and ``bias`` in the calling convention ``form`` (one of :data:`CONVENTIONS`)."""
    if form == "positional":
        return brk(h, bias, **options)
    if form == "keyword":
        return brk(h, bias=bias, **options)
    return brk(h=h, bias=bias, **options)


@eager_on_graph
def _nested_breaks(h: torch.Tensor, bias: torch.Tensor, *, convention: str) -> torch.Tensor:
    """A break whose body calls another break (an attention wrapper calling a kernel that is a break on its own):
    inside a break body the inner one is a plain call."""
    return _call(_eager_affine, convention, h.tanh(), bias) * 2


# Set between replays: the fast path then refuses every shape, or takes every shape. Where eager would then leave the
# path the capture recorded (a call that returned at capture now refuses, or one that refused now returns), the replay
# must fail loudly; where it would not, the replay equals eager; and once the fast path is back, it equals eager again.
_FAST_PATH = {"takes": "by shape"}


@eager_on_graph
def _fast_path(h: torch.Tensor, bias: torch.Tensor, *, narrow: bool = False) -> torch.Tensor:
    takes = _FAST_PATH["takes"]
    if takes == "no shape" or (takes == "by shape" and h.shape[-1] > FAST_PATH_WIDTH and not narrow):
        raise Refused(f"rows of {h.shape[-1]} > {FAST_PATH_WIDTH}")
    return torch.tanh(h) + bias


def _break_calls(op: str, width: int) -> int:
    """How many breaks one op calls (a refused fast path is a break call too)."""
    if op in ("break", "nested_break"):
        return 1
    if op not in GUARDED:
        return 0
    return 1 if width <= FAST_PATH_WIDTH or op == "fallback_math" else 2


def _run_program(ops: list[tuple[str, float]], inputs: list[torch.Tensor], weight: torch.Tensor,
                 bias: torch.Tensor, convention: str) -> torch.Tensor:
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
            h = _call(_eager_affine, convention, h, bias)
        elif op == "nested_break":
            h = _call(_nested_breaks, convention, h, bias, convention=convention)
        elif op in GUARDED:
            try:
                h = _call(_fast_path, convention, h, bias)
            except Refused:
                if op == "fallback_math":
                    h = torch.tanh(h * value) - bias  # the handler's own ops, captured after the refusal
                elif op == "fallback_break":
                    h = _call(_eager_affine, convention, h * value, bias)
                else:
                    h = _call(_fast_path, convention, h * value, bias, narrow=True)
    return h


class Program(torch.nn.Module):
    """A random op program as an engine hands it to a capturer: a module whose ``forward`` takes no argument and
    reads static inputs the caller refills in place, a weight parameter (it requires grad, as a model's do) and a
    bias buffer."""

    def __init__(self, ops: list[tuple[str, float]], inputs: list[torch.Tensor], weight: torch.Tensor,
                 bias: torch.Tensor, convention: str) -> None:
        super().__init__()
        self.ops, self.inputs, self.convention = ops, inputs, convention
        self.weight = torch.nn.Parameter(weight)
        self.register_buffer("bias", bias)

    def forward(self) -> torch.Tensor:
        return _run_program(self.ops, self.inputs, self.weight, self.bias, self.convention)


# How the program is handed to the capturer: the module itself, its bound forward (hooks bypassed), or a closure.
HANDED = {"module": lambda program: program, "bound forward": lambda program: program.forward,
          "closure": lambda program: lambda: program()}

programs = st.lists(
    st.tuples(st.sampled_from(OPS), st.sampled_from((0.5, -1.25, 2.0))), min_size=1, max_size=12
)


@given(ops=programs, rows=st.integers(1, 9), width=st.integers(1, 9), input_count=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(CALLING_MODES), handed=st.sampled_from(sorted(HANDED)),
       training=st.booleans(), refills=st.lists(st.booleans(), min_size=1, max_size=3),
       convention=st.sampled_from(CONVENTIONS))
# every guarded path refusing at capture (rows wider than the fast path takes) and a nested break, called by keyword
@example(ops=[("fallback_math", 0.5), ("nested_break", 2.0), ("fallback_break", -1.25), ("retry", 0.5)], rows=3,
         width=FAST_PATH_WIDTH + 2, input_count=2, seed=45, mode=CALLING_MODES[0], handed="closure", training=False,
         refills=[True, False], convention="keyword")
def test_replay_after_refill_equals_eager(graph_oracle, make_tensor, ops, rows, width, input_count, seed, mode, handed,
                                          training, refills, convention):
    """Captured and replayed under the caller's ``mode``, every break called in the drawn ``convention``; before
    each replay the caller refills every tensor the program reads (inputs, bias buffer, weight parameter), or
    replays again as it is."""
    oracle = graph_oracle.fresh()
    inputs = [make_tensor(rows, width, seed=seed + i) for i in range(input_count)]
    program = Program(ops, inputs, make_tensor(width, width, seed=seed + 100) / width**0.5,
                      make_tensor(width, seed=seed + 101), convention).train(training)
    fn = HANDED[handed](program)
    graph = oracle.capture(fn, modules=[program], mode=mode, program=ops, handed=handed)
    # a break the program called and that refused counts as a recorded break
    assert graph.break_count == sum(_break_calls(op, width) for op, _ in ops), graph.break_names
    for replay, refill in enumerate(refills):
        if refill:
            with torch.no_grad():  # as an engine loads new weights: in place, outside autograd
                for i, tensor in enumerate(inputs):
                    tensor.copy_(make_tensor(rows, width, seed=seed + 1000 * (replay + 1) + i))
                program.bias.copy_(make_tensor(width, seed=seed + 7000 + replay))
                program.weight.copy_(make_tensor(width, width, seed=seed + 8000 + replay) / width**0.5)
        oracle.replay(graph, fn, inputs=inputs, modules=[program], mode=mode, program=ops, shape=(rows, width),
                      seed=seed, handed=handed, training=training, replay=replay, refilled=refill)
    guarded = [op for op, _ in ops if op in GUARDED]
    for takes in ("no shape", "every shape"):
        if not guarded:
            break
        if takes == "no shape":  # a call that returned at capture refuses now
            leaves_the_path = width <= FAST_PATH_WIDTH or "retry" in guarded
        else:  # a call that refused at capture returns now
            leaves_the_path = width > FAST_PATH_WIDTH
        _FAST_PATH["takes"] = takes
        try:
            if leaves_the_path:
                oracle.replay_fails(graph, (Refused, ReplayError), modules=[program], mode=mode, program=ops,
                                    shape=(rows, width), fast_path_takes=takes)
            else:
                oracle.replay(graph, fn, inputs=inputs, modules=[program], mode=mode, program=ops,
                              shape=(rows, width), seed=seed, handed=handed, fast_path_takes=takes)
        finally:
            _FAST_PATH["takes"] = "by shape"
        oracle.replay(graph, fn, inputs=inputs, modules=[program], mode=mode, program=ops, shape=(rows, width),
                      seed=seed, handed=handed, training=training, replay=f"after the fast path took {takes}")
