"""The candidate captured inside a graph (emulated or CUDA backend) and replayed after a refill.

An engine captures the decode step once and replays it with new slot indices (and new stashed
extras) every step: the replay must read the refilled static tensors, not the capture-time values.
"""

from __future__ import annotations

import pytest
import torch

from harness.gather import GatherCase
from harness.gather.cases import BufferSpec, random_values

pytestmark = pytest.mark.clause("in-graph")


@pytest.mark.parametrize("with_hidden", [True, False], ids=["hidden", "no-hidden"])
def test_replay_after_refilling_indices_and_sources(check_gather, graph_backend, device, with_hidden):
    case = GatherCase(pool=64, count=9, seed=10) if with_hidden else GatherCase(pool=64, count=9, seed=10, hidden=None)
    inputs = case.build(device)
    check_gather.args(*inputs.args, case=case, call="warm-up")  # the engine's eager step before it captures
    graph = check_gather.capture(graph_backend, *inputs.args, **case.describe())
    generator = torch.Generator().manual_seed(case.seed)
    for replay in range(3):
        inputs.indices.copy_(torch.randint(0, case.pool, (case.count,), generator=generator))
        for buffer in inputs.buffers:  # a new step stashed new extras into the same buffers
            if buffer is not None:
                buffer.copy_(random_values(buffer.shape, buffer.dtype, generator=generator))
        check_gather.replay(graph, *inputs.args, **case.describe(), replay=replay,
                            refilled_indices=inputs.indices.tolist())


@pytest.mark.clause("in-graph")
def test_graphs_of_growing_index_counts_each_keep_their_own_memory(check_gather, graph_backend, device):
    """An engine captures one graph per batch size, smallest first (TensorRT-LLM #16319: a workspace grown for a later,
    larger capture left earlier graphs reading the old one's address). Each size gets its eager warm-up step and its
    capture in turn; then every graph, replayed on refilled indices, in rounds, must still equal eager."""
    # Row shapes no other test uses, so that a workspace kept per shape is this test's own and grows here; the last
    # count is larger than any other test's, for a workspace kept per dtype alone.
    shapes = dict(topk_p=BufferSpec((5,), torch.float32), topk_index=BufferSpec((5,), torch.int64),
                  hidden=BufferSpec((37,), torch.bfloat16))
    cases = [GatherCase(pool=64, count=count, seed=30 + count, **shapes) for count in (3, 9, 4099)]
    built = [case.build(device) for case in cases]
    graphs = []
    for case, inputs in zip(cases, built):
        check_gather.args(*inputs.args, case=case, call="warm-up")
        graphs.append(check_gather.capture(graph_backend, *inputs.args, **case.describe()))
    generator = torch.Generator().manual_seed(31)
    for replay in range(2):
        for case, inputs, graph in zip(cases, built, graphs):
            inputs.indices.copy_(torch.randint(0, case.pool, (case.count,), generator=generator))
            check_gather.replay(graph, *inputs.args, **case.describe(), replay=replay,
                                capture_order=[c.count for c in cases])
