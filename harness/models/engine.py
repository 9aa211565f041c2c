"""Engine-style building blocks: packed tokens of several requests, attention as an eager break.

Every forward takes ``(input_ids, positions, batch)``; attention reads the request boundaries from the
live :func:`~harness.batch.current_batch`, so a graph captured with one dummy request serves any split
of the same token count. Padding tokens attend to nothing and come out as zeros."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.batch import ForwardBatch, HiddenMode, current_batch, forward_context
from harness.graphs import eager_on_graph

__all__ = [
    "ModelConfig",
    "LogitsOutput",
    "RMSNorm",
    "packed_causal_attention",
    "Attention",
    "GatedMLP",
    "MoE",
    "DecoderLayer",
    "EngineModel",
    "SideInputEngineModel",
    "InPlaceArgsEngineModel",
    "LogitsProcessor",
    "CausalLM",
    "Rotary",
    "side_inputs_for",
]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of a zoo model. Keep it tiny: the suites run on a 2-core CPU.

    ``num_experts > 0`` makes the MLPs mixtures of experts. ``side_input_layer`` is the layer after
    which a side-input stack adds its per-token side input. ``compile_backend`` is the
    ``torch.compile`` backend of the MoE combine: any backend traces with Dynamo, and Dynamo is
    what rejects ``out=`` under autograd; ``aot_eager`` avoids a C++/Triton build in CI.
    """

    vocab_size: int = 96
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    num_experts: int = 0
    top_k: int = 2
    side_input_layer: int = 0
    compile_backend: str = "aot_eager"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclasses.dataclass
class LogitsOutput:
    """What the logits processor returns: next-token logits per request (or per token on request)
    and the hidden states the batch asked for (``None`` for hidden-state mode ``none``)."""

    next_token_logits: torch.Tensor
    hidden_states: torch.Tensor | None = None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 like engines' fused norms, so bf16/fp16 variants stay well conditioned.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    inv_freq: torch.Tensor  # a buffer

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [tokens, 1, head_dim]
        x32 = x.float()
        return (x32 * angles.cos() + _rotate_half(x32) * angles.sin()).to(x.dtype)


@eager_on_graph
def packed_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention within each request of the live batch; ``q, k, v``: ``[tokens, heads, dim]``.

    Reads the request boundaries from :func:`current_batch` at every call, captured or not.
    """
    batch = current_batch()
    starts, lengths = batch.start_offsets, batch.seq_lens
    if starts[-1] + lengths[-1] > q.shape[0]:
        raise ValueError(
            f"attention got {q.shape[0]} tokens but the live batch describes {starts[-1] + lengths[-1]}"
        )
    out = torch.zeros_like(q)  # padding tokens past the real ones stay zero
    scale = q.shape[-1] ** -0.5
    for start, length in zip(starts, lengths):
        qs, ks, vs = (t[start:start + length].transpose(0, 1).float() for t in (q, k, v))
        scores = (qs @ ks.transpose(-1, -2)) * scale
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        out[start:start + length] = (probs @ vs).transpose(0, 1).to(q.dtype)
    return out


class Attention(nn.Module):
    """Self-attention whose core is ``kernel(q, k, v)``, an eager break reading the live batch.

    ``kernel`` is the attention backend (:func:`packed_causal_attention` by default), swapped the way
    engines swap attention backends: the paged-KV-cache decoder sets a cache-writing kernel, and
    suites wrap it to act from inside an eager break during a replay.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kernel = packed_causal_attention
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.rotary = Rotary(config.head_dim, config.rope_theta)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).view(tokens, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.rotary(positions, q), self.rotary(positions, k)
        out = self.kernel(q, k, v.contiguous())
        return self.o_proj(out.reshape(tokens, -1))


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _combine_experts(weighted: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # The out= reduction real MoE kernels use; autograd cannot record it, so it fails with grad on.
    return torch.sum(weighted, dim=1, out=out)


class MoE(nn.Module):
    """Top-k routed experts. Every expert runs on every token (no data-dependent shapes, so the
    layer captures), the router picks ``top_k`` of them, a compiled ``out=`` sum combines them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            GatedMLP(config.hidden_size, config.intermediate_size) for _ in range(config.num_experts)
        )
        self.combine = torch.compile(_combine_experts, backend=config.compile_backend, dynamic=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Router in float32, as engines do: in bf16 near-tied experts would swap on a 1-ulp GEMM
        # difference between a padded replay and eager, which is noise, not a runner bug.
        router_logits = F.linear(x.float(), self.router.weight.float())
        weights, chosen = router_logits.softmax(dim=-1).topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        every = torch.stack([expert(x) for expert in self.experts], dim=1)  # [tokens, experts, hidden]
        picked = every.gather(1, chosen[:, :, None].expand(-1, -1, x.shape[-1]))
        out = torch.empty_like(x)
        self.combine(picked * weights[:, :, None], out)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config) if config.num_experts else GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_norm(hidden))
        return hidden + self.mlp(self.post_attention_norm(hidden))


class EngineModel(nn.Module):
    """The layer stack: embedding, decoder layers, final norm; returns hidden states ``[tokens, hidden]``.

    ``layers_attribute`` names where the layers live (``layers`` in most engines, ``h`` in GPT-2
    style stacks); discovery tests use it. A stack of other layers sets ``layer_class``, and
    :meth:`layer_arguments` for what its layers take after ``(positions, hidden)``.
    """

    layer_class: type[nn.Module] = DecoderLayer

    def __init__(self, config: ModelConfig, *, layers_attribute: str = "layers") -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers_attribute = layers_attribute
        setattr(self, layers_attribute, nn.ModuleList(self.layer_class(config) for _ in range(config.num_layers)))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return getattr(self, self.layers_attribute)

    def embed(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None) -> torch.Tensor:
        return self.embed_tokens(input_ids) if input_embeds is None else input_embeds

    def layer_arguments(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What every layer takes after ``(positions, hidden)``, computed once per forward from the embeddings."""
        return ()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                input_embeds: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embed(input_ids, input_embeds)
        extra = self.layer_arguments(hidden)
        for layer in self.decoder_layers:
            hidden = layer(positions, hidden, *extra)
        return self.norm(hidden)


class SideInputEngineModel(EngineModel):
    """A stack with a side input (like DeepStack): ``deepstack_embeds`` ``[tokens, hidden]`` is added
    to the hidden states after layer ``config.side_input_layer``."""

    side_input_names = ("deepstack_embeds",)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                input_embeds: torch.Tensor | None = None, *,
                deepstack_embeds: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embed(input_ids, input_embeds)
        extra = self.layer_arguments(hidden)
        for index, layer in enumerate(self.decoder_layers):
            hidden = layer(positions, hidden, *extra)
            if index == self.config.side_input_layer and deepstack_embeds is not None:
                hidden = hidden + deepstack_embeds
        return self.norm(hidden)


class InPlaceArgsEngineModel(EngineModel):
    """A stack that writes its own arguments in place, as engines' fused kernels do: a fused add-RMSNorm adds the
    embeddings into the ``residual`` side input ``[tokens, hidden]`` it is handed (the caller's tensor then holds
    the sum, which the layers continue from), and the positions advance by one after the last layer (a multi-step
    draft loop stepping its positions in place)."""

    side_input_names = ("residual",)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,  # type: ignore[override]
                input_embeds: torch.Tensor | None = None, *, residual: torch.Tensor) -> torch.Tensor:
        hidden = residual.add_(self.embed(input_ids, input_embeds))
        for layer in self.decoder_layers:
            hidden = layer(positions, hidden)
        positions.add_(1)
        return self.norm(hidden)


class LogitsProcessor(nn.Module):
    """Batch-size dependent glue: picks each request's last token (every token when the batch asks
    for all logits), projects to the vocabulary, and selects the hidden states the batch asks for.

    Indices come from the batch's ``last_indices`` tensor, not Python ints, so that even a capture
    of this module (a discovery fallback) follows a refreshed batch of the same request count.
    """

    def __init__(self, lm_head: nn.Linear) -> None:
        super().__init__()
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor, batch: ForwardBatch) -> LogitsOutput:
        last = hidden.index_select(0, batch.last_indices)
        logits = self.lm_head(hidden if batch.all_logits else last)
        states = {HiddenMode.NONE: None, HiddenMode.LAST: last, HiddenMode.FULL: hidden}[batch.hidden_mode]
        return LogitsOutput(next_token_logits=logits, hidden_states=states)


class CausalLM(nn.Module):
    """The outer model: the layer stack at ``.model``, an LM head and the logits processor.

    ``forward(input_ids, positions, batch, input_embeds=None)`` publishes ``batch`` as the forward
    context, runs the stack (passing the batch's side inputs the stack declares) and the processor.
    """

    def __init__(self, config: ModelConfig, stack: nn.Module | None = None, *, stack_attribute: str = "model") -> None:
        super().__init__()
        self.config = config
        self.stack_attribute = stack_attribute
        setattr(self, stack_attribute, stack if stack is not None else EngineModel(config))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logits_processor = LogitsProcessor(self.lm_head)

    @property
    def stack(self) -> nn.Module:
        return getattr(self, self.stack_attribute)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                input_embeds: torch.Tensor | None = None) -> LogitsOutput:
        with forward_context(batch):
            side_inputs = side_inputs_for(self.stack, batch, input_ids)
            hidden = self.stack(input_ids, positions, batch, input_embeds, **side_inputs)
            return self.logits_processor(hidden, batch)


def side_inputs_for(stack: nn.Module, batch: ForwardBatch, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The side-input keywords ``stack`` declares, from the batch, zeros where the batch has none.

    Always a tensor, never ``None``: a capture freezes Python control flow, so a graph captured
    without the side input would ignore it forever.
    """
    names = getattr(stack, "side_input_names", ())
    if not names:
        return {}
    config: Any = stack.config  # the stack's own attributes, which nn.Module types as Tensor | Module
    embed_tokens: Any = stack.embed_tokens
    dtype = embed_tokens.weight.dtype
    given = getattr(batch, "side_inputs", None) or {}
    return {
        name: given[name] if name in given
        else torch.zeros(input_ids.shape[0], config.hidden_size, dtype=dtype, device=input_ids.device)
        for name in names
    }
