"""Bench-only regressions: correct implementations that are slower or launch more than they should.

Not mutants (the suites pass them); they show that ``--baseline`` catches what correctness suites
cannot, e.g. ``python -m harness bench runner --impl runner=harness.bench.variants:SlowedRunner
--baseline B.json``. The README's Benchmarks section lists them."""

from __future__ import annotations

import time
from typing import Any

import torch

from harness.gather.reference import GatherOutputs, compiled_gather
from harness.runner import ForwardBatch, LayerStackRunner

__all__ = ["SLOWDOWN_S", "SlowedRunner", "EagerFallbackRunner", "gather_with_extra_kernel"]

SLOWDOWN_S = 0.002  # host time the slowed runner adds to every replay: more than a tiny model's replay on a GPU


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


def gather_with_extra_kernel(indices: torch.Tensor, topk_p_buf: torch.Tensor, topk_index_buf: torch.Tensor,
                             output_tokens_buf: torch.Tensor, hidden_states_buf: Any) -> GatherOutputs:
    """The compiled reference plus one more launch (an exact ``* 1`` on ``topk_p``), as when inductor
    stops fusing one of the gathers: bit-identical results, one kernel more per call."""
    topk_p, topk_index, bonus, hidden = compiled_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf,
                                                        hidden_states_buf)
    return topk_p.mul(1), topk_index, bonus, hidden
