"""The rank pool of the tensor-parallel suites, one per test session."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from harness.plugin.session import session_of

__all__ = ["TensorParallelSession", "tensor_parallel_session"]


@dataclasses.dataclass
class TensorParallelSession:
    """The rank pool of the tensor-parallel suites and what each rank builds with (the session's
    implementations and graph backend): one per test session, started on first use."""

    pool: Any
    world_size: int
    runner_spec: str
    graphs_spec: str
    graph_backend: str

    def setup(self, **fields: Any) -> Any:
        """A :class:`harness.runner.tensor_parallel.TPSetup` with this session's implementations."""
        from harness.runner.tensor_parallel import TPSetup, warm_up_before_fork

        if fields.get("model") == "moe" and not self.pool.alive and self.pool.start_method == "fork":
            warm_up_before_fork()  # ranks forked after this inherit the compiled MoE combine
        return TPSetup(runner_spec=self.runner_spec, graphs_spec=self.graphs_spec,
                       graph_backend=self.graph_backend, **fields)


def tensor_parallel_session(config: pytest.Config) -> TensorParallelSession:
    """The session's :class:`TensorParallelSession` (``--tp`` ranks: gloo processes on the CPU, NCCL
    with a GPU each on cuda); skips, saying why, where ``--tp 1`` or there are fewer GPUs than ranks.
    The caller closes its pool at the end of the session."""
    from harness.distributed.rank_pool import RankPool

    session = session_of(config)
    world_size = config.getoption("--tp")
    if world_size < 2:
        pytest.skip(f"--tp {world_size}: the tensor-parallel cases need at least 2 ranks")
    on_gpus = session.device.type == "cuda" and torch.cuda.device_count() >= world_size
    backend_name = session.backend.name
    if session.device.type == "cuda" and not on_gpus:
        refusal = _refuses_the_emulated_backend(session.impl_specs)
        if refusal:
            pytest.skip(f"--tp {world_size} on cuda needs {world_size} GPUs (one per NCCL rank) and torch sees "
                        f"{torch.cuda.device_count()}; the gloo CPU ranks that stand in for them run the emulated "
                        f"graph backend, which the implementation under test refuses: {refusal}")
        # Rather than skip (a skipped suite would let every distributed mutant survive the kill
        # matrix of a one-GPU runner), run the ranks where they can run, and say so.
        import warnings

        warnings.warn(f"--tp {world_size} on cuda needs {world_size} GPUs (one per NCCL rank) and torch sees "
                      f"{torch.cuda.device_count()}: the tensor-parallel cases run on {world_size} gloo CPU ranks "
                      "with the emulated graph backend instead", stacklevel=1)
        backend_name = "emulated"
    pool = RankPool(world_size, backend="nccl" if on_gpus else "gloo")
    return TensorParallelSession(pool, world_size, session.impl_specs.get("runner", "reference"),
                                 session.impl_specs.get("graphs", "reference"), backend_name)


def _refuses_the_emulated_backend(impl_specs: dict[str, str]) -> str:
    """The one-line refusal of the first engine adapter among ``impl_specs`` (runner, graphs) that cannot run on
    the emulated backend (it captures real CUDA graphs); empty where every one can. The harness's own
    implementations and outside ones run on either backend."""
    from harness import impls
    from harness.errors import UsageError

    for component in ("runner", "graphs"):
        spec = impl_specs.get(component)
        if spec is None or spec not in impls.adapter_names(component):
            continue
        try:
            impls.load(component, spec, graph_backend="emulated")
        except UsageError as error:
            return str(error)
    return ""
