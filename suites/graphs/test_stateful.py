"""A stateful model of graph use: captures of several sizes, refills, replays and allocator churn."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, rule

from harness.compare import assert_equivalent
from harness.graphs import eager_on_graph

pytestmark = pytest.mark.clause("replay-equals-eager")


@eager_on_graph
def _gate(h: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(h)


def _program(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return _gate(torch.relu(x @ weight)) * x.sum(dim=-1, keepdim=True)


class GraphLifecycle(RuleBasedStateMachine):
    """Invariant: every replay equals eager on the graph's current static inputs."""

    graphs = Bundle("graphs")
    capturer = None
    device = None
    exact = True
    context = None

    @initialize()
    def start(self) -> None:
        self.pool = self.capturer.new_pool()
        self.keep_alive: list[torch.Tensor] = []

    def _tensor(self, *shape: int, seed: int) -> torch.Tensor:
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(self.device)

    @rule(target=graphs, rows=st.integers(1, 12), seed=st.integers(0, 2**16), shared_pool=st.booleans())
    def capture(self, rows: int, seed: int, shared_pool: bool):
        x, weight = self._tensor(rows, 8, seed=seed), self._tensor(8, 8, seed=seed + 1)
        graph = self.capturer.capture(lambda: _program(x, weight), pool=self.pool if shared_pool else None)
        return {"graph": graph, "x": x, "weight": weight, "seed": seed}

    @rule(entry=graphs, seed=st.integers(0, 2**16))
    def refill(self, entry, seed: int) -> None:
        entry["x"].copy_(self._tensor(*entry["x"].shape, seed=seed))

    @rule(entry=graphs, seed=st.integers(0, 2**16))
    def update_weights(self, entry, seed: int) -> None:
        entry["weight"].copy_(self._tensor(8, 8, seed=seed))

    @rule(entry=graphs)
    def replay(self, entry) -> None:
        result = entry["graph"].replay().clone()
        expected = _program(entry["x"], entry["weight"])
        assert_equivalent(result, expected, exact=self.exact, context=self.context(capture_seed=entry["seed"]))

    @rule(size=st.integers(1, 4096), keep=st.booleans())
    def churn_allocator(self, size: int, keep: bool) -> None:
        scratch = torch.full((size,), float("nan"), device=self.device)
        if keep:
            self.keep_alive.append(scratch)
        elif self.keep_alive:
            self.keep_alive.pop(0)


@pytest.mark.long_running
def test_graph_lifecycle(graph_capturer, device, exact, failure_context):
    GraphLifecycle.capturer = graph_capturer
    GraphLifecycle.device = device
    GraphLifecycle.exact = exact
    GraphLifecycle.context = staticmethod(lambda **details: failure_context(**details))
    from hypothesis import settings

    run = GraphLifecycle.TestCase()
    run.settings = settings(settings(), stateful_step_count=20)
    run.runTest()
