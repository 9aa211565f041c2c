"""Bench-only regressions: correct implementations that are slower or launch more than they should.

Not mutants (the suites pass them); they show that ``--baseline`` catches what correctness suites
cannot, e.g. ``python -m harness bench runner --impl runner=harness.bench.variants:SlowedRunner
--baseline B.json``. The README's Benchmarks section lists them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from harness.gather.reference import GatherOutputs, compiled_gather
from harness.runner import ForwardBatch, LayerStackRunner

__all__ = ["SLOWDOWN_S", "HOST_SLOWDOWN", "SlowedRunner", "EagerFallbackRunner", "HostSlowedRunner",
           "gather_with_extra_kernel"]

SLOWDOWN_S = 0.002  # host time the slowed runner adds to every replay: more than a tiny model's replay on a GPU
# How much slower HostSlowedRunner's host path is: the smallest slowdown the runner baseline's gate must catch.
HOST_SLOWDOWN = 0.20


class SlowedRunner(LayerStackRunner):
    """The reference runner with :data:`SLOWDOWN_S` of host work added when it hands outputs out."""

    def hand_out(self, output: Any) -> Any:
        deadline = time.perf_counter() + SLOWDOWN_S
        while time.perf_counter() < deadline:  # busy, not sleep: a runner's overhead is CPU work
            pass
        return super().hand_out(output)


class EagerFallbackRunner(LayerStackRunner):
    """Captures like the reference, then runs every batch eagerly, without a warning or a counted
    fallback: correct, and as slow as eager (the bug class of a runner whose ``can_run`` is wrong)."""

    def run(self, batch: ForwardBatch) -> Any:
        with self.autograd_off():
            return self.model(batch.input_ids, batch.positions, batch)


class HostSlowedRunner(LayerStackRunner):
    """The reference runner with a host path :data:`HOST_SLOWDOWN` (20%) slower and nothing else: after each
    call it busy-waits that fraction of the host time the call spent outside its graphs' replays (the runner's
    own work and the model's eager glue), so the captured segments and the eager breaks are untouched and
    the host path takes 1.2 times as long on any host. Deterministic: the wait is that fraction of what the
    same call measured, not a fixed or random amount. ``clock`` is the host clock (a test's may be fake)."""

    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def capture(self) -> None:
        super().capture()
        self._in_graphs = 0.0
        for static in self._captured.values():
            graph = static.graph
            if graph is not None:
                graph.replay = self._timed(graph.replay)  # type: ignore[method-assign]  # this instance's only

    def _timed(self, replay: Callable[[], Any]) -> Callable[[], Any]:
        def timed() -> Any:
            started = self.clock()
            try:
                return replay()
            finally:
                self._in_graphs += self.clock() - started
        return timed

    def run(self, batch: ForwardBatch) -> Any:
        self._in_graphs = 0.0
        started = self.clock()
        output = super().run(batch)
        host = self.clock() - started - self._in_graphs
        deadline = self.clock() + HOST_SLOWDOWN * max(host, 0.0)
        while self.clock() < deadline:  # busy, not sleep: a runner's overhead is CPU work, and a sleep overshoots
            pass
        return output


def gather_with_extra_kernel(indices: torch.Tensor, topk_p_buf: torch.Tensor, topk_index_buf: torch.Tensor,
                             output_tokens_buf: torch.Tensor, hidden_states_buf: Any) -> GatherOutputs:
    """The compiled reference plus one more launch (an exact ``* 1`` on ``topk_p``), as when inductor
    stops fusing one of the gathers: bit-identical results, one kernel more per call."""
    topk_p, topk_index, bonus, hidden = compiled_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf,
                                                        hidden_states_buf)
    return topk_p.mul(1), topk_index, bonus, hidden
