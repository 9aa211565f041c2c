"""Mutants of the ``runner`` component that only a multi-rank run shows (``suites/runner/tensor_parallel``).

Their own :class:`~harness.mutants.MutantSet`, included in the runner's; each overrides ``group_rows`` or
``collectives``, so on one rank every one is the reference."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from harness.batch import ForwardBatch
from harness.distributed import Communicator, use_communicator
from harness.graphs import is_capturing, run_outside_graph
from harness.mutants import MutantSet
from harness.runner.runner import LayerStackRunner

__all__ = ["MUTANTS"]  # the mutants are reached through the registry, never imported by name

MUTANTS = MutantSet("runner")


@MUTANTS.add("agrees-only-when-padding", bug="skips the bucket agreement (an all-reduce) on a rank whose batch already "
                    "fills a bucket: a collective on some ranks only, so that rank's next collective meets its "
                    "peers' agreement")
class AgreesOnlyWhenPadding(LayerStackRunner):
    def group_rows(self, batch: ForwardBatch) -> int:
        if self.rows(batch) in self.buckets:  # "nothing to pad, nothing to agree on"
            return self.rows(batch)
        return super().group_rows(batch)


@MUTANTS.add("bucket-from-local-batch",
             bug="picks the bucket from its own rank's batch, not the group's largest: ranks whose batches arrive "
                 "differently padded replay graphs of different sizes, whose collectives cannot meet")
class BucketFromLocalBatch(LayerStackRunner):
    def group_rows(self, batch: ForwardBatch) -> int:
        return self.rows(batch)


class _RowPaddedAllReduce(Communicator):
    """An all-reduce over token rows padded to a multiple of the group size (the layout a
    reduce-scatter then all-gather split needs); it copies back the wrong rows."""

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        size, rows = dist.get_world_size(group), tensor.shape[0]
        padded = -(-rows // size) * size
        rows_padded = torch.cat([tensor, tensor.new_zeros((padded - rows, *tensor.shape[1:]))])
        dist.all_reduce(rows_padded, group=group)
        tensor.copy_(rows_padded[padded - rows:])  # the last rows: the padding's sum lands in a live row
        return tensor


@MUTANTS.add("pads-into-live-rows", bug="its graphs' all-reduce pads the token rows to a multiple of the group size "
                    "(the layout a reduce-scatter/all-gather split needs) and copies back the last rows: padded rows "
                    "are reduced into live rows whenever a bucket is no multiple of the group size")
class PadsIntoLiveRows(LayerStackRunner):
    def collectives(self) -> contextlib.AbstractContextManager:
        return use_communicator(_RowPaddedAllReduce())


class _AllReduceOutsideGraph(Communicator):
    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        if not is_capturing():
            return super().all_reduce(tensor, group)
        reduce = super().all_reduce
        return run_outside_graph(lambda: reduce(tensor.clone(), group))


@MUTANTS.add("collective-outside-pool", bug="runs the captured all-reduces outside the graph, into buffers allocated "
                    "outside the graph's pool at capture: replays never reduce and read memory the graph does not own")
class CollectiveOutsidePool(LayerStackRunner):
    def collectives(self) -> contextlib.AbstractContextManager:
        return use_communicator(_AllReduceOutsideGraph())
