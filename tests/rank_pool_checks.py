"""Step functions the harness's own tests run in a :class:`~harness.distributed.rank_pool.RankPool` (module-level,
so the pool pickles them by name): collectives under the emulated backend, and ranks that hang,
raise or die."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from harness.distributed.rank_pool import RankContext
from harness.graphs import GraphCapturer, get_backend


def rank_and_sum(context: RankContext) -> tuple[int, float]:
    value = torch.tensor([float(context.rank + 1)])
    dist.all_reduce(value)
    return context.rank, value.item()


def replay_collectives(context: RankContext, collectives_as_breaks: bool) -> dict[str, Any]:
    """Capture ``all_reduce(x * 2)`` then an all-gather on the emulated backend; refill ``x``;
    replay. Returns what the replay produced and what eager gives for the same refilled input."""
    from harness import distributed

    static = torch.full((3, 2), float(context.rank + 1))
    reduce = distributed.all_reduce_as_break if collectives_as_breaks else distributed.all_reduce

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        reduced = reduce(static * 2, context.group)
        gathered = torch.empty((context.world_size * 3, 2))
        dist.all_gather_into_tensor(gathered, reduced + context.rank, group=context.group)
        return reduced, gathered

    graph = GraphCapturer(get_backend("emulated")).capture(step)
    captured = [t.clone() for t in graph.output]
    static.copy_(torch.arange(6.0).view(3, 2) * (context.rank + 1))  # live values, different per rank
    replayed = [t.clone() for t in graph.replay()]
    eager = [t.clone() for t in step()]
    return {"captured": captured, "replayed": replayed, "eager": eager, "breaks": graph.break_count}


def all_reduce_on_rank_zero_only(context: RankContext) -> str:
    if context.rank == 0:
        dist.all_reduce(torch.ones(1))  # its peers never join: rank 0 waits
    return "done"


def raise_on_last_rank(context: RankContext) -> str:
    if context.rank == context.world_size - 1:
        raise ValueError(f"rank {context.rank} raised on purpose")
    dist.all_reduce(torch.ones(1))  # blocked until the raising rank is gone
    return "done"


def die_on_rank_one(context: RankContext) -> str:
    if context.rank == 1:
        os._exit(3)
    return "done"


def shard_errors(context: RankContext) -> list[str]:
    from harness.errors import UsageError
    from harness.models import ModelConfig, build_model
    from harness.models.tensor_parallel import shard_model

    messages = []
    for model, options in ((build_model("dense", config=ModelConfig(vocab_size=95)), {}),
                           (build_model("vlm"), {}), (build_model("dense"), {"collectives": "sometimes"})):
        try:
            shard_model(model, context.group, **options)
        except UsageError as error:
            messages.append(str(error))
    return messages
