"""A stateful model of graph use: captures of several sizes under the caller's modes, in any order, refills,
weight updates, replays (repeated, interleaved between graphs), faults at capture and at replay, allocator churn."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, rule

from harness.errors import CaptureError
from harness.graphs import eager_on_graph
from harness.oracle import CALLING_MODES

pytestmark = pytest.mark.clause("replay-equals-eager")


class InjectedFault(RuntimeError):
    """Raised by the gate break on purpose, once."""


@eager_on_graph
def _gate(h: torch.Tensor, faults: list[str]) -> torch.Tensor:
    if faults:
        raise InjectedFault(faults.pop())
    return torch.sigmoid(h)


class Layer(torch.nn.Module):
    """The captured program as an engine's layer: a weight parameter, an eager break, static input ``x``."""

    def __init__(self, x: torch.Tensor, weight: torch.Tensor) -> None:
        super().__init__()
        self.x = x
        self.weight = torch.nn.Parameter(weight)
        self.faults: list[str] = []  # armed by a rule: the next run of the gate raises

    def forward(self) -> torch.Tensor:
        return _gate(torch.relu(self.x @ self.weight), self.faults) * self.x.sum(dim=-1, keepdim=True)


def _eager_twin(layer: Layer):
    """The layer run eagerly with no fault armed (a fault is the graph's alone)."""
    return lambda: _gate(torch.relu(layer.x @ layer.weight), []) * layer.x.sum(dim=-1, keepdim=True)


class GraphLifecycle(RuleBasedStateMachine):
    """Invariant: every replay looks like eager on the graph's current static inputs and weights, under the mode the
    graph was captured in, on everything the checker compares; every capture and every failed call leaves the
    process and the layer as they were."""

    graphs = Bundle("graphs")
    oracle = None
    device = None

    @initialize()
    def start(self) -> None:
        self.oracle = self.oracle.fresh()
        self.pool = self.oracle.new_pool()
        self.keep_alive: list[torch.Tensor] = []

    def _tensor(self, *shape: int, seed: int) -> torch.Tensor:
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(self.device)

    @rule(target=graphs, rows=st.integers(1, 12), seed=st.integers(0, 2**16), shared_pool=st.booleans(),
          mode=st.sampled_from(CALLING_MODES))
    def capture(self, rows: int, seed: int, shared_pool: bool, mode: str):
        layer = Layer(self._tensor(rows, 8, seed=seed), self._tensor(8, 8, seed=seed + 1))
        graph = self.oracle.capture(layer, modules=[layer], mode=mode, pool=self.pool if shared_pool else None,
                                    capture_seed=seed)
        return {"graph": graph, "layer": layer, "mode": mode, "seed": seed}

    @rule(rows=st.integers(1, 12), seed=st.integers(0, 2**16), mode=st.sampled_from(CALLING_MODES),
          fault=st.sampled_from(["break raises", "host sync"]))
    def failed_capture(self, rows: int, seed: int, mode: str, fault: str) -> None:
        layer = Layer(self._tensor(rows, 8, seed=seed), self._tensor(8, 8, seed=seed + 1))
        if fault == "break raises":
            layer.faults.append("the gate fails during capture")
            self.oracle.capture_fails(layer, InjectedFault, modules=[layer], mode=mode, fault=fault)
        else:
            self.oracle.capture_fails(lambda: layer() * layer.x.sum().item(), CaptureError, modules=[layer],
                                      mode=mode, fault=fault)

    @rule(entry=graphs, seed=st.integers(0, 2**16))
    def refill(self, entry, seed: int) -> None:
        entry["layer"].x.copy_(self._tensor(*entry["layer"].x.shape, seed=seed))

    @rule(entry=graphs, seed=st.integers(0, 2**16))
    def update_weights(self, entry, seed: int) -> None:
        with torch.no_grad():
            entry["layer"].weight.copy_(self._tensor(8, 8, seed=seed))

    @rule(entry=graphs, times=st.integers(1, 2))
    def replay(self, entry, times: int) -> None:
        layer = entry["layer"]
        for again in range(times):
            self.oracle.replay(entry["graph"], _eager_twin(layer), inputs=[layer.x], modules=[layer],
                               mode=entry["mode"], capture_seed=entry["seed"], again=again)

    @rule(entry=graphs, seed=st.integers(0, 2**16))
    def faulty_replay_then_replay(self, entry, seed: int) -> None:
        """A break fails at one replay; after a refill the next replay looks like eager again."""
        layer = entry["layer"]
        layer.faults.append("the gate fails at this replay")
        self.oracle.replay_fails(entry["graph"], InjectedFault, modules=[layer], mode=entry["mode"],
                                 capture_seed=entry["seed"])
        assert not layer.faults, "the faulty replay never ran the break"
        layer.x.copy_(self._tensor(*layer.x.shape, seed=seed))
        self.oracle.replay(entry["graph"], _eager_twin(layer), inputs=[layer.x], modules=[layer], mode=entry["mode"],
                           capture_seed=entry["seed"], after="a faulty replay")

    @rule(size=st.integers(1, 4096), keep=st.booleans())
    def churn_allocator(self, size: int, keep: bool) -> None:
        scratch = torch.full((size,), float("nan"), device=self.device)
        if keep:
            self.keep_alive.append(scratch)
        elif self.keep_alive:
            self.keep_alive.pop(0)


@pytest.mark.long_running
def test_graph_lifecycle(graph_oracle, device):
    GraphLifecycle.oracle = graph_oracle
    GraphLifecycle.device = device
    from hypothesis import settings

    run = GraphLifecycle.TestCase()
    run.settings = settings(settings(), stateful_step_count=20)
    run.runTest()
