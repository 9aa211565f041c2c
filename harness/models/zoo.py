"""The engine-style model zoo: tiny, deterministic models built from code, never downloaded.

``build_model(name, seed=..., dtype=..., device=...)``; weights depend only on ``seed`` (drawn on the CPU
in float32, then cast and moved), so every device and dtype starts from the same numbers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from harness.batch import ForwardBatch, forward_context
from harness.errors import UsageError
from harness.models.cross_token import CrossTokenLM
from harness.models.engine import (
    CausalLM,
    EngineModel,
    InPlaceArgsEngineModel,
    LogitsOutput,
    LogitsProcessor,
    ModelConfig,
    SideInputEngineModel,
)
from harness.models.index_checked import IndexCheckedLM
from harness.models.paged import PagedDecoderLM
from harness.models.recurrent import RecurrentStateLM

__all__ = [
    "MODEL_NAMES",
    "build_model",
    "VisionLanguageModel",
    "BaseAsLanguageModel",
    "DecoderOnlyStack",
    "ModuleWrapper",
]


class VisionLanguageModel(nn.Module):
    """VLM-style wrapper: the text model at ``language_model`` (``language_model.model.layers``),
    fed ``input_embeds`` that the wrapper computes (token embeddings scaled per channel, standing
    for merged image features)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.language_model = CausalLM(config)
        self.embed_scale = nn.Parameter(torch.ones(config.hidden_size))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch) -> LogitsOutput:
        stack: Any = self.language_model.model  # an EngineModel
        input_embeds = stack.embed_tokens(input_ids) * self.embed_scale
        return self.language_model(input_ids, positions, batch, input_embeds=input_embeds)


class BaseAsLanguageModel(nn.Module):
    """Odd layout: ``language_model`` is itself the base model (it has ``.layers``, no ``.model``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.language_model = EngineModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logits_processor = LogitsProcessor(self.lm_head)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch) -> LogitsOutput:
        with forward_context(batch):
            return self.logits_processor(self.language_model(input_ids, positions, batch), batch)


class DecoderOnlyStack(nn.Module):
    """Odd layout: ``.model`` without ``.layers``; the stack sits at ``.model.decoder`` (``decoder.layers``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.decoder = EngineModel(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                input_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder(input_ids, positions, batch, input_embeds)


class ModuleWrapper(nn.Module):
    """Odd layout: a whole model wrapped by another module (as DDP or a serving shim would)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.config = module.config
        self.module = module

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch) -> Any:
        return self.module(input_ids, positions, batch)


def _moe(config: ModelConfig) -> ModelConfig:
    return config if config.num_experts else dataclasses.replace(config, num_experts=4)


_BUILDERS: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "dense": CausalLM,
    "moe": lambda config: CausalLM(_moe(config)),
    "vlm": VisionLanguageModel,
    "side-input": lambda config: CausalLM(config, SideInputEngineModel(config)),
    # A stack that writes its arguments in place (its residual side input, its positions), as fused kernels do.
    "in-place-args": lambda config: CausalLM(config, InPlaceArgsEngineModel(config)),
    "odd-decoder-layers": lambda config: CausalLM(config, DecoderOnlyStack(config)),
    "odd-transformer-h": lambda config: CausalLM(
        config, EngineModel(config, layers_attribute="h"), stack_attribute="transformer"),
    "odd-lm-is-base": BaseAsLanguageModel,
    "odd-wrapped-stack": lambda config: ModuleWrapper(CausalLM(config)),
    "paged-decoder": PagedDecoderLM,
    # A recurrent state per request slot (Mamba-style), read and written inside the captured segments.
    "recurrent-state": RecurrentStateLM,
    # Attention that checks every row it reads, padding rows included, against a request pool (pad rows' metadata).
    "index-checked": IndexCheckedLM,
    # Ops that mix rows (a dynamic per-tensor scale over every row, pad rows masked by a multiply): NaN in a pad row
    # of a hidden input or of a break's output reaches every real row.
    "cross-token": CrossTokenLM,
    # No rule finds this stack: its layer list has a name no engine uses, under a name no engine uses,
    # so discovery must fall back to the whole model (single requests replay, several run eagerly).
    "odd-unnamed-layers": lambda config: CausalLM(
        config, EngineModel(config, layers_attribute="stages"), stack_attribute="backbone"),
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def _initialise(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            if parameter.dim() == 1:  # norm weights and per-channel scales: near one
                value = 1.0 + 0.1 * noise
            elif name.endswith("embed_tokens.weight"):
                value = noise  # unit-scale embeddings keep activations O(1)
            else:  # fan-in scaling keeps every layer's output O(1), so tolerances mean the same everywhere
                value = noise * parameter.shape[1] ** -0.5
            parameter.copy_(value)


def build_model(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", requires_grad: bool = False,
                config: ModelConfig | None = None) -> nn.Module:
    """Build zoo model ``name`` with weights drawn from ``seed``, in eval mode.

    The weights depend on the arguments only, not on the caller's default dtype.
    ``requires_grad=False`` (the default) freezes parameters as an inference engine does; the MoE
    suite turns it on to prove the runner switches autograd off itself.
    """
    if name not in _BUILDERS:
        raise UsageError(f"unknown zoo model {name!r}; known models: {', '.join(MODEL_NAMES)}")
    if not (dtype.is_floating_point and dtype.itemsize >= 2):
        raise UsageError(f"zoo models need a float16/bfloat16/float32/float64 dtype, got {dtype}")
    # Weights drawn in float32 whatever the caller's default dtype, then cast: a model depends on its arguments only,
    # so a runner's model built under a caller's context equals its eager twin built outside it.
    caller_default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        model = _BUILDERS[name](config or ModelConfig())
        _initialise(model, seed)
    finally:
        torch.set_default_dtype(caller_default)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(requires_grad)
    model.zoo_name = name  # type: ignore[assignment]  # torch's stub types __setattr__'s value Tensor | Module
    return model
