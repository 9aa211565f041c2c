"""An engine-style adapter for transformers causal LMs and VLMs (:class:`TransformersAdapter`).

It takes the zoo's ``forward(input_ids, positions, batch)`` and returns a ``LogitsOutput``; the runner
captures the wrapped model's own layer stack. Its layouts (``packed``, ``grid``, ``grid-unmasked``) are
described in ``docs/runner.md`` (Real architectures)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.errors import BatchError, UsageError
from harness.models.engine import LogitsOutput

__all__ = ["TransformersAdapter", "packed_causal_mask", "LAYOUTS"]

LAYOUTS = ("packed", "grid", "grid-unmasked")


def packed_causal_mask(batch: Any, num_tokens: int, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[1, 1, T, T]`` mask: causal within each request, nothing across requests; a padding
    token (past the batch's real tokens) sees only itself, so no row is all masked."""
    owner = torch.full((num_tokens,), -1, dtype=torch.long)
    for request, (start, length) in enumerate(zip(batch.start_offsets, batch.seq_lens)):
        owner[start:start + length] = request
    real = batch.num_tokens
    owner[real:] = -2 - torch.arange(num_tokens - real)  # every padding token its own request
    index = torch.arange(num_tokens)
    allowed = (owner[:, None] == owner[None, :]) & (index[:, None] >= index[None, :])
    mask = torch.zeros(num_tokens, num_tokens, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


class _OneRequest:
    """The batch shape :func:`packed_causal_mask` reads, for one request filling every column."""

    def __init__(self, columns: int) -> None:
        self.start_offsets, self.seq_lens, self.num_tokens = (0,), (columns,), columns



class TransformersAdapter(nn.Module):
    """``TransformersAdapter(model, layout="packed")``: engine-style forward over a transformers model.

    Returns each request's last-token logits (every real token's with ``batch.all_logits``) and the
    hidden states the batch's mode asks for: what the LM head reads (the final-normed stack output),
    each request's last token (``last``) or every real token (``full``), in the logits' token order.
    """

    wrapped_model_path = "wrapped"  # discovery looks for the layer stack below this attribute

    def __init__(self, model: nn.Module, *, layout: str = "packed", rows: int = 8) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise UsageError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
        self.wrapped = model
        self.layout = layout
        self.rows = rows
        self.config = model.config

    def _dtype(self) -> torch.dtype:
        for parameter in self.wrapped.parameters():
            return parameter.dtype
        return torch.float32

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Any) -> LogitsOutput:
        mode = str(batch.hidden_mode)
        # The LM head's input is the hidden state an engine hands out; it runs eagerly, after the stack.
        seen: list[torch.Tensor] = []
        head = self.wrapped.get_output_embeddings()
        handle = head.register_forward_hook(lambda _m, args, _o: seen.append(args[0])) if mode != "none" else None
        try:
            if self.layout != "packed":
                logits, hidden = self._grid_forward(input_ids, batch, seen)
            else:
                tokens = input_ids.shape[0]
                mask = packed_causal_mask(batch, tokens, dtype=self._dtype(), device=input_ids.device)
                output = self.wrapped(input_ids=input_ids[None], position_ids=positions[None], attention_mask=mask,
                                      use_cache=False)
                logits, hidden = self._select(output.logits[0], seen[-1][0] if seen else None, batch)
        finally:
            if handle is not None:
                handle.remove()
        return LogitsOutput(logits, hidden if mode != "none" else None)

    @staticmethod
    def _select(logits: torch.Tensor, hidden: torch.Tensor | None, batch: Any) -> tuple[torch.Tensor, Any]:
        """Per-token ``logits``/``hidden`` (packed order) cut to what the batch asks for."""
        last = batch.last_indices
        logits = logits[:batch.num_tokens] if batch.all_logits else logits.index_select(0, last)
        if hidden is not None:
            hidden = hidden[:batch.num_tokens] if str(batch.hidden_mode) == "full" else hidden.index_select(0, last)
        return logits, hidden

    def _grid_forward(self, input_ids: torch.Tensor, batch: Any, seen: list[torch.Tensor]) -> tuple[torch.Tensor, Any]:
        if batch.num_requests > self.rows:
            raise BatchError(f"the grid layout holds {self.rows} requests; got {batch.describe()}")
        columns = input_ids.shape[0]
        device = input_ids.device
        ids = torch.zeros(self.rows, columns, dtype=input_ids.dtype, device=device)
        for row, (start, length) in enumerate(zip(batch.start_offsets, batch.seq_lens)):
            ids[row, :length] = input_ids[start:start + length]
        # Default positions (0.. in every row): explicit ones make transformers look for packed
        # sequences in them, a host-side check.
        extra = {}
        if self.layout == "grid":
            causal = _OneRequest(columns)
            extra["attention_mask"] = packed_causal_mask(causal, columns, dtype=self._dtype(), device=device)
        output = self.wrapped(input_ids=ids, use_cache=False, **extra)

        def packed(grid: torch.Tensor) -> torch.Tensor:  # rows back to the batch's packed token order
            return torch.cat([grid[row, :length] for row, length in enumerate(batch.seq_lens)])

        return self._select(packed(output.logits), packed(seen[-1]) if seen else None, batch)
