"""A decoder with a cross-token op inside its captured segments (``cross-token``).

Per-token layers keep whatever a pad row holds in that row. Some ops mix rows: a dynamic per-tensor activation
scale (one scale per tensor, from the largest magnitude over every row the kernel is handed, as FP8 activation
quantisers take it), token-mixing layers, MoE dispatch. Their kernels are handed the bucket's rows, pad rows
included, and keep pad rows out of the scale with a row mask they multiply by. That mask is exact for any
finite pad row, and lets NaN through: ``NaN * 0`` is NaN. A runner that pads a hidden input with rows nobody
wrote, and a break output whose pad rows were never written, then turn every real row's values into NaN (vLLM
#40047). Correct pad rows (the padding fill) leave real rows exactly as eager computes them.

The stack is the side-input stack (a ``deepstack_embeds`` hidden input added after layer
``config.side_input_layer``). Each layer scales its normed input and its attention output, both ``[tokens,
hidden]``, by :func:`soft_range`. The row mask comes from :func:`live_row_mask`, an eager break that reads the
live batch once per forward, so that the mask follows the live batch's real rows at every replay.
"""

from __future__ import annotations

import torch

from harness.batch import current_batch
from harness.graphs import eager_on_graph
from harness.models.engine import CausalLM, DecoderLayer, ModelConfig, SideInputEngineModel

__all__ = ["live_row_mask", "soft_range", "CrossTokenDecoderLayer", "CrossTokenEngineModel", "CrossTokenLM"]


@eager_on_graph
def live_row_mask(hidden: torch.Tensor) -> torch.Tensor:
    """``[tokens, 1]`` of ``hidden``'s dtype: one for the live batch's real tokens, zero for its pad rows."""
    mask = hidden.new_zeros(hidden.shape[0], 1)
    mask[:current_batch().num_tokens] = 1
    return mask


def soft_range(x: torch.Tensor, row_mask: torch.Tensor) -> torch.Tensor:
    """``x`` squashed into one dynamic per-tensor range: ``tanh(x / s) * s``, where ``s`` is the largest magnitude
    over the rows ``row_mask`` keeps. Every output element depends on every kept row; a NaN in any row, kept or
    not, reaches all of them. ``amax`` is exact in any reduction order, so a padded replay equals eager bitwise
    wherever its inputs do."""
    scale = (x * row_mask).abs().amax().clamp_min(torch.finfo(x.dtype).tiny)
    return torch.tanh(x / scale) * scale


class CrossTokenDecoderLayer(DecoderLayer):
    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,  # type: ignore[override]
                row_mask: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(positions, soft_range(self.input_norm(hidden), row_mask))
        hidden = hidden + soft_range(attended, row_mask)
        return hidden + self.mlp(self.post_attention_norm(hidden))


class CrossTokenEngineModel(SideInputEngineModel):
    """The side-input stack with :class:`CrossTokenDecoderLayer` layers, which mix rows."""

    layer_class = CrossTokenDecoderLayer

    def layer_arguments(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (live_row_mask(hidden),)


class CrossTokenLM(CausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, CrossTokenEngineModel(config))
