"""Generated breakable programs over every way a break is called and every structure it returns.

A program is a list of steps: captured ops and eager breaks. Each break is drawn from the calling
conventions engines use (positional and keyword tensors; tensors in lists, tuples and dicts; a
metadata dataclass and a metadata dict whose tensors *and* Python values the caller refills in place
between replays; a list of per-request lengths whose members and number the caller changes in the same
list object) and from the return structures they use (a tensor; ``(out, (k, v))``; a dict with a
list and a Python value; dataclasses with and without ``__slots__``, a frozen one; namedtuples in a dict, one of
Python values that the dict takes anew; a plain object that loses an attribute at some refills; ``None`` after writing a
KV-cache-like buffer that the next segment reads; the argument itself, updated in place; and outputs
that hold no tensor at all: a list of Python values, nested containers of them, a list that is empty
at some refills and not at others, which a later break receives and reads). The function returns its
hidden state, a dict holding it and the buffers, or a break's output object.

Every refill changes every value a break can read: the tensors, the metadata's Python values (a
capturer that freezes a container argument's Python values, or hands the break a copy of the list
taken at capture, must fail), and the lengths of the
tensorless outputs.

The oracle is the same program run eagerly on a *twin world*: its own inputs, metadata, buffers and
projection module, built from the same seed and refilled identically. Every capture and replay goes through
the suites' checker (``graph_oracle``), under the caller's autograd mode: it compares the value ``replay()``
returned, ``graph.output`` read again and the handle to ``graph.output`` taken right after capture with the
twin's result, every buffer of the world with the twin's (the KV buffer the breaks wrote, the static
inputs, the metadata tensors), and the process and module state each call leaves. Faults are injected at
replay in the captured world only: the replay must raise and leave the process and modules as they were,
and the next one must equal the twin again, with no state left over.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import GraphHazardError, ReplayError
from harness.graphs import eager_on_graph, is_capturing
from harness.oracle import CALLING_MODES

pytestmark = pytest.mark.clause("replay-equals-eager")

SEGMENT_OPS = ("add_input", "scale_by_metadata", "add_metadata_dict_bias", "tanh", "matmul", "inplace_mul",
               "gather_rows_by_slots")
CONVENTIONS = ("positional", "keyword", "list", "tuple", "dict", "metadata_object", "metadata_dict", "metadata_list")
# python_values, python_nested and python_growing hold no tensor: only a later break can read them.
# frozen, namedtuple_in_dict and shedding_object: containers that cannot change (a frozen dataclass, a namedtuple
# whose Python values a dict takes anew) and an object that loses an attribute at some refills.
RETURNS = ("tensor", "nested", "dict", "object", "slotted", "none", "inplace", "python_values", "python_nested",
           "python_growing", "frozen", "namedtuple_in_dict", "shedding_object")
TENSORLESS_RETURNS = ("python_values", "python_nested", "python_growing")
OUTPUTS = ("hidden", "with_buffers", "break_output")
# raise: the break raises before doing anything; raise_mid_refill: a side-effect break has refilled
# half of the buffer the next segment reads, then raises; wrong_shape: the break returns a result
# whose tensors are (width,) where (rows, width) was captured, a shape Tensor.copy_ would broadcast.
FAULTS = ("raise", "raise_mid_refill", "wrong_shape")
REPLAYS = 3


class InjectedFault(RuntimeError):
    """Raised by a break on purpose, once, at replay."""


@dataclasses.dataclass
class BatchMetadata:
    """Per-batch metadata, as attention backends take it: segments read its tensors, breaks its Python values."""

    scale: torch.Tensor  # (width,)
    slots: torch.Tensor  # (rows,) int64, a permutation: where the KV-like store writes each row
    shift: float
    step: int


@dataclasses.dataclass
class BreakResult:
    out: torch.Tensor
    extra: torch.Tensor
    step: int


@dataclasses.dataclass(slots=True)
class SlottedBreakResult:
    out: torch.Tensor
    extra: torch.Tensor
    step: int


@dataclasses.dataclass(frozen=True)
class FrozenBreakResult:
    """Cannot change after the break: its tensors are refilled in place, its Python values live in a list."""

    out: torch.Tensor
    extra: torch.Tensor
    steps: list[int]


KV = collections.namedtuple("KV", "out extra")
StepInfo = collections.namedtuple("StepInfo", "step even")


class Scratch:
    """A break's plain result object whose attributes differ between calls (``note`` only at some refills)."""


class Projection(torch.nn.Module):
    """The program's one module: a weight parameter (it requires grad, as a model's do)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight


@dataclasses.dataclass
class World:
    """Everything a program reads or writes; the captured program and its eager twin each have one."""

    inputs: list[torch.Tensor]
    model: Projection
    metadata: BatchMetadata
    metadata_dict: dict[str, Any]  # {"bias": (width,) tensor, "gain": float}
    # per-request lengths as a Python list: a refill changes its members and their number, in place (the same
    # list object), as an engine's scheduler updates the list it hands to an attention break
    lengths: list[float]
    cache: torch.Tensor  # (rows, width): written only by breaks that return None
    armed_fault: dict[int, str] = dataclasses.field(default_factory=dict)  # break index -> fault, for one replay

    def buffers(self) -> dict[str, Any]:
        return {"cache": self.cache, "inputs": self.inputs, "metadata.scale": self.metadata.scale,
                "metadata.slots": self.metadata.slots, "metadata_dict.bias": self.metadata_dict["bias"]}


@dataclasses.dataclass(frozen=True)
class Program:
    steps: tuple[tuple[str, ...], ...]  # ("op", name) or ("break", convention, returns)
    output: str
    rows: int
    width: int
    input_count: int

    @property
    def breaks(self) -> list[tuple[str, ...]]:
        return [step for step in self.steps if step[0] == "break"]


def _seeded(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def make_world(program: Program, seed: int, device: torch.device) -> World:
    rows, width = program.rows, program.width
    world = World(
        inputs=[torch.empty(rows, width, device=device) for _ in range(program.input_count)],
        model=Projection(_seeded((width, width), seed + 500, device) / width**0.5),
        metadata=BatchMetadata(torch.empty(width, device=device), torch.empty(rows, dtype=torch.int64, device=device),
                               0.0, 0),
        metadata_dict={"bias": torch.empty(width, device=device), "gain": 0.0},
        lengths=[],
        cache=_seeded((rows, width), seed + 600, device),
    )
    refill(world, seed)
    return world


def refill(world: World, seed: int) -> None:
    """What an engine does between replays: new data in place in the static inputs and the metadata."""
    rows, width = world.cache.shape
    device = world.cache.device
    for i, tensor in enumerate(world.inputs):
        tensor.copy_(_seeded((rows, width), seed + i, device))
    world.metadata.scale.copy_(_seeded((width,), seed + 10, device))
    world.metadata.slots.copy_(torch.randperm(rows, generator=torch.Generator().manual_seed(seed + 11)))
    # Python values: live for breaks, frozen in segments. Refill seeds step by 1000, and each value
    # differs between any two refills less than 9973 apart (check_program asserts it).
    world.metadata.shift = (seed % 9973) / 4096 - 1.0
    world.metadata.step = seed
    world.metadata_dict["bias"].copy_(_seeded((width,), seed + 12, device))
    world.metadata_dict["gain"] = 1.5 - (seed % 9973) / 8192
    world.lengths[:] = [1.0 + (seed % 9973) / 2048] + [0.25] * ((seed // 1000) % 3)


def python_values(world: World) -> tuple[Any, ...]:
    """Every Python value a break reads: a refill must change each of them."""
    return world.metadata.shift, world.metadata.step, world.metadata_dict["gain"], sum(world.lengths)


def _make_break(index: int, convention: str, returns: str, world: World) -> Callable[..., Any]:
    """The eager break ``index`` of a program: its signature is ``convention``, its result ``returns``."""

    def finish(h: torch.Tensor, value: torch.Tensor) -> Any:
        fault = world.armed_fault.pop(index, None)
        if fault is not None and (fault == "raise" or (fault == "raise_mid_refill") != (returns == "none")
                                  or returns in TENSORLESS_RETURNS):
            # a break without a buffer to refill fails plainly; a refilling break, or one without a
            # tensor, has no result to misshape
            raise InjectedFault(f"break {index} fails at this replay")
        if fault == "wrong_shape":  # (width,) where (rows, width) was captured: copy_ would broadcast it
            value, h = value[0], h[0]
        if returns == "tensor":
            return value
        step = world.metadata.step
        if returns == "python_values":  # per-request lengths, as engines pass them between eager regions
            return [step % 5 + 1, world.metadata.shift]
        if returns == "python_nested":  # a scheduling plan: a dict of lists and dicts of Python values
            return {"lengths": [step % 3, step % 7], "plan": {"step": step, "stop": step % 2 == 0}, "tags": []}
        if returns == "python_growing":  # empty at the capture of a seed below 1000, a new length at each refill
            return [step % 11] * ((step // 1000) % 3)
        if returns == "nested":
            return value, (value * 2, value - 1)
        if returns == "dict":
            return {"out": value, "aux": [torch.tanh(value), value * 3], "step": world.metadata.step}
        if returns in ("object", "slotted"):
            kind = BreakResult if returns == "object" else SlottedBreakResult
            return kind(value, value * 3, world.metadata.step)
        if returns == "frozen":
            return FrozenBreakResult(value, value * 3, [step % 5, step % 7])
        if returns == "namedtuple_in_dict":  # the dict takes a new StepInfo at each refill
            return {"kv": KV(value, value - 1), "info": StepInfo(step, step % 2 == 0)}
        if returns == "shedding_object":
            scratch = Scratch()
            scratch.out = value
            if (step // 1000) % 2:  # refill seeds step by 1000: present at every other refill
                scratch.note = [step % 13]
            scratch.step = step
            return scratch
        if returns == "none":  # a KV-cache store: writes in place at the live slots, returns nothing
            if fault == "raise_mid_refill":
                half = max(1, world.cache.shape[0] // 2)
                world.cache.index_copy_(0, world.metadata.slots[:half], value[:half])
                raise InjectedFault(f"break {index} fails half-way through refilling the cache")
            world.cache.index_copy_(0, world.metadata.slots, value)
            return None
        if fault == "wrong_shape":
            return h  # a (width,) view of the argument where the argument itself was returned
        return h.add_(value)  # "inplace": the argument, updated in place, is the result

    if convention == "positional":
        def body(h, other):
            return finish(h, h * 0.5 + other)
    elif convention == "keyword":
        def body(*, hidden, other):
            return finish(hidden, hidden * 0.5 - other)
    elif convention in ("list", "tuple"):
        def body(pair):
            return finish(pair[0], pair[0] * 0.25 + pair[1])
    elif convention == "dict":
        def body(tensors):
            return finish(tensors["hidden"], tensors["hidden"] - tensors["other"] * 0.5)
    elif convention == "metadata_object":
        def body(h, *, metadata):
            return finish(h, h * metadata.scale + metadata.shift)
    elif convention == "metadata_dict":
        def body(h, metadata):
            return finish(h, h * 0.5 + metadata["bias"] * metadata["gain"])
    else:  # metadata_list
        def body(h, lengths):
            return finish(h, h * (0.25 * sum(lengths)) + len(lengths))

    body.__qualname__ = f"break{index}_{convention}_returns_{returns}"
    return eager_on_graph(body)


def _call_break(brk: Callable[..., Any], convention: str, h: torch.Tensor, x: torch.Tensor, world: World) -> Any:
    if convention == "positional":
        return brk(h, x)
    if convention == "keyword":
        return brk(hidden=h, other=x)
    if convention == "list":
        return brk([h, x])
    if convention == "tuple":
        return brk((h, x))
    if convention == "dict":
        return brk({"hidden": h, "other": x})
    if convention == "metadata_object":
        return brk(h, metadata=world.metadata)
    if convention == "metadata_dict":
        return brk(h, world.metadata_dict)
    return brk(h, world.lengths)


def _python_leaves(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _python_leaves(item)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _python_leaves(item)]
    return [float(value)]


@eager_on_graph
def read_python_outputs(h: torch.Tensor, outputs: list[Any]) -> torch.Tensor:
    """A later break reading the tensorless outputs of earlier breaks: the objects they returned at capture."""
    leaves = [leaf for output in outputs for leaf in _python_leaves(output)]
    return h * 0.5 + (sum(leaf * (i + 1) for i, leaf in enumerate(leaves)) % 97) / 16 + len(leaves)


def _consume(returns: str, result: Any, h: torch.Tensor, world: World) -> torch.Tensor:
    """Captured ops after a break, reading every tensor it returned (or the buffer it wrote); a
    tensorless output is read by a later break (:func:`read_python_outputs`), not by the graph."""
    if returns in TENSORLESS_RETURNS:
        return h
    if returns in ("tensor", "inplace"):
        return result
    if returns == "nested":
        out, (k, v) = result
        return out + k * 0.5 - v
    if returns == "dict":
        return result["out"] + result["aux"][0] - result["aux"][1] * 0.5
    if returns in ("object", "slotted", "frozen"):
        return result.out - result.extra * 0.25
    if returns == "namedtuple_in_dict":
        return result["kv"].out - result["kv"].extra * 0.5
    if returns == "shedding_object":
        return result.out
    return h + world.cache  # "none": the segment reads the buffer the break refilled


def _apply_op(op: str, h: torch.Tensor, x: torch.Tensor, world: World) -> torch.Tensor:
    if op == "add_input":
        return h + x
    if op == "scale_by_metadata":
        return h * world.metadata.scale  # a metadata tensor: refilled in place, read by the graph
    if op == "add_metadata_dict_bias":
        return h + world.metadata_dict["bias"]
    if op == "tanh":
        return torch.tanh(h)
    if op == "matmul":
        return world.model(h)
    if op == "inplace_mul":
        return h.mul_(0.5)
    return h[world.metadata.slots]  # gather_rows_by_slots


def _reader_count(program: Program) -> int:
    """How many :func:`read_python_outputs` breaks :func:`build` inserts (one before each break that
    follows unread tensorless outputs, one at the end)."""
    count, unread = 0, False
    for step in program.breaks:
        count, unread = count + unread, step[2] in TENSORLESS_RETURNS
    return count + unread


def build(program: Program, world: World) -> Callable[[], Any]:
    """The program as a zero-argument function over ``world`` (its breaks made once, for this world)."""
    breaks = [_make_break(i, step[1], step[2], world) for i, step in enumerate(program.breaks)]

    def fn() -> Any:
        h = world.inputs[0] * 1.0  # a fresh intermediate: in-place steps never touch a static input
        result: Any = None
        unread: list[Any] = []  # tensorless break outputs not read yet: the next break after them reads them
        next_break = iter(breaks)
        for position, step in enumerate(program.steps):
            x = world.inputs[position % len(world.inputs)]
            if step[0] == "op":
                h = _apply_op(step[1], h, x, world)
                continue
            if unread:
                h = read_python_outputs(h, unread)
                unread = []
            result = _call_break(next(next_break), step[1], h, x, world)
            if step[2] in TENSORLESS_RETURNS:
                unread.append(result)
            h = _consume(step[2], result, h, world)
        if unread:
            h = read_python_outputs(h, unread)
        if program.output == "hidden":
            return h
        if program.output == "with_buffers":
            return {"hidden": h, "cache": world.cache, "inputs": list(world.inputs)}
        return result  # "break_output": the last step is a break whose output is the function's output

    return fn


def check_program(oracle, program: Program, *, seed: int, device: torch.device, mode: str | None,
                  fault: tuple[int, int, str] | None = None) -> None:
    """Capture ``program`` under ``mode``, replay it :data:`REPLAYS` times with refills, each through the checker
    against the eager twin.

    ``fault = (replay, break index, kind)`` makes that break fail at that replay of the captured world.
    """
    captured_world, twin = make_world(program, seed, device), make_world(program, seed, device)
    modules = [captured_world.model]
    graph = oracle.capture(build(program, captured_world), modules=modules, mode=mode, program=program, seed=seed)
    eager = build(program, twin)
    assert graph.break_count == len(program.breaks) + _reader_count(program), (program, seed)
    for replay in range(REPLAYS):
        details = dict(program=program, seed=seed, replay=replay, fault=fault)
        before = python_values(captured_world)
        refill(captured_world, seed + 1000 * (replay + 1))
        refill(twin, seed + 1000 * (replay + 1))
        unchanged = [i for i, (old, new) in enumerate(zip(before, python_values(captured_world))) if old == new]
        assert not unchanged, f"the refill left the Python values {unchanged} of python_values() unchanged: {details}"
        if fault is not None and fault[0] == replay:
            _, index, kind = fault
            captured_world.armed_fault[index] = kind
            misshaped = kind == "wrong_shape" and program.breaks[index][2] not in ("none",) + TENSORLESS_RETURNS
            expected_error = ReplayError if misshaped else InjectedFault
            error = oracle.replay_fails(graph, expected_error, modules=modules, mode=mode, **details)
            _assert_refused_where_it_happened(error)
            assert not captured_world.armed_fault, f"break {index} never ran at the faulty replay: {details}"
            assert not is_capturing(), "a failed replay left a capture active"
            continue  # the twin skips this step too; the next replay must need nothing from it
        oracle.replay(graph, eager, inputs=captured_world.buffers(), eager_inputs=twin.buffers(), modules=modules,
                      mode=mode, **details)


def _assert_refused_where_it_happened(error: BaseException) -> None:
    # The emulated backend notices a replaced (hence released) captured buffer one step later as a
    # hazard; CUDA would silently read the stale memory. The change must be refused at the break.
    assert not isinstance(error, GraphHazardError), (
        f"the break's changed output was accepted and a later segment read a released captured buffer: {error}"
    )


def _program(steps, output: str, *, rows: int = 4, width: int = 3, input_count: int = 2) -> Program:
    return Program(tuple(steps), output, rows, width, input_count)


# The clause a case checks: a plain tensor result, or none (the break writes a buffer in place), exercises how
# the break is called (live-breaks); any other result structure, how it is written back.
@pytest.mark.parametrize("returns", [pytest.param(returns, marks=pytest.mark.clause(
    "live-breaks" if returns in ("tensor", "none") else "write-back")) for returns in RETURNS])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_every_calling_convention_and_return_structure(graph_oracle, device, convention, returns):
    """The whole cross product, once each: a break between segments, its output the function's output
    (a tensorless output is read by a later break instead; ``python_growing`` is empty at this capture).
    The caller's mode rotates so that each convention and each return structure meets every mode."""
    output = "with_buffers" if returns == "none" else "hidden" if returns in TENSORLESS_RETURNS else "break_output"
    later = {"none": [("op", "matmul"), ("break", "positional", "none")],
             **{kind: [("op", "matmul"), ("break", "positional", "tensor")] for kind in TENSORLESS_RETURNS}}
    program = _program([("op", "add_input"), ("op", "tanh"), ("break", convention, returns)] + later.get(returns, []),
                       output)
    mode = CALLING_MODES[(CONVENTIONS.index(convention) + RETURNS.index(returns)) % len(CALLING_MODES)]
    check_program(graph_oracle, program, seed=7, device=device, mode=mode)


# Two programs: breaks of mixed structures (metadata objects, dicts), and breaks that hand over tensors only,
# so that an implementation failing the write-back of Python values at the first replay is still checked
# for recovery from a fault (the mixed program fails before its fault there, and proves nothing of it).
FAULT_PROGRAMS = {
    "mixed-structures": [("op", "add_input"), ("break", "metadata_object", "none"), ("op", "matmul"),
                         ("break", "dict", "dict"), ("op", "scale_by_metadata"), ("break", "keyword", "tensor"),
                         ("op", "tanh")],
    "tensors-only": [("op", "add_input"), ("break", "positional", "none"), ("op", "matmul"),
                     ("break", "positional", "tensor"), ("op", "tanh"), ("break", "keyword", "tensor"),
                     ("op", "tanh")],
}


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.clause(
    "changes-raise" if kind == "wrong_shape" else "fault-recovery")) for kind in FAULTS])
@pytest.mark.parametrize("faulty_break", [0, 1, 2])
@pytest.mark.parametrize("breaks", list(FAULT_PROGRAMS))
def test_break_fault_at_replay_then_recovery(graph_oracle, device, breaks, kind, faulty_break):
    """A break (or the write-back into the next segment's inputs) fails at one replay; the next replay
    equals eager again and leaves nothing behind."""
    program = _program(FAULT_PROGRAMS[breaks], "hidden")
    check_program(graph_oracle, program, seed=11, device=device, mode=CALLING_MODES[faulty_break],
                  fault=(1, faulty_break, kind))


_steps = st.one_of(
    st.tuples(st.just("op"), st.sampled_from(SEGMENT_OPS)),
    st.tuples(st.just("break"), st.sampled_from(CONVENTIONS), st.sampled_from(RETURNS)),
)


@st.composite
def programs(draw) -> tuple[Program, tuple[int, int, str] | None]:
    steps = draw(st.lists(_steps, min_size=1, max_size=8))
    output = draw(st.sampled_from(OUTPUTS))
    if output == "break_output":
        steps.append(("break", draw(st.sampled_from(CONVENTIONS)),
                      draw(st.sampled_from([r for r in RETURNS if r != "none"]))))
    program = Program(tuple(steps), output, draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 3)))
    fault = None
    if program.breaks and draw(st.booleans()):
        fault = (draw(st.integers(0, REPLAYS - 2)), draw(st.integers(0, len(program.breaks) - 1)),
                 draw(st.sampled_from(FAULTS)))
    return program, fault


@given(case=programs(), seed=st.integers(0, 2**20), mode=st.sampled_from(CALLING_MODES))
def test_generated_programs_equal_their_eager_twin(graph_oracle, device, case, seed, mode):
    program, fault = case
    check_program(graph_oracle.fresh(), program, seed=seed, device=device, mode=mode, fault=fault)


# How a break's result differs at one replay from the structure it had at capture. The first two are
# shapes Tensor.copy_ would silently broadcast over the captured buffer; the others it would refuse,
# cast, or (for containers) never see, leaving later segments to read stale tensors.
OUTPUT_CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "rows_to_one": lambda r: r.update(out=r["out"][:1]),
    "leading_dim_dropped": lambda r: r.update(out=r["out"][0]),
    "more_rows": lambda r: r.update(out=torch.cat([r["out"], r["out"]])),
    "other_dtype": lambda r: r.update(out=r["out"].double()),
    "nested_broadcast": lambda r: r["pair"].__setitem__(1, r["pair"][1][:1]),
    "list_shorter": lambda r: r["pair"].pop(),
    "tuple_longer": lambda r: r.update(kv=r["kv"] + (r["out"],)),
    "list_became_tuple": lambda r: r.update(pair=tuple(r["pair"])),
    "dict_key_gone": lambda r: r.pop("pair"),
    "object_type_changed": lambda r: r.update(obj=SlottedBreakResult(r["obj"].out, r["obj"].extra, r["obj"].step)),
    "tensor_became_none": lambda r: r.update(out=None),
    "dict_became_list": lambda r: r.update(meta=[r["meta"]["scale"]]),
    "frozen_became_plain": lambda r: r.update(frozen=BreakResult(r["frozen"].out, r["frozen"].extra, 1)),
    "object_lost_a_tensor": lambda r: delattr(r["obj"], "extra"),
    "object_holding_tensors_gone": lambda r: r.pop("obj"),
}


@pytest.mark.clause("changes-raise")
@pytest.mark.parametrize("change", sorted(OUTPUT_CHANGES))
def test_break_output_change_at_replay_raises_then_recovers(graph_oracle, make_tensor, change):
    x = make_tensor(4, 3, seed=21)
    armed: list[str] = []

    @eager_on_graph
    def attention_like(h):
        result = {"out": h * 2, "pair": [h + 1, h - 1], "kv": (h * 3, h * 4), "obj": BreakResult(h * 5, h * 6, 1),
                  "meta": {"scale": h * 7}, "frozen": FrozenBreakResult(h * 8, h * 9, [1])}
        if armed:
            OUTPUT_CHANGES[armed.pop()](result)
        return result

    def fn():
        r = attention_like(x + 1)
        return (r["out"] + r["pair"][0] * r["pair"][1] - r["kv"][0] + r["kv"][1] * r["obj"].out - r["obj"].extra
                + r["meta"]["scale"] - r["frozen"].out * r["frozen"].extra)

    graph = graph_oracle.capture(fn)
    x.copy_(make_tensor(4, 3, seed=22))
    armed.append(change)
    _assert_refused_where_it_happened(graph_oracle.replay_fails(graph, ReplayError, change=change))
    assert not is_capturing()
    x.copy_(make_tensor(4, 3, seed=23))
    graph_oracle.replay(graph, fn, inputs=[x], change=change, recovered=True)
