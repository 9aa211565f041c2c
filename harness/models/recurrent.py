"""A decoder whose layer stack keeps a recurrent state per request slot (``recurrent-state``), read and written
inside the captured segments, as hybrid models' Mamba and linear-attention layers keep theirs.

The state, ``model.recurrent_state.state`` ``[layers, slots, hidden]``, is a buffer of the outer model; the stack
reads it at each call (not a copy), so a graph captured earlier reads and writes the tensor it was captured on. An
engine that releases and re-allocates its state memory (a pause for RL training, then a resume) replaces the buffer
with a new tensor holding the same values (``suites/runner/test_moved_state.py`` moves it between replays).
Requests address their slot through the per-token side input ``token_slots``
(:func:`harness.models.index_checked.with_pool_slots`); slot 0 serves padding rows and the capture's dummy, which
read it (zeros) and write nothing, so padding never changes the state."""

from __future__ import annotations

import torch
from torch import nn

from harness.batch import ForwardBatch
from harness.models.engine import EngineModel, ModelConfig
from harness.models.index_checked import PADDING_POOL_SLOT, SlottedLM

__all__ = ["RecurrentState", "RecurrentStateLM"]


class RecurrentState(nn.Module):
    """Each layer's state of each request slot, ``state`` ``[layers, num_slots, hidden]``, zero to start."""

    state: torch.Tensor  # a buffer

    def __init__(self, config: ModelConfig, *, num_slots: int) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(config.num_layers, num_slots, config.hidden_size),
                             persistent=False)

    def reset(self) -> None:
        self.state.zero_()


class _RecurrentStack(EngineModel):
    """After each layer, every token adds its slot's state and its layer output into the state of its slot."""

    states: RecurrentState

    def __init__(self, config: ModelConfig, states: RecurrentState) -> None:
        super().__init__(config)
        # The outer model owns the state (a submodule there); here a plain reference, read at every call.
        object.__setattr__(self, "states", states)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,  # type: ignore[override]
                input_embeds: torch.Tensor | None = None, *, token_slots: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids, input_embeds)
        live = (token_slots != PADDING_POOL_SLOT).unsqueeze(-1).to(hidden.dtype)
        for index, layer in enumerate(self.decoder_layers):
            state = self.states.state[index]
            hidden = layer(positions, hidden) + state.index_select(0, token_slots)
            state.index_add_(0, token_slots, hidden * live)
        return self.norm(hidden)


class RecurrentStateLM(SlottedLM):
    """The dense :class:`CausalLM` whose stack keeps a :class:`RecurrentState` at ``recurrent_state``."""

    def __init__(self, config: ModelConfig, *, num_slots: int = 8) -> None:
        states = RecurrentState(config, num_slots=num_slots)
        super().__init__(config, _RecurrentStack(config, states))
        self.recurrent_state = states
