"""Collectives of the tensor-parallel zoo models, and the communicator a runner may switch them to.

Safe to use: :func:`all_reduce`, :func:`all_gather`, :func:`all_reduce_as_break` (the all-reduce as an
eager break), :func:`agree` (the ranks' largest value), :class:`Communicator` and
:func:`use_communicator`, the seam a runner's ``collectives()`` installs its own through, as engines'
``graph_capture()`` do. ``docs/runner.md`` (Tensor parallelism) describes them."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from harness.graphs import eager_on_graph

__all__ = [
    "Communicator",
    "use_communicator",
    "current_communicator",
    "all_reduce",
    "all_reduce_as_break",
    "all_gather",
    "agree",
]


class Communicator:
    """``torch.distributed`` collectives on a process group. Subclasses override the methods
    (a graph-capturable all-reduce, a staging buffer, a reduce-scatter then all-gather)."""

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """Sum ``tensor`` over the ranks of ``group`` in place; returns it."""
        dist.all_reduce(tensor, group=group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: dist.ProcessGroup, *, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim`` in rank order (a new tensor)."""
        shards = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(shards, tensor.contiguous(), group=group)
        return torch.cat(shards, dim=dim)


_DEFAULT = Communicator()
_CURRENT: contextvars.ContextVar[Communicator] = contextvars.ContextVar("harness_communicator", default=_DEFAULT)


@contextlib.contextmanager
def use_communicator(communicator: Communicator) -> Iterator[Communicator]:
    """Run the block's collectives through ``communicator`` (nesting restores the outer one)."""
    token = _CURRENT.set(communicator)
    try:
        yield communicator
    finally:
        _CURRENT.reset(token)


def current_communicator() -> Communicator:
    return _CURRENT.get()


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum over the group through the current communicator (in place; returns ``tensor``)."""
    return current_communicator().all_reduce(tensor, group)


@eager_on_graph
def all_reduce_as_break(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """:func:`all_reduce` as an eager break: outside the graph's segments, at capture and at replay."""
    return all_reduce(tensor, group)


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup, *, dim: int = -1) -> torch.Tensor:
    """Every rank's shard concatenated along ``dim`` (the vocabulary shards of parallel logits)."""
    return current_communicator().all_gather(tensor, group, dim=dim)


def agree(values: Sequence[int], group: dist.ProcessGroup | None, *, device: torch.device) -> list[int]:
    """Each of ``values`` replaced by its maximum over the ranks of ``group`` (one all-reduce;
    the values themselves without a group). Every rank of the group must call it."""
    if group is None:
        return list(values)
    buffer = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in buffer.tolist()]
