"""Warm-up: state a function creates lazily on its first call exists before the capture, outside the graph.

Engines build rotary tables, workspaces and counters on first use. On CUDA the capturer's warm-up
runs the function eagerly first, so that state is allocated outside the graph and the graph only
reads and updates it; created inside the capture instead, every replay would re-create it (a counter
reset, a table rebuilt from whatever the weights are now). The emulated backend does not model this
(docs/graphs.md, *Graph backends*), so these tests skip there for that stated reason.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.clause("warm-up")


class LazyState:
    """A callable that builds a cached table and a device-side call counter on its first call."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.table: torch.Tensor | None = None
        self.calls: torch.Tensor | None = None
        self.initialisations = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            self.initialisations += 1
            self.table = torch.exp(self.weight)  # from the weights of the first call, cached for good
            self.calls = torch.zeros((), device=x.device)
        self.calls.add_(1)
        return x @ self.table


@pytest.mark.parametrize("warmup_runs", [1, 2])
def test_lazy_state_is_created_at_warm_up_not_inside_the_graph(graph_oracle, graph_backend, make_tensor, warmup_runs):
    if not graph_backend.warms_up_outside_the_graph:
        pytest.skip(graph_backend.warm_up_difference or f"the {graph_backend.name} backend does not model warm-up")
    weight, x = make_tensor(3, 3, seed=1), make_tensor(4, 3, seed=2)
    lazy = LazyState(weight)
    graph = graph_oracle.capture(lambda: lazy(x), warmup_runs=warmup_runs)
    assert lazy.initialisations == 1, "the lazily created state was created more than once"
    # Each warm-up run counted once; the capture itself executes no kernel.
    assert float(lazy.calls) == warmup_runs, (
        f"after {warmup_runs} warm-up run(s) and a capture the counter reads {float(lazy.calls)}: the warm-up did not "
        "run the function eagerly, or the capture executed its kernels"
    )
    # The eager twin: the same callable as the warm-up left it (its table and counter), in a state of its own.
    twin = LazyState(weight)
    twin.table, twin.calls = lazy.table.clone(), lazy.calls.clone()
    weight.copy_(make_tensor(3, 3, seed=3))  # the cached table was built from the old weights and stays so
    for replay in range(3):
        x.copy_(make_tensor(4, 3, seed=10 + replay))
        # the counter created at warm-up keeps counting, the table stays the warm-up's
        graph_oracle.replay(graph, lambda: twin(x), inputs={"x": x, "table": lazy.table, "calls": lazy.calls},
                            eager_inputs={"x": x, "table": twin.table, "calls": twin.calls},
                            warmup_runs=warmup_runs, replay=replay)


class PerStreamWorkspace:
    """A kernel library's workspace registry keyed by stream, as AITER keeps its split-K workspace (vLLM PR 53818,
    issue 55452): an entry is created on a stream's first eager call, and refused during a capture."""

    def __init__(self) -> None:
        self.entries: dict[int, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        workspace = self.entries.get(stream)
        if workspace is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"workspace not initialised for the capturing stream {stream:#x}: warm up on the "
                                   "stream the capture uses")
            workspace = self.entries[stream] = torch.empty_like(x)
        workspace.copy_(x * 2)
        return workspace + 1


def test_state_kept_per_stream_is_warmed_up_on_the_stream_the_capture_uses(graph_oracle, graph_backend, make_tensor):
    """A warm-up on one stream and a capture on another leaves per-stream state missing for the capture (vLLM PR
    53818): the capture must go through, and every replay equal eager."""
    if graph_backend.name != "cuda":
        pytest.skip("state kept per CUDA stream exists only on CUDA; the emulated backend does not model warm-up")
    x = make_tensor(256, seed=71)
    kernel, twin = PerStreamWorkspace(), PerStreamWorkspace()
    graph = graph_oracle.capture(lambda: kernel(x), program="a kernel with a workspace per stream")
    for replay in range(2):
        x.copy_(make_tensor(256, seed=72 + replay))
        graph_oracle.replay(graph, lambda: twin(x), inputs=[x], exact=True, replay=replay)
