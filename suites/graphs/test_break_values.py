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

import collections
import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st

from harness.errors import CaptureError, ReplayError
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


@pytest.mark.parametrize("other_view", ["transposed", "rows_as_columns"])
def test_view_at_the_captured_address_with_other_strides_is_read_through_them(graph_oracle, make_tensor, other_view):
    """A break fills a square scratch buffer and returns it, at some calls through another view that starts at the
    same address (a kernel choosing its output layout). That view reads other elements, so its values are copied
    into the captured view, which later segments read; eager reads the new view (``docs/graphs.md``, views)."""
    n = 4
    x = make_tensor(n, n, seed=11)
    scratch = torch.zeros(n, n, device=x.device)  # rewritten whole by every call before it is read
    views = {"transposed": lambda buf: buf.t(), "rows_as_columns": lambda buf: buf.as_strided((n, n), (1, n))}
    state = {"other": False}

    @eager_on_graph
    def fill(h):
        scratch.copy_(h * 2)
        return views[other_view](scratch) if state["other"] else scratch

    # A contiguous result whatever layout the break chose (the output's strides would follow eager's view otherwise).
    program = lambda: fill(x * 1.0).clone(memory_format=torch.contiguous_format) + x  # noqa: E731
    graph = graph_oracle.capture(program)
    for replay, other in enumerate([True, False, True]):
        state["other"] = other
        x.copy_(make_tensor(n, n, seed=40 + replay))
        graph_oracle.replay(graph, program, inputs=[x], exact=True, replay=replay, other=other)


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


# Every container form the write-back contract admits (docs/graphs.md): tensors, lists, tuples, namedtuples, dicts,
# dataclasses (frozen or not, with or without __slots__), plain objects (__dict__ or __slots__), nested to any depth,
# holding Python values, None and opaque leaves. A container that holds no tensor may change its length, keys or
# attributes from one call to the next; a Python value needs a list, dict or non-frozen object above it.
_ARITIES = range(4)
_RECORDS = {n: collections.namedtuple(f"Record{n}", [f"f{i}" for i in range(n)]) for n in _ARITIES}
_DATACLASS_KINDS = {"dataclass": {}, "frozen": {"frozen": True}, "slotted": {"slots": True},
                    "frozen_slotted": {"frozen": True, "slots": True}}
_DATACLASSES = {(kind, n): dataclasses.make_dataclass(f"{kind.title().replace('_', '')}{n}",
                                                      [(f"f{i}", Any) for i in range(n)], **options)
                for kind, options in _DATACLASS_KINDS.items() for n in _ARITIES}


class Attributes:
    """A plain object whose attributes a break sets one by one (an engine's per-step scratch object)."""


class SlottedAttributes:
    __slots__ = ("a0", "a1", "a2")


class OneSlot:
    """A class whose ``__slots__`` is one string, not a sequence of names (Python allows both)."""

    __slots__ = "a0"


# Python values: need a mutable container above them. "retyped" is a number equal by == across calls but of another
# type (1, 1.0, True): eager hands the caller this call's type.
_VALUE_LEAVES = ("int", "float", "str", "bool", "appearing", "retyped")
# Leaves that are not Python values: a device equal to but not the capture-time object (torch.device is built anew,
# unlike a dtype); a numpy array, whose == gives no truth value (it stays where a mutable container encloses it: the
# contract does not say what a changing array no container can take must do).
_OPAQUE_LEAVES = ("device", "array")
_LEAVES = ("tensor", "none", "dtype", *_OPAQUE_LEAVES, *_VALUE_LEAVES)
_CONTAINERS = ("list", "tuple", "namedtuple", "dict", *_DATACLASS_KINDS, "object", "slotted_object")
_MUTABLE = ("list", "dict", "dataclass", "slotted", "object", "slotted_object", "one_slot")

return_forms = st.recursive(
    st.sampled_from(_LEAVES).map(lambda leaf: (leaf,)),
    lambda children: st.one_of(
        st.tuples(st.sampled_from(_CONTAINERS), st.lists(children, max_size=3).map(tuple)),
        st.tuples(st.just("one_slot"), st.lists(children, max_size=1).map(tuple)),
    ),
    max_leaves=10,
)


def _holds_tensor(form: tuple[Any, ...]) -> bool:
    return form[0] == "tensor" or (len(form) == 2 and any(_holds_tensor(child) for child in form[1]))


def _unenclosed(form: tuple[Any, ...], leaves: tuple[str, ...], *, enclosed: bool = False) -> bool:
    """Whether one of ``leaves`` sits where no list, dict or non-frozen object encloses it: a Python value there
    makes the capture refuse, an opaque leaf (a dtype) that changes there makes the replay refuse."""
    if form[0] in leaves:
        return not enclosed
    return len(form) == 2 and any(_unenclosed(child, leaves, enclosed=enclosed or form[0] in _MUTABLE)
                                  for child in form[1])


def _build(form: tuple[Any, ...], k: int, h: torch.Tensor, counter: list[int]) -> Any:
    """The object a break returns for ``form`` at step ``k``: new each call, its tensors computed from ``h``, its
    Python values from ``k``; a container without tensors leaves out its last member (or attribute) on odd ``k``."""
    counter[0] += 1
    index, kind = counter[0], form[0]
    if kind == "tensor":
        return h * (1 + index / 8) + k
    leaf = {"int": lambda: 3 * k + index, "float": lambda: k / 4 + index, "str": lambda: f"s{k % 5}x{index}",
            "bool": lambda: k % 2 == 0, "appearing": lambda: None if k % 2 else k + index, "none": lambda: None,
            "dtype": lambda: torch.float64 if k % 4 == 3 else torch.float32, "device": lambda: torch.device(h.device),
            "retyped": lambda: (1, 1.0, True)[k % 3], "array": lambda: np.array([k, index])}.get(kind)
    if leaf is not None:
        return leaf()
    children = form[1]
    members = [_build(child, k, h, counter) for child in children]
    if kind in ("list", "dict", "object", "slotted_object", "one_slot") and not _holds_tensor(form) and k % 2:
        members = members[:-1]  # a tensorless container may change its length, keys or attributes
    if kind == "list":
        return members
    if kind == "dict":  # keys in the order built, the first left out on k % 3 == 0 (it comes back at the front)
        keys = [f"key{i}" for i in range(len(members))]
        return {key: value for key, value in zip(keys, members)
                if not (key == "key0" and k % 3 == 0 and not _holds_tensor(form))}
    if kind == "tuple":
        return tuple(members)
    if kind == "namedtuple":
        return _RECORDS[len(children)](*members)
    if kind in _DATACLASS_KINDS:
        return _DATACLASSES[kind, len(children)](*members)
    result: Any = {"object": Attributes, "slotted_object": SlottedAttributes, "one_slot": OneSlot}[kind]()
    # A tensorless object leaves out its first attribute on k % 3 == 0 too: set again later, it comes back at the end
    # of a plain object's __dict__, and a caller iterating the object meets it there in eager.
    first = 1 if kind == "object" and k % 3 == 0 and not _holds_tensor(form) else 0
    for i, value in list(enumerate(members))[first:]:
        setattr(result, f"a{i}", value)
    return result


def _members_of(value: Any) -> list[tuple[str, Any]]:
    slots = getattr(type(value), "__slots__", ())
    names = list(getattr(value, "__dict__", {})) + [name for name in ((slots,) if isinstance(slots, str) else slots)
                                                    if hasattr(value, name)]
    return [(name, getattr(value, name)) for name in dict.fromkeys(names)]


_TYPE_MARK = {bool: 1 / 64, float: 1 / 32}


def _fingerprint(value: Any, path: str = "out") -> Any:
    """A number reading every leaf of ``value`` in iteration order, with its place: what a later break computes from
    the object it received at capture (it must see this call's leaves, their number, keys and order)."""
    if isinstance(value, torch.Tensor):
        return value.sum() * len(path)
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = [(f"{path}[{key}]", item) for key, item in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    elif value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        if isinstance(value, str):
            leaf = len(value) + sum(map(ord, value)) % 17
        else:
            leaf = (0.5 if value is None else 0.25 if isinstance(value, torch.dtype)
                    else 0.375 if isinstance(value, torch.device) else float(value))
        return len(path) + leaf + _TYPE_MARK.get(type(value), 0.0)  # the type a caller would see too
    elif isinstance(value, np.ndarray):
        return len(path) + float(value.sum()) + 0.75
    else:
        items = [(f"{path}.{type(value).__name__}.{name}", item) for name, item in _members_of(value)]
    return len(items) + sum((i + 1) * _fingerprint(item, where) for i, (where, item) in enumerate(items))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, np.ndarray):
        return []
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return [t for _, item in _members_of(value) for t in _tensors(item)]


# An engine-like output holding every container form once, replayed at steps that drop a tensorless dict's first key
# and bring it back, take an object's last attribute away, change every Python value and the dtype; and a dtype in a
# tuple that changes where nothing can take the new one.
ENGINE_LIKE_OUTPUT = ("dict", (
    ("tensor",),
    ("namedtuple", (("int",), ("tensor",))),
    ("frozen", (("tensor",), ("list", (("int",), ("str",))))),
    ("object", (("int",), ("bool",), ("appearing",))),
    ("dict", (("int",), ("float",), ("none",))),
    ("slotted_object", (("tensor",), ("dict", (("int",),)))),
    ("frozen_slotted", (("tuple", (("dtype",),)),)),
    ("slotted", (("list", (("tuple", (("int",),)),)),)),
))
CHANGED_DTYPE_IN_A_TUPLE = ("tuple", (("tensor",), ("dtype",), ("list", (("int",),))))
# A device in a tuple no container can replace (it must be taken as unchanged: equal, though built anew), numbers of
# another type and numpy arrays in a list, an array in a one-string-__slots__ object.
EQUAL_LEAVES_OF_ANOTHER_IDENTITY_OR_TYPE = ("tuple", (
    ("tensor",), ("device",), ("list", (("retyped",), ("array",), ("one_slot", (("array",),)), ("int",))),
))
# Plain and slotted objects whose first or last attribute goes and comes back, as None too.
ATTRIBUTES_THAT_GO_AND_COME_BACK = ("list", (
    ("object", (("int",), ("str",), ("none",))),
    ("slotted_object", (("int",), ("none",))),
    ("tensor",),
))


@given(form=return_forms, steps=st.lists(st.integers(0, 40), min_size=2, max_size=5),
       rows=st.integers(1, 3), width=st.integers(1, 3))
@example(form=ENGINE_LIKE_OUTPUT, steps=[4, 3, 6, 1, 2], rows=2, width=3)
@example(form=CHANGED_DTYPE_IN_A_TUPLE, steps=[1, 3, 2], rows=2, width=3)
@example(form=("frozen", (("tensor",), ("namedtuple", (("int",),)))), steps=[1, 2], rows=1, width=2)  # refused
@example(form=EQUAL_LEAVES_OF_ANOTHER_IDENTITY_OR_TYPE, steps=[1, 2, 3, 4], rows=1, width=2)
@example(form=ATTRIBUTES_THAT_GO_AND_COME_BACK, steps=[1, 3, 4, 6], rows=1, width=2)
def test_every_container_form_a_break_returns_is_written_back(graph_oracle, make_tensor, form, steps, rows, width):
    """A break returns ``form`` built anew at each call; captured ops read each of its tensors, a later break reads
    every leaf of the object it received at capture, and the caller holds it in the graph's output. Eager is the
    oracle at every replay; where a Python value has no list, dict or object above it the capture must refuse, and
    where a dtype that changes has none the replay must (``docs/graphs.md``, write-back). An equal leaf that is
    another object (a device) stays accepted wherever it sits."""
    assume(not _unenclosed(form, ("array",)))
    oracle = graph_oracle.fresh()
    x = make_tensor(rows, width, seed=len(steps))
    state = {"k": 0}  # even at capture: an "appearing" value is present there

    @eager_on_graph
    def produce(h):
        return _build(form, state["k"], h, [0])

    @eager_on_graph
    def read_every_leaf(h, out):
        return h * 0.5 + _fingerprint(out)

    def fn():
        h = x * 2
        out = produce(h)
        for i, tensor in enumerate(_tensors(out)):
            h = h + tensor * (i + 1)
        return {"hidden": read_every_leaf(h, out), "out": out}

    if _unenclosed(form, _VALUE_LEAVES):
        oracle.capture_fails(fn, CaptureError, match="cannot be updated in place", form=form)
        return
    graph = oracle.capture(fn, form=form)
    for replay, k in enumerate(steps):
        state["k"] = k
        x.copy_(make_tensor(rows, width, seed=100 + replay))
        if k % 4 == 3 and _unenclosed(form, ("dtype",)):  # no container can take the new dtype: it must raise
            oracle.replay_fails(graph, ReplayError, form=form, replay=replay, k=k)
        else:  # and a replay after a refused one equals eager again
            oracle.replay(graph, fn, inputs=[x], form=form, replay=replay, k=k)


class Batch:
    """An engine's batch whose requests point back to it: a break output with reference cycles."""


class Request:
    pass


def _batch_fingerprint(batch: Batch) -> float:
    """What a later break reads of the batch it received at capture: every request's length and place, whether each
    points back to this batch, and how many requests the batch's own list holds (walked once, not along the cycles)."""
    requests = sum((i + 1) * (request.length + 0.5 * (request.batch is batch) + 0.25 * len(request.batch.requests))
                   for i, request in enumerate(batch.requests))
    return requests + len(batch.notes) + sum(batch.notes[1:]) + (batch.notes[0] is batch.notes)


@pytest.mark.parametrize("tensor_first", [False, True])
def test_break_output_with_reference_cycles_is_written_back(graph_oracle, make_tensor, tensor_first):
    """A break returns a batch whose requests point back to it and a notes list that holds itself; the write-back
    follows each cycle back to the captured object instead of recursing without end, and a later break reads this
    call's lengths through the captured batch, as eager reads the new one (``docs/graphs.md``, write-back).
    The cycles come before the batch's tensor, or after it, in attribute order."""
    x = make_tensor(2, 3, seed=7)
    state = {"k": 0}

    @eager_on_graph
    def schedule(h):
        batch = Batch()
        if tensor_first:
            batch.hidden = h * 2
        batch.requests = []
        for i in range(3):
            request = Request()
            request.batch, request.length = batch, state["k"] * (i + 1)
            batch.requests.append(request)
        batch.notes = []
        batch.notes += [batch.notes] + [state["k"]] * (state["k"] % 3)  # tensorless: its length may change
        if not tensor_first:
            batch.hidden = h * 2
        return batch

    @eager_on_graph
    def read(h, batch):
        return h * 0.5 + _batch_fingerprint(batch)

    def fn():
        batch = schedule(x + 1)
        return read(batch.hidden * 3, batch)

    graph = graph_oracle.capture(fn)
    for replay, k in enumerate([1, 5, 3]):
        state["k"] = k
        x.copy_(make_tensor(2, 3, seed=20 + replay))
        graph_oracle.replay(graph, fn, inputs=[x], replay=replay, k=k, tensor_first=tensor_first)
