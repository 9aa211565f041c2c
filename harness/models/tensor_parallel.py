"""Tensor-parallel versions of the engine zoo's dense and MoE models (:func:`shard_model`).

Megatron-style sharding, ``collectives="graph"`` or ``"break"``, and why TP=N equals TP=1 within the
tolerance table but not bitwise: ``docs/runner.md`` (Tensor parallelism)."""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from harness import distributed
from harness.errors import UsageError
from harness.models.engine import Attention, CausalLM, GatedMLP, LogitsProcessor, MoE, packed_causal_attention

__all__ = ["COLLECTIVE_MODES", "shard_model", "VocabParallelEmbedding", "ParallelLMHead",
           "ParallelAttention", "ParallelMLP", "ParallelMoE"]

COLLECTIVE_MODES = ("graph", "break")


def _reduce(tensor: torch.Tensor, group: dist.ProcessGroup, mode: str) -> torch.Tensor:
    if mode == "break":
        return distributed.all_reduce_as_break(tensor, group)
    return distributed.all_reduce(tensor, group)


def _rows(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's block of output features (a column-parallel shard)."""
    return weight.chunk(size, dim=0)[rank].clone()


def _columns(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's block of input features (a row-parallel shard)."""
    return weight.chunk(size, dim=1)[rank].contiguous().clone()


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, start + shard)`` of the embedding table; other tokens embed to zero here."""

    def __init__(self, full: nn.Embedding, group: dist.ProcessGroup, mode: str) -> None:
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.group, self.mode = group, mode
        self.shard = full.num_embeddings // size
        self.start = rank * self.shard
        self.weight = nn.Parameter(_rows(full.weight.data, rank, size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.shard)
        # where(), not boolean indexing: a data-dependent shape could not be captured.
        rows = F.embedding(local.clamp(0, self.shard - 1), self.weight)
        rows = torch.where(inside[:, None], rows, torch.zeros_like(rows))
        return _reduce(rows, self.group, self.mode)


class ParallelAttention(nn.Module):
    """This rank's heads of :class:`~harness.models.engine.Attention`; the output projection row-parallel."""

    def __init__(self, full: Attention, group: dist.ProcessGroup, mode: str) -> None:
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.group, self.mode = group, mode
        self.kernel = packed_causal_attention
        self.num_heads, self.head_dim = full.num_heads // size, full.head_dim
        hidden = full.qkv_proj.in_features
        # The fused weight is [q; k; v], each [heads * dim, hidden]: shard each by heads.
        q, k, v = full.qkv_proj.weight.data.chunk(3, dim=0)
        self.qkv_proj = nn.Linear(hidden, 3 * self.num_heads * self.head_dim, bias=False)
        self.qkv_proj.weight.data.copy_(torch.cat([_rows(w, rank, size) for w in (q, k, v)]))
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.o_proj.weight.data.copy_(_columns(full.o_proj.weight.data, rank, size))
        self.rotary = copy.deepcopy(full.rotary)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).view(tokens, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.rotary(positions, q), self.rotary(positions, k)
        out = self.kernel(q, k, v.contiguous())
        return _reduce(self.o_proj(out.reshape(tokens, -1)), self.group, self.mode)


def _shard_mlp(full: GatedMLP, rank: int, size: int) -> GatedMLP:
    hidden, intermediate = full.gate_proj.in_features, full.gate_proj.out_features // size
    mlp = GatedMLP(hidden, intermediate)
    mlp.gate_proj.weight.data.copy_(_rows(full.gate_proj.weight.data, rank, size))
    mlp.up_proj.weight.data.copy_(_rows(full.up_proj.weight.data, rank, size))
    mlp.down_proj.weight.data.copy_(_columns(full.down_proj.weight.data, rank, size))
    return mlp


class ParallelMLP(nn.Module):
    """Gate/up column-parallel, down row-parallel, then the all-reduce."""

    def __init__(self, full: GatedMLP, group: dist.ProcessGroup, mode: str) -> None:
        super().__init__()
        self.group, self.mode = group, mode
        self.local = _shard_mlp(full, dist.get_rank(group), dist.get_world_size(group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reduce(self.local(x), self.group, self.mode)


class ParallelMoE(MoE):
    """The router replicated, every expert sharded like :class:`ParallelMLP` without its own
    all-reduce: the combine is linear, so one all-reduce after it sums the ranks' partial outputs."""

    def __init__(self, full: MoE, group: dist.ProcessGroup, mode: str) -> None:
        nn.Module.__init__(self)
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.group, self.mode = group, mode
        self.top_k = full.top_k
        self.router = copy.deepcopy(full.router)
        self.experts = nn.ModuleList(_shard_mlp(cast(GatedMLP, expert), rank, size) for expert in full.experts)
        self.combine = full.combine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reduce(super().forward(x), self.group, self.mode)


class ParallelLMHead(nn.Module):
    """This rank's vocabulary rows of the LM head; the logit shards are all-gathered along the vocabulary."""

    def __init__(self, full: nn.Linear, group: dist.ProcessGroup) -> None:
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.group = group
        self.weight = nn.Parameter(_rows(full.weight.data, rank, size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return distributed.all_gather(F.linear(hidden, self.weight), self.group, dim=-1)


def _check_divisible(model: CausalLM, size: int) -> None:
    config = model.config
    sizes = {"vocab_size": config.vocab_size, "num_heads": config.num_heads,
             "intermediate_size": config.intermediate_size}
    bad = {name: value for name, value in sizes.items() if value % size}
    if bad:
        raise UsageError(f"cannot shard over {size} ranks: {', '.join(f'{k}={v}' for k, v in bad.items())} "
                         f"not divisible by {size}")


def shard_model(model: CausalLM, group: dist.ProcessGroup, *, collectives: str = "graph") -> CausalLM:
    """This rank's tensor-parallel shard of zoo model ``model`` (dense or MoE), as a new model.

    ``model`` is left untouched (it is the TP=1 oracle). The shard keeps the zoo's layout (the layer
    stack at ``.model``, its layers at ``.model.layers``), so discovery finds the same stack, and
    exposes ``process_group`` (the group a runner agrees its buckets over) and ``collectives``.
    """
    if collectives not in COLLECTIVE_MODES:
        raise UsageError(f"collectives={collectives!r}: choose one of {', '.join(COLLECTIVE_MODES)}")
    if type(model) is not CausalLM or type(model.stack).__name__ != "EngineModel":
        raise UsageError(f"shard_model shards the zoo's dense and MoE models, not {type(model).__name__}")
    size = dist.get_world_size(group)
    _check_divisible(model, size)
    # Module surgery on attributes nn.Module types as Tensor | Module: the stacks are the zoo's EngineModel.
    sharded: Any = copy.deepcopy(model)
    full_stack: Any = model.stack
    stack = sharded.stack
    stack.embed_tokens = VocabParallelEmbedding(full_stack.embed_tokens, group, collectives)
    for layer, full in zip(stack.decoder_layers, full_stack.decoder_layers):
        layer.self_attn = ParallelAttention(full.self_attn, group, collectives)
        layer.mlp = (ParallelMoE(full.mlp, group, collectives) if isinstance(full.mlp, MoE)
                     else ParallelMLP(full.mlp, group, collectives))
    sharded.lm_head = ParallelLMHead(model.lm_head, group)
    sharded.logits_processor = LogitsProcessor(sharded.lm_head)
    sharded.process_group = group
    sharded.collectives = collectives
    reference = next(model.parameters())
    return sharded.to(device=reference.device, dtype=reference.dtype).eval().requires_grad_(False)

