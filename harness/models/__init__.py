"""Model zoo: engine-style toy models with packed multi-request batches.

``build_model(name, seed=..., dtype=..., device=...)`` builds one of :data:`MODEL_NAMES`; their
attention reads the live request boundaries from :func:`forward_context`.
"""

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
