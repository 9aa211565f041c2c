"""Pool lifetime: what a capturer keeps alive in a shared pool, under allocator churn and later captures.

An engine captures one graph per bucket, largest first, into one pool. When a capture ends, every block of the
pool that nothing holds any more is free, and the next bucket's capture re-carves it. A graph's replay writes all
of its blocks, so graphs sharing a pool may overwrite whatever a *later* capture put in their freed blocks: a later
graph's outputs are valid only until an earlier graph replays (PyTorch's pool contract; these tests never read
them then, which would fail under any capturer). What a capturer must keep alive is what a graph still reads or
hands out after a capture: the arguments a break reads and what it returned, and the graph's output. A block
under one of those must never be re-carved, whatever the program still holds.

The graph's own replay writes a break's arguments before the break reads them, so a block re-carved under them
shows only when another graph of the pool replays in between: from the eager region itself (a break that runs a
draft model's or a sub-module's graph). The programs below do that, so that a capturer holding break arguments
weakly (SGLang #37606) reads the other graph's data there, on the emulated backend as on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.graphs import eager_on_graph
from harness.oracle import footprint
from harness.plugin.profiles import capped_examples

pytestmark = pytest.mark.clause("pools")

WIDTH = 16
BUCKETS = (12, 8, 5)  # rows, captured largest first as engines capture their buckets
HEADS = 4


def _attend(h: torch.Tensor, r: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(torch.tanh(h) * r + h)


@eager_on_graph
def attend(h: torch.Tensor, r: torch.Tensor, out: torch.Tensor, run_other_graphs: Callable[[], None]) -> None:
    """The eager region between the segments (attention's place, with its conventions: it writes a buffer the
    segment before it allocated, and returns nothing). Other graphs of the pool run first, then it reads the
    arguments that segment computed."""
    run_other_graphs()
    _attend(h, r, out)


def _layer(x: torch.Tensor, weights: tuple[torch.Tensor, ...],
           attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> torch.Tensor:
    w_in, *heads = weights
    h = torch.relu(x @ w_in)
    r = h * 0.5 - x  # h and r: segment intermediates the program drops after the capture, read by the break
    y = torch.empty_like(h)
    attention(h, r, y)
    # Several blocks alive at once: a later bucket's capture takes every block an earlier one left free.
    partial = [torch.tanh(y @ w) for w in heads]
    out = partial[0]
    for p in partial[1:]:
        out = out + p
    return out


class Bucket:
    """One bucket of the engine: its static input ``x`` (rows x WIDTH), shared weights, and the graphs of the pool
    its eager region replays (``others``, set after every bucket is captured)."""

    def __init__(self, x: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> None:
        self.x, self.weights = x, weights
        self.others: list = []

    def run_others(self) -> None:
        for graph in self.others:
            graph.replay()

    def forward(self) -> torch.Tensor:
        return _layer(self.x, self.weights, lambda h, r, y: attend(h, r, y, self.run_others))

    def eager(self) -> torch.Tensor:
        """The program as the graph must see it: the other graphs' replays change none of its values."""
        return _layer(self.x, self.weights, _attend)


def _churn(device: torch.device, sizes: list[tuple[int, bool]], kept: list[torch.Tensor]) -> None:
    """Allocations between captures and replays, some kept, some released (on CUDA they move the caching
    allocator's free lists; the graphs' pool is not theirs to take)."""
    for size, keep in sizes:
        scratch = torch.full((size,), float("nan"), device=device)
        if keep:
            kept.append(scratch)
        elif kept:
            kept.pop(0)


churns = st.lists(st.tuples(st.integers(1, 4096), st.booleans()), max_size=4)


@st.composite
def schedules(draw):
    """Which later graphs each bucket's eager region replays, in which order; the top-level replays (every
    bucket once, in any order, and up to two more); the churn before each capture and each replay."""
    count = len(BUCKETS)
    inside = [draw(st.permutations(range(index + 1, count))) for index in range(count)]
    replays = draw(st.permutations(range(count))) + draw(st.lists(st.integers(0, count - 1), max_size=2))
    return {"inside": inside, "replays": replays,
            "capture_churn": [draw(churns) for _ in range(count)],
            "replay_churn": [draw(churns) for _ in replays]}


# Each example is three captures (on CUDA each collects garbage first) and about five checked replays.
@capped_examples(10)
@given(schedule=schedules(), seed=st.integers(0, 2**16))
def test_break_arguments_outlive_later_captures_into_the_pool(graph_oracle, make_tensor, device, exact, schedule,
                                                               seed):
    """Buckets captured largest first into one pool, with churn between captures; each bucket's eager region
    replays the graphs captured after it (which re-carved whatever it left free), then reads its arguments.
    Every replay equals eager, and every graph captured before the one just replayed still holds its output."""
    oracle = graph_oracle.fresh()
    weights = tuple(make_tensor(WIDTH, WIDTH, seed=seed + k) * 0.25 for k in range(HEADS + 1))
    buckets = [Bucket(make_tensor(rows, WIDTH, seed=seed + 10 + index), weights) for index, rows in enumerate(BUCKETS)]
    pool = oracle.new_pool()
    kept: list[torch.Tensor] = []
    graphs = []
    for index, bucket in enumerate(buckets):
        _churn(device, schedule["capture_churn"][index], kept)
        graphs.append(oracle.capture(bucket.forward, pool=pool, bucket=BUCKETS[index]))
    for index, bucket in enumerate(buckets):
        bucket.others = [graphs[later] for later in schedule["inside"][index]]
    # Whether a graph's output is its last replay's: not before its first replay (a CUDA capture runs nothing),
    # and not after a graph captured before it replays (that one's freed blocks may hold it: the pool contract).
    current = [False] * len(buckets)
    for step, index in enumerate(schedule["replays"]):
        _churn(device, schedule["replay_churn"][step], kept)
        bucket = buckets[index]
        bucket.x.copy_(make_tensor(*bucket.x.shape, seed=seed + 100 + step))
        where = {"bucket": BUCKETS[index], "replay": step, "order": schedule["replays"],
                 "replayed inside its eager region": [BUCKETS[later] for later in schedule["inside"][index]]}
        oracle.replay(graphs[index], bucket.eager, inputs=[bucket.x, *weights], exact=exact, **where)
        current = [ok and earlier < index for earlier, ok in enumerate(current)]
        current[index] = True
        for earlier in range(index):
            if current[earlier]:
                assert_equivalent(graphs[earlier].output, buckets[earlier].eager(), exact=exact, context={
                    "checking": f"the output of bucket {BUCKETS[earlier]} (captured earlier, in the same pool) after "
                                f"bucket {BUCKETS[index]} replayed", **where})


@capped_examples(10)
@given(churn=st.lists(churns, min_size=2, max_size=2), seed=st.integers(0, 2**16))
def test_graphs_captured_without_a_pool_keep_their_outputs(graph_oracle, make_tensor, device, exact, churn, seed):
    """Two buckets captured with no pool, churn around the captures: each has a pool of its own, so replaying the
    first (captured first, whose freed blocks a shared pool would hand to the second's output) leaves the second's
    output as its last replay left it."""
    oracle = graph_oracle.fresh()
    weights = tuple(make_tensor(WIDTH, WIDTH, seed=seed + k) * 0.25 for k in range(HEADS + 1))
    first, second = (Bucket(make_tensor(rows, WIDTH, seed=seed + 10 + i), weights)
                     for i, rows in enumerate(BUCKETS[:2]))
    kept: list[torch.Tensor] = []
    _churn(device, churn[0], kept)
    first_graph = oracle.capture(first.forward, bucket=BUCKETS[0])
    _churn(device, churn[1], kept)
    second_graph = oracle.capture(second.forward, bucket=BUCKETS[1])
    oracle.replay(second_graph, second.eager, inputs=[second.x, *weights], exact=exact, bucket=BUCKETS[1])
    first.x.copy_(make_tensor(*first.x.shape, seed=seed + 99))
    oracle.replay(first_graph, first.eager, inputs=[first.x, *weights], exact=exact, bucket=BUCKETS[0])
    assert_equivalent(second_graph.output, second.eager(), exact=exact, context={
        "checking": f"the output of bucket {BUCKETS[1]} after bucket {BUCKETS[0]}, captured without a pool, replayed"})


@pytest.mark.parametrize("program", ["matmul-then-add", "through-a-break"])
def test_a_graphs_output_outlives_later_captures_into_the_pool(graph_oracle, make_tensor, exact, program):
    """TensorRT-LLM #17010: a graph's output is what it hands out, so its block must stay the graph's whether or not
    the program keeps a reference to it; a capturer that holds it weakly lets the next capture into the pool carve
    it. Two graphs of one shape captured into one pool, then replayed in capture order: the first one's output must
    still be its own after the second replayed."""
    oracle = graph_oracle.fresh()
    weight = make_tensor(WIDTH, WIDTH, seed=41) * 0.25
    inputs = [make_tensor(BUCKETS[0], WIDTH, seed=42 + index) for index in range(2)]

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x @ weight  # freed inside the capture: the first free block a later capture takes
        if program == "through-a-break":
            h = mix(h)
        return h + 1  # nothing but the graph holds this once the capture returns

    pool = oracle.new_pool()
    graphs = [oracle.capture(lambda x=x: forward(x), pool=pool, graph=index) for index, x in enumerate(inputs)]
    for index, (graph, x) in enumerate(zip(graphs, inputs)):
        oracle.replay(graph, lambda x=x: forward(x), inputs=[x, weight], exact=exact, graph=index)
    assert_equivalent(graphs[0].output, forward(inputs[0]), exact=exact, context={
        "checking": "the first graph's output after the second graph, captured later into the same pool, replayed",
        "program": program})


@eager_on_graph
def mix(h: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h)


def test_a_dropped_graph_keeps_no_memory(graph_oracle, make_tensor):
    """Engines drop graphs: a bucket captured again, a runner reset, a model unloaded. Once the program drops a graph
    and its output and collects, the process holds what it held before the capture (its tensors, their bytes, the
    device allocator's bytes): the graph's pool, its segments' tensors and its breaks' records go with it. The first
    capture may create what any capture creates once (a lazily made handle); the later ones are measured."""
    x = make_tensor(1 << 12, seed=43)
    program = lambda: mix(x * 2) + 1  # noqa: E731

    def capture_replay_and_drop(attempt: int) -> None:
        oracle = graph_oracle.fresh()  # holds the graph and its output for its checks: dropped with it
        graph = oracle.capture(program, attempt=attempt)
        oracle.replay(graph, lambda: torch.tanh(x * 2) + 1, inputs=[x], attempt=attempt)

    capture_replay_and_drop(0)
    before = footprint()
    for attempt in (1, 2):
        capture_replay_and_drop(attempt)
    kept = footprint() - before
    assert (kept.tensors, kept.tensor_bytes, kept.device_bytes) == (0, 0, 0), (
        f"two graphs captured, replayed and dropped left the process holding {kept.tensors} more tensors, "
        f"{kept.tensor_bytes} more bytes of tensor storage and {kept.device_bytes} more device bytes: the capturer "
        "keeps what a dropped graph allocated")


@pytest.mark.parametrize("pools", ["own pools", "one pool"])
def test_a_breaks_output_stays_the_graphs_when_the_program_drops_it(graph_oracle, make_tensor, exact, pools):
    """SGLang #30584: a break's output is allocated in the eager region, outside the graph's pool, and the segment
    after the break reads it at its address; once the program drops it only the graph holds it. A capturer that holds
    it weakly lets the allocator hand its block to a later allocation, on CUDA the next capture's (the same stream),
    and every replay copies the break's result over that. The first graph drops its break's output; the second
    returns its break's output, of the same size. Replaying the first must leave the second's output as it was."""
    oracle = graph_oracle.fresh()
    weight = make_tensor(WIDTH, WIDTH, seed=51) * 0.25
    first_x, second_x = (make_tensor(BUCKETS[0], WIDTH, seed=52 + index) for index in range(2))
    first = lambda: mix(first_x @ weight) + 1  # noqa: E731 - the break's output is dropped after the next segment
    second = lambda: mix(second_x @ weight)  # noqa: E731 - the break's output is what the graph hands out
    pool = oracle.new_pool() if pools == "one pool" else None
    first_graph = oracle.capture(first, pool=pool, graph="first")
    second_graph = oracle.capture(second, pool=pool, graph="second")
    oracle.replay(second_graph, second, inputs=[second_x, weight], exact=exact, graph="second")
    first_x.copy_(make_tensor(BUCKETS[0], WIDTH, seed=54))
    oracle.replay(first_graph, first, inputs=[first_x, weight], exact=exact, graph="first")
    assert_equivalent(second_graph.output, second(), exact=exact, context={
        "checking": "the second graph's output (its break's output) after the first graph, whose break's output the "
                    "program dropped, replayed", "pools": pools})
