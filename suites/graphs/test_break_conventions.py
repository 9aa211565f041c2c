"""Generated breakable programs over every way a break is called and every structure it returns.

A program is a list of steps: captured ops and eager breaks. Each break is drawn from the calling
conventions engines use (positional and keyword tensors; tensors in lists, tuples and dicts; a
metadata dataclass and a metadata dict whose tensors *and* Python values the caller refills in place
between replays) and from the return structures they use (a tensor; ``(out, (k, v))``; a dict with a
list and a Python value; dataclasses with and without ``__slots__``; ``None`` after writing a
KV-cache-like buffer that the next segment reads; the argument itself, updated in place). The
function returns its hidden state, a dict holding it and the buffers, or a break's output object.

The oracle is the same program run eagerly on a *twin world*: its own inputs, metadata and buffers,
built from the same seed and refilled identically. After every replay the suite compares the value
``replay()`` returned, ``graph.output`` read again, the handle to ``graph.output`` taken right after
capture, and every buffer of the world (the KV buffer the breaks wrote, the static inputs, the
metadata tensors). Faults are injected at replay in the captured world only: the replay must raise,
and the next one must equal the twin again, with no state left over.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.errors import GraphHazardError, ReplayError
from harness.graphs import eager_on_graph, is_capturing

SEGMENT_OPS = ("add_input", "scale_by_metadata", "add_metadata_dict_bias", "tanh", "matmul", "inplace_mul",
               "gather_rows_by_slots")
CONVENTIONS = ("positional", "keyword", "list", "tuple", "dict", "metadata_object", "metadata_dict")
RETURNS = ("tensor", "nested", "dict", "object", "slotted", "none", "inplace")
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


@dataclasses.dataclass
class World:
    """Everything a program reads or writes; the captured program and its eager twin each have one."""

    inputs: list[torch.Tensor]
    weight: torch.Tensor
    metadata: BatchMetadata
    metadata_dict: dict[str, Any]  # {"bias": (width,) tensor, "gain": float}
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
        weight=_seeded((width, width), seed + 500, device) / width**0.5,
        metadata=BatchMetadata(torch.empty(width, device=device), torch.empty(rows, dtype=torch.int64, device=device),
                               0.0, 0),
        metadata_dict={"bias": torch.empty(width, device=device), "gain": 0.0},
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
    world.metadata.shift = (seed % 7) / 4 - 0.75  # Python values: live for breaks, frozen in segments
    world.metadata.step = seed % 1000
    world.metadata_dict["bias"].copy_(_seeded((width,), seed + 12, device))
    world.metadata_dict["gain"] = (seed % 5) / 2 - 1.0


def _make_break(index: int, convention: str, returns: str, world: World) -> Callable[..., Any]:
    """The eager break ``index`` of a program: its signature is ``convention``, its result ``returns``."""

    def finish(h: torch.Tensor, value: torch.Tensor) -> Any:
        fault = world.armed_fault.pop(index, None)
        if fault is not None and (fault == "raise" or (fault == "raise_mid_refill") != (returns == "none")):
            # a break without a buffer to refill fails plainly; a refilling break has no result to misshape
            raise InjectedFault(f"break {index} fails at this replay")
        if fault == "wrong_shape":  # (width,) where (rows, width) was captured: copy_ would broadcast it
            value, h = value[0], h[0]
        if returns == "tensor":
            return value
        if returns == "nested":
            return value, (value * 2, value - 1)
        if returns == "dict":
            return {"out": value, "aux": [torch.tanh(value), value * 3], "step": world.metadata.step}
        if returns in ("object", "slotted"):
            kind = BreakResult if returns == "object" else SlottedBreakResult
            return kind(value, value * 3, world.metadata.step)
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
    else:  # metadata_dict
        def body(h, metadata):
            return finish(h, h * 0.5 + metadata["bias"] * metadata["gain"])

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
    return brk(h, world.metadata_dict)


def _consume(returns: str, result: Any, h: torch.Tensor, world: World) -> torch.Tensor:
    """Captured ops after a break, reading every tensor it returned (or the buffer it wrote)."""
    if returns in ("tensor", "inplace"):
        return result
    if returns == "nested":
        out, (k, v) = result
        return out + k * 0.5 - v
    if returns == "dict":
        return result["out"] + result["aux"][0] - result["aux"][1] * 0.5
    if returns in ("object", "slotted"):
        return result.out - result.extra * 0.25
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
        return h @ world.weight
    if op == "inplace_mul":
        return h.mul_(0.5)
    return h[world.metadata.slots]  # gather_rows_by_slots


def build(program: Program, world: World) -> Callable[[], Any]:
    """The program as a zero-argument function over ``world`` (its breaks made once, for this world)."""
    breaks = [_make_break(i, step[1], step[2], world) for i, step in enumerate(program.breaks)]

    def fn() -> Any:
        h = world.inputs[0] * 1.0  # a fresh intermediate: in-place steps never touch a static input
        result: Any = None
        next_break = iter(breaks)
        for position, step in enumerate(program.steps):
            x = world.inputs[position % len(world.inputs)]
            if step[0] == "op":
                h = _apply_op(step[1], h, x, world)
            else:
                result = _call_break(next(next_break), step[1], h, x, world)
                h = _consume(step[2], result, h, world)
        if program.output == "hidden":
            return h
        if program.output == "with_buffers":
            return {"hidden": h, "cache": world.cache, "inputs": list(world.inputs)}
        return result  # "break_output": the last step is a break whose output is the function's output

    return fn


def snapshot(value: Any) -> Any:
    """A deep copy of a result's tensors and structure, taken before the next replay overwrites it."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(item) for item in value)
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(**{f.name: snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value


def check_program(capturer, program: Program, *, seed: int, device: torch.device, exact: bool, context,
                  fault: tuple[int, int, str] | None = None) -> None:
    """Capture ``program``, replay it :data:`REPLAYS` times with refills, and compare with the eager twin.

    ``fault = (replay, break index, kind)`` makes that break fail at that replay of the captured world.
    """
    captured_world, twin = make_world(program, seed, device), make_world(program, seed, device)
    graph = capturer.capture(build(program, captured_world))
    eager = build(program, twin)
    assert graph.break_count == len(program.breaks), context(program=program, seed=seed)
    handle = graph.output
    for replay in range(REPLAYS):
        details = context(program=program, seed=seed, replay=replay, fault=fault)
        refill(captured_world, seed + 1000 * (replay + 1))
        refill(twin, seed + 1000 * (replay + 1))
        if fault is not None and fault[0] == replay:
            _, index, kind = fault
            captured_world.armed_fault[index] = kind
            expected_error = ReplayError if kind == "wrong_shape" and program.breaks[index][2] != "none" else \
                InjectedFault
            with pytest.raises(expected_error) as raised:
                graph.replay()
            _assert_refused_where_it_happened(raised.value)
            assert not captured_world.armed_fault, f"break {index} never ran at the faulty replay: {details}"
            assert not is_capturing(), "a failed replay left a capture active"
            continue  # the twin skips this step too; the next replay must need nothing from it
        returned = snapshot(graph.replay())
        expected = eager()
        assert_equivalent(returned, expected, exact=exact, context={**details, "checking": "replay() result"})
        assert_equivalent(graph.output, expected, exact=exact, context={**details, "checking": "graph.output"})
        assert_equivalent(handle, expected, exact=exact,
                          context={**details, "checking": "the graph.output handle taken after capture"})
        assert_equivalent(captured_world.buffers(), twin.buffers(), exact=exact,
                          context={**details, "checking": "buffers written by breaks, static inputs, metadata"})


def _assert_refused_where_it_happened(error: BaseException) -> None:
    # The emulated backend notices a replaced (hence released) captured buffer one step later as a
    # hazard; CUDA would silently read the stale memory. The change must be refused at the break.
    assert not isinstance(error, GraphHazardError), (
        f"the break's changed output was accepted and a later segment read a released captured buffer: {error}"
    )


def _program(steps, output: str, *, rows: int = 4, width: int = 3, input_count: int = 2) -> Program:
    return Program(tuple(steps), output, rows, width, input_count)


@pytest.mark.parametrize("returns", RETURNS)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_every_calling_convention_and_return_structure(graph_capturer, device, exact, failure_context,
                                                       convention, returns):
    """The whole cross product, once each: a break between segments, its output the function's output."""
    output = "with_buffers" if returns == "none" else "break_output"
    program = _program([("op", "add_input"), ("op", "tanh"), ("break", convention, returns)]
                       + ([("op", "matmul"), ("break", "positional", "none")] if returns == "none" else []),
                       output)
    check_program(graph_capturer, program, seed=7, device=device, exact=exact, context=failure_context)


@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("faulty_break", [0, 1, 2])
def test_break_fault_at_replay_then_recovery(graph_capturer, device, exact, failure_context, kind, faulty_break):
    """A break (or the write-back into the next segment's inputs) fails at one replay; the next replay
    equals eager again and leaves nothing behind."""
    program = _program([("op", "add_input"), ("break", "metadata_object", "none"), ("op", "matmul"),
                        ("break", "dict", "dict"), ("op", "scale_by_metadata"), ("break", "keyword", "tensor"),
                        ("op", "tanh")], "hidden")
    check_program(graph_capturer, program, seed=11, device=device, exact=exact, context=failure_context,
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


@given(case=programs(), seed=st.integers(0, 2**20))
def test_generated_programs_equal_their_eager_twin(graph_capturer, device, exact, failure_context, case, seed):
    program, fault = case
    check_program(graph_capturer, program, seed=seed, device=device, exact=exact, context=failure_context,
                  fault=fault)


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
}


@pytest.mark.parametrize("change", sorted(OUTPUT_CHANGES))
def test_break_output_change_at_replay_raises_then_recovers(graph_capturer, make_tensor, exact, failure_context,
                                                            change):
    x = make_tensor(4, 3, seed=21)
    armed: list[str] = []

    @eager_on_graph
    def attention_like(h):
        result = {"out": h * 2, "pair": [h + 1, h - 1], "kv": (h * 3, h * 4), "obj": BreakResult(h * 5, h * 6, 1)}
        if armed:
            OUTPUT_CHANGES[armed.pop()](result)
        return result

    def fn():
        r = attention_like(x + 1)
        return r["out"] + r["pair"][0] * r["pair"][1] - r["kv"][0] + r["kv"][1] * r["obj"].out - r["obj"].extra

    graph = graph_capturer.capture(fn)
    x.copy_(make_tensor(4, 3, seed=22))
    armed.append(change)
    with pytest.raises(ReplayError) as raised:
        graph.replay()
    _assert_refused_where_it_happened(raised.value)
    assert not is_capturing()
    x.copy_(make_tensor(4, 3, seed=23))
    assert_equivalent(graph.replay(), fn(), exact=exact, context=failure_context(change=change, recovered=True))
