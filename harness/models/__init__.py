"""Model zoo: engine-style toy models with packed multi-request batches.

Safe to use: ``build_model(name, seed=..., dtype=..., device=...)`` for any of :data:`MODEL_NAMES`, and
:func:`forward_context`, from which their attention reads the live request boundaries."""

from harness.batch import current_batch, forward_context
from harness.models.engine import CausalLM, EngineModel, LogitsOutput, ModelConfig, packed_causal_attention
from harness.models.tensor_parallel import shard_model
from harness.models.zoo import MODEL_NAMES, build_model

__all__ = [
    "MODEL_NAMES",
    "build_model",
    "shard_model",
    "ModelConfig",
    "LogitsOutput",
    "CausalLM",
    "EngineModel",
    "packed_causal_attention",
    "forward_context",
    "current_batch",
]
