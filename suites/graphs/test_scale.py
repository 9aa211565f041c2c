"""Scale and form (issue 45): a long run of replays, the inputs written between them in every way a caller can.

One graph is replayed a drawn number of times (up to hundreds), each replay checked against its eager twin by the
graph oracle. Between replays the static inputs get new values, in place or through an alias that bypasses their
version counter (:data:`harness.writes.BYPASSING_WRITES`): a replay reads the memory as it is, as eager does, so a
graph that keys anything on the version counter (a skipped write-back, a cached break argument) goes stale."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.graphs import eager_on_graph
from harness.plugin.profiles import capped_examples
from harness.writes import bypassing_writes_for

pytestmark = pytest.mark.clause("replay-equals-eager")

_MAX_REPLAYS = 300
_IN_PLACE = "copy_"


def _program(x, meta):
    """Two segments around a break that reads the segment's output and a live input."""

    @eager_on_graph
    def mix(h, scale):
        return h.flip(0) * scale + 1

    def program():
        h = x * 2 + meta["bias"]
        return {"out": mix(h, meta["scale"]).tanh(), "h": h}

    return program


@capped_examples(1)
@example(replays=_MAX_REPLAYS, seed=45).via("the longest run drawn")
@given(replays=st.integers(1, _MAX_REPLAYS), seed=st.integers(0, 2**16))
def test_a_long_run_of_replays_sees_every_write(graph_oracle, make_tensor, device, replays, seed):
    oracle = graph_oracle.fresh()
    x = make_tensor(4, 3, seed=seed)
    meta = {"bias": make_tensor(4, 3, seed=seed + 1), "scale": make_tensor(1, seed=seed + 2)}
    program = _program(x, meta)
    graph = oracle.capture(program)
    routes = [_IN_PLACE, *sorted(bypassing_writes_for(device))]
    writes = bypassing_writes_for(device)
    for replay in range(replays):
        route = routes[replay % len(routes)]
        for offset, tensor in enumerate((x, meta["bias"], meta["scale"])):
            values = make_tensor(*tensor.shape, seed=seed + 3 * replay + offset + 10)
            if route == _IN_PLACE:
                tensor.copy_(values)
            else:
                writes[route](tensor, values)
        oracle.replay(graph, program, inputs=[x, meta["bias"], meta["scale"]], replay=replay, replays=replays,
                      written_through=route)
