"""Collectives of tensor-parallel models, and the communicator a graph runner may switch them to.

The sharded zoo models (:mod:`harness.models.tensor_parallel`) call :func:`all_reduce` and
:func:`all_gather` here, never ``torch.distributed`` directly. These run through the *current
communicator*: :class:`Communicator` (``torch.distributed`` on the given group: gloo on the CPU,
NCCL on GPUs) unless a block installs another with :func:`use_communicator`. That is the seam
engines have: vLLM's and SGLang's ``graph_capture()`` switch the tensor-parallel group to a
graph-capturable all-reduce (custom all-reduce, pynccl) while graphs are captured and replayed.
The reference runner keeps the default (``torch.distributed`` collectives capture as they are: the
emulated backend records and replays them, NCCL supports stream capture); runners under test may
install their own through the runner's ``collectives()`` seam.

:func:`all_reduce_as_break` is the same all-reduce marked as an eager break: a model built with
``collectives="break"`` runs every all-reduce between graph segments, at replay too, on the live
values of the captured buffer (the other way engines run collectives with graphs).

:func:`agree` is the runner's host-side agreement: the largest of the ranks' values, one all-reduce.
"""

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
