"""A decoder with a paged KV cache (``paged-decoder``): the attention break writes and reads the cache.

Writes go to ``batch.kv.slot_mapping`` (:data:`~harness.batch.PAD_SLOT` writes nothing), reads follow
each request's block table up to its KV length; a batch without ``kv`` runs plain causal attention.
``model.kv_cache.writes`` counts cache writes (one per layer per forward)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from harness.batch import current_batch
from harness.graphs import eager_on_graph
from harness.models.engine import CausalLM, ModelConfig, packed_causal_attention

__all__ = ["PagedKVCache", "paged_attention", "PagedDecoderLM"]


class PagedKVCache(nn.Module):
    """Keys and values of every layer in ``num_pages`` pages of ``block_size`` token slots."""

    def __init__(self, config: ModelConfig, *, num_pages: int, block_size: int) -> None:
        super().__init__()
        self.num_pages, self.block_size = num_pages, block_size
        shape = (config.num_layers, num_pages * block_size, config.num_heads, config.head_dim)
        self.register_buffer("keys", torch.zeros(shape), persistent=False)
        self.register_buffer("values", torch.zeros(shape), persistent=False)
        self.writes = 0

    def reset(self) -> None:
        self.keys.zero_()
        self.values.zero_()
        self.writes = 0


@eager_on_graph
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cache: PagedKVCache,
                    layer: int) -> torch.Tensor:
    """Write this step's keys and values into the cache, then attend over each request's cached
    tokens (causally: a new token sees the cache up to itself). ``q, k, v``: ``[tokens, heads, dim]``."""
    batch = current_batch()
    kv = batch.kv
    if kv is None:
        return packed_causal_attention.__wrapped__(q, k, v)
    live = (kv.slot_mapping >= 0).nonzero().flatten()
    slots = kv.slot_mapping[live]
    cache.keys[layer].index_copy_(0, slots, k[live].to(cache.keys.dtype))
    cache.values[layer].index_copy_(0, slots, v[live].to(cache.values.dtype))
    cache.writes += 1
    out = torch.zeros_like(q)  # padding tokens attend to nothing
    scale = q.shape[-1] ** -0.5
    for request, (start, length) in enumerate(zip(batch.start_offsets, batch.seq_lens)):
        kv_len = kv.kv_lens[request]
        index = torch.tensor(kv.slots_of(request), device=q.device)
        keys = cache.keys[layer].index_select(0, index).transpose(0, 1).float()  # [heads, kv_len, dim]
        values = cache.values[layer].index_select(0, index).transpose(0, 1).float()
        queries = q[start:start + length].transpose(0, 1).float()
        scores = (queries @ keys.transpose(-1, -2)) * scale
        # New token j sits at position kv_len - length + j and sees cached tokens up to there.
        seen = torch.arange(kv_len, device=q.device)[None, :] <= (
            kv_len - length + torch.arange(length, device=q.device))[:, None]
        probs = scores.masked_fill(~seen, float("-inf")).softmax(dim=-1)
        out[start:start + length] = (probs @ values).transpose(0, 1).to(q.dtype)
    return out


class PagedDecoderLM(CausalLM):
    """The dense :class:`CausalLM` with a paged KV cache at ``kv_cache`` that its attention reads and
    writes (the stack stays at ``model.layers``, so discovery finds it)."""

    def __init__(self, config: ModelConfig, *, num_pages: int = 24, block_size: int = 4) -> None:
        super().__init__(config)
        self.kv_cache = PagedKVCache(config, num_pages=num_pages, block_size=block_size)
        for index, layer in enumerate(self.model.layers):
            layer.self_attn.kernel = functools.partial(paged_attention, cache=self.kv_cache, layer=index)
