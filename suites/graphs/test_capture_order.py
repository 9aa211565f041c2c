"""Capture order and teardown: a graph is the same whatever was captured before it and whatever was dropped since.

Engines capture one graph per bucket into one pool, in an order of their choosing, and drop or capture again single
buckets at serving time. A capturer that carries state from one capture into the next (SGLang #32288: B captured
after A differs from B captured alone), or whose graphs still use memory of a graph dropped since, gives graphs
that depend on that history. Each bucket here is captured alone into a pool of its own and replayed on fixed inputs:
its output is the reference of that bucket. Then the buckets are captured into one shared pool in a drawn order, one
is dropped (and perhaps captured again), and every graph left, replayed on the same inputs in capture order (the
pool's contract), must give that output bit for bit, besides equalling eager; and it must keep it while the other
graphs replay after it and the caller stages its next inputs (a later graph that replays an earlier one's steps
would rewrite it)."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent
from harness.graphs import eager_on_graph
from harness.plugin.profiles import capped_examples

pytestmark = pytest.mark.clause("pools")

WIDTH = 16
BUCKETS = (4, 8, 12)


@eager_on_graph
def mix(h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The eager region between the segments: a new tensor each call, outside the graphs' pool on CUDA."""
    return torch.tanh(h) * scale


class Bucket:
    def __init__(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
        self.x, self.weight, self.scale = x, weight, scale

    def forward(self, break_fn=mix) -> torch.Tensor:
        h = torch.relu(self.x @ self.weight)
        m = break_fn(h, self.scale)
        return (m @ self.weight).sum(dim=0) + h.mean()

    def eager(self) -> torch.Tensor:
        return self.forward(mix.__wrapped__)


@capped_examples(6)
@given(order=st.permutations(range(len(BUCKETS))), dropped=st.none() | st.integers(0, len(BUCKETS) - 1),
       captured_again=st.booleans(), seed=st.integers(0, 2**16))
def test_a_graph_is_the_same_whatever_was_captured_before_it_and_dropped_since(graph_oracle, make_tensor, exact, order,
                                                                                dropped, captured_again, seed):
    oracle = graph_oracle.fresh()
    weight, scale = make_tensor(WIDTH, WIDTH, seed=seed) * 0.25, make_tensor(WIDTH, seed=seed + 1)
    buckets = [Bucket(make_tensor(rows, WIDTH, seed=seed + 2 + index), weight, scale)
               for index, rows in enumerate(BUCKETS)]
    inputs = [bucket.x.clone() for bucket in buckets]
    alone = []
    for index, bucket in enumerate(buckets):
        graph = oracle.capture(bucket.forward, pool=oracle.new_pool(), bucket=BUCKETS[index], captured="alone")
        oracle.replay(graph, bucket.eager, inputs=[bucket.x, weight, scale], exact=exact, bucket=BUCKETS[index],
                      captured="alone")
        alone.append(graph.output.clone())
        del graph
    gc.collect()
    pool = oracle.new_pool()
    graphs: dict[int, object] = {}
    capture_order = list(order)
    for index in order:
        graphs[index] = oracle.capture(buckets[index].forward, pool=pool, bucket=BUCKETS[index])
    if dropped is not None:
        del graphs[dropped]
        capture_order.remove(dropped)
        gc.collect()
        if captured_again:
            graphs[dropped] = oracle.capture(buckets[dropped].forward, pool=pool, bucket=BUCKETS[dropped],
                                             captured="again, after it was dropped")
            capture_order.append(dropped)
    where = {"capture order": [BUCKETS[index] for index in order],
             "dropped": None if dropped is None else BUCKETS[dropped], "captured again": captured_again}
    for index in capture_order:
        buckets[index].x.copy_(inputs[index])
        oracle.replay(graphs[index], buckets[index].eager, inputs=[buckets[index].x, weight, scale], exact=exact,
                      bucket=BUCKETS[index], **where)
        assert_equivalent(graphs[index].output, alone[index], exact=True, context={
            "checking": f"bucket {BUCKETS[index]} captured into a shared pool against the same bucket captured alone, "
                        "on the same inputs", **where})
        # The caller stages this bucket's next batch: a replay of another graph must not compute from it.
        buckets[index].x.copy_(make_tensor(BUCKETS[index], WIDTH, seed=seed + 100 + index))
    for index in capture_order:
        assert_equivalent(graphs[index].output, alone[index], exact=True, context={
            "checking": f"bucket {BUCKETS[index]}'s output after every graph of the pool replayed once, in capture "
                        "order, and its own next inputs were staged", **where})
