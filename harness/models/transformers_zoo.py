"""The transformers zoo: tiny, seeded, randomly initialised models of real architectures, built offline.

``build_architecture(name, seed=...)`` returns the model in eval mode, or raises
:class:`ArchitectureUnavailable` when the installed transformers lacks it. Hidden size 32, vocabulary 160
(never equal, so an output's last dimension tells logits from hidden states)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from harness.devices import EXPERTS_IMPLEMENTATIONS, EXPERTS_VARIABLE, experts_implementation
from harness.errors import HarnessError, UsageError

__all__ = [
    "Architecture",
    "ArchitectureUnavailable",
    "ARCHITECTURES",
    "FAMILIES",
    "VOCAB_SIZE",
    "HIDDEN_SIZE",
    "NUM_LAYERS",
    "architecture",
    "build_architecture",
    "text_config_of",
    "EXPERTS_IMPLEMENTATIONS",
    "EXPERTS_VARIABLE",
    "experts_implementation",
]

VOCAB_SIZE = 160
HIDDEN_SIZE = 32
NUM_LAYERS = 3  # three, so "a middle layer" exists for divergence localisation
FAMILIES = ("dense", "gpt-style", "moe", "hybrid", "vlm")


class ArchitectureUnavailable(HarnessError):
    """The installed transformers lacks this architecture (or its config cannot be built tiny).

    The message names the transformers version (for skip reasons); ``reason`` does not, so the
    matrices' goldens stay the same across transformers releases that fail the same way.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One zoo entry: transformers class names, the family, and config overrides beyond the tiny
    common shape. ``packable``: whether several requests can share one row with a block-diagonal
    mask (false where a recurrent state would flow from one request into the next)."""

    name: str
    family: str
    model_class: str
    config_class: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    vision: Mapping[str, Any] | None = None  # vision_config overrides of a VLM
    text: Mapping[str, Any] | None = None  # text_config overrides of a VLM
    # How the adapter lays requests out (see harness.models.transformers_adapter): "packed" in one
    # row; "grid", a row per request, where a recurrent state would flow from request to request;
    # "grid-unmasked" where the model also builds its own mask from a 2D one (ALiBi).
    layout: str = "packed"


# The tiny common text shape; each config takes the names it declares (GPT-2 calls them n_embd, ...).
_TEXT = dict(
    vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, intermediate_size=64, num_hidden_layers=NUM_LAYERS,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
    initializer_range=HIDDEN_SIZE ** -0.5,  # O(1) activations: a layer's contribution is visible
    use_cache=False, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    # GPT-style spellings of the same shape
    n_embd=HIDDEN_SIZE, n_layer=NUM_LAYERS, n_head=4, n_positions=256, n_inner=64, n_ctx=256,
    d_model=HIDDEN_SIZE, n_heads=4, n_layers=NUM_LAYERS, ffn_dim=64, num_layers=NUM_LAYERS,
    rotary_dim=4, word_embed_proj_dim=HIDDEN_SIZE, max_seq_len=256,
)
_MOE = dict(num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=0, decoder_sparse_step=1,
            moe_k=2, moe_num_experts=4, moe_num_shared_experts=0, num_experts_per_token=2, top_k=2)
_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16,
               patch_size=8, projection_dim=16, num_channels=3, embed_dim=16, depth=2, num_heads=2,
               out_hidden_size=HIDDEN_SIZE, vision_output_dim=16, initializer_range=0.05)


def _a(name: str, family: str, model_class: str, config_class: str, *, layout: str = "packed",
       vision: Mapping[str, Any] | None = None, text: Mapping[str, Any] | None = None,
       **overrides: Any) -> Architecture:
    return Architecture(name, family, model_class, config_class, overrides, vision, text, layout)


ARCHITECTURES: tuple[Architecture, ...] = (
    # dense causal LMs: the stack at model.layers
    _a("llama", "dense", "LlamaForCausalLM", "LlamaConfig"),
    _a("mistral", "dense", "MistralForCausalLM", "MistralConfig", sliding_window=None),
    _a("qwen2", "dense", "Qwen2ForCausalLM", "Qwen2Config"),
    _a("qwen3", "dense", "Qwen3ForCausalLM", "Qwen3Config"),
    _a("gemma", "dense", "GemmaForCausalLM", "GemmaConfig"),
    _a("gemma2", "dense", "Gemma2ForCausalLM", "Gemma2Config", sliding_window=256),
    _a("gemma3-text", "dense", "Gemma3ForCausalLM", "Gemma3TextConfig", sliding_window=256),
    _a("phi", "dense", "PhiForCausalLM", "PhiConfig"),
    _a("phi3", "dense", "Phi3ForCausalLM", "Phi3Config"),
    _a("cohere", "dense", "CohereForCausalLM", "CohereConfig"),
    _a("stablelm", "dense", "StableLmForCausalLM", "StableLmConfig"),
    _a("olmo2", "dense", "Olmo2ForCausalLM", "Olmo2Config"),
    _a("granite", "dense", "GraniteForCausalLM", "GraniteConfig"),
    _a("starcoder2", "dense", "Starcoder2ForCausalLM", "Starcoder2Config", sliding_window=None),
    _a("glm4", "dense", "Glm4ForCausalLM", "Glm4Config"),
    _a("helium", "dense", "HeliumForCausalLM", "HeliumConfig"),
    _a("smollm3", "dense", "SmolLM3ForCausalLM", "SmolLM3Config"),
    _a("persimmon", "dense", "PersimmonForCausalLM", "PersimmonConfig"),
    # older GPT-style layouts
    _a("gpt2", "gpt-style", "GPT2LMHeadModel", "GPT2Config"),
    _a("gpt-neox", "gpt-style", "GPTNeoXForCausalLM", "GPTNeoXConfig"),
    _a("opt", "gpt-style", "OPTForCausalLM", "OPTConfig"),
    _a("gptj", "gpt-style", "GPTJForCausalLM", "GPTJConfig"),
    _a("gpt-neo", "gpt-style", "GPTNeoForCausalLM", "GPTNeoConfig", attention_types=[[["global"], NUM_LAYERS]],
       num_layers=NUM_LAYERS),
    _a("bloom", "gpt-style", "BloomForCausalLM", "BloomConfig", layout="grid-unmasked"),  # ALiBi from a 2D mask
    _a("falcon", "gpt-style", "FalconForCausalLM", "FalconConfig"),
    _a("gpt-bigcode", "gpt-style", "GPTBigCodeForCausalLM", "GPTBigCodeConfig"),
    _a("codegen", "gpt-style", "CodeGenForCausalLM", "CodeGenConfig"),
    _a("mpt", "gpt-style", "MptForCausalLM", "MptConfig"),
    _a("xglm", "gpt-style", "XGLMForCausalLM", "XGLMConfig"),
    _a("biogpt", "gpt-style", "BioGptForCausalLM", "BioGptConfig"),
    # mixtures of experts
    _a("mixtral", "moe", "MixtralForCausalLM", "MixtralConfig", sliding_window=None, **_MOE),
    _a("qwen2-moe", "moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", **_MOE),
    _a("qwen3-moe", "moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", **_MOE),
    _a("olmoe", "moe", "OlmoeForCausalLM", "OlmoeConfig", **_MOE),
    _a("granite-moe", "moe", "GraniteMoeForCausalLM", "GraniteMoeConfig", **_MOE),
    _a("phimoe", "moe", "PhimoeForCausalLM", "PhimoeConfig", sliding_window=None, **_MOE),
    _a("dbrx", "moe", "DbrxForCausalLM", "DbrxConfig",
       ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2), attn_config=dict(kv_n_heads=2), **_MOE),
    _a("jetmoe", "moe", "JetMoeForCausalLM", "JetMoeConfig", kv_channels=8, **_MOE),
    _a("gpt-oss", "moe", "GptOssForCausalLM", "GptOssConfig", sliding_window=256, **_MOE),
    _a("ernie4.5-moe", "moe", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", **_MOE),
    _a("glm4-moe", "moe", "Glm4MoeForCausalLM", "Glm4MoeConfig", n_group=1, topk_group=1, **_MOE),
    # hybrids: attention with state-space or linear-attention layers (a recurrent state: not packable)
    _a("jamba", "hybrid", "JambaForCausalLM", "JambaConfig", layout="grid", attn_layer_period=2, attn_layer_offset=1,
       expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
       **_MOE),
    _a("bamba", "hybrid", "BambaForCausalLM", "BambaConfig", layout="grid", attn_layer_indices=[1], mamba_n_heads=4,
       mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16, mamba_expand=2),
    _a("falcon-h1", "hybrid", "FalconH1ForCausalLM", "FalconH1Config", layout="grid", mamba_n_heads=4, mamba_d_head=16,
       mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16, mamba_expand=2, mamba_d_ssm=64),
    _a("qwen3-next", "hybrid", "Qwen3NextForCausalLM", "Qwen3NextConfig", layout="grid",
       layer_types=["linear_attention", "full_attention", "linear_attention"], linear_num_value_heads=2,
       linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, **_MOE),
    _a("lfm2", "hybrid", "Lfm2ForCausalLM", "Lfm2Config", layout="grid",
       layer_types=["conv", "full_attention", "conv"], block_ff_dim=64, block_auto_adjust_ff_dim=False),
    _a("granite-moe-hybrid", "hybrid", "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", layout="grid",
       layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
       mamba_d_state=8, mamba_chunk_size=16, mamba_expand=2, **_MOE),
    # vision-language models, transformers 5.x layout (model.language_model)
    _a("llava", "vlm", "LlavaForConditionalGeneration", "LlavaConfig", vision=dict(model_type="clip_vision_model"),
       text=dict(model_type="llama")),
    _a("llava-next", "vlm", "LlavaNextForConditionalGeneration", "LlavaNextConfig",
       vision=dict(model_type="clip_vision_model"), text=dict(model_type="llama"), image_grid_pinpoints=[[16, 16]]),
    _a("mistral3", "vlm", "Mistral3ForConditionalGeneration", "Mistral3Config", vision=dict(model_type="pixtral"),
       text=dict(model_type="mistral", sliding_window=None)),
    _a("qwen2-vl", "vlm", "Qwen2VLForConditionalGeneration", "Qwen2VLConfig", vision=dict(),
       text=dict(model_type="qwen2_vl_text",
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2]))),
    _a("qwen2.5-vl", "vlm", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", vision=dict(),
       text=dict(model_type="qwen2_5_vl_text",
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2]))),
    _a("qwen3-vl", "vlm", "Qwen3VLForConditionalGeneration", "Qwen3VLConfig", vision=dict(deepstack_visual_indexes=[0]),
       text=dict(model_type="qwen3_vl_text", rope_scaling=dict(rope_type="default", mrope_section=[1, 1, 2]))),
    _a("gemma3", "vlm", "Gemma3ForConditionalGeneration", "Gemma3Config", vision=dict(model_type="siglip_vision_model"),
       text=dict(model_type="gemma3_text", sliding_window=256), mm_tokens_per_image=4),
    _a("paligemma", "vlm", "PaliGemmaForConditionalGeneration", "PaliGemmaConfig",
       vision=dict(model_type="siglip_vision_model"), text=dict(model_type="gemma")),
    _a("aya-vision", "vlm", "AyaVisionForConditionalGeneration", "AyaVisionConfig",
       vision=dict(model_type="siglip_vision_model"), text=dict(model_type="cohere2", sliding_window=256)),
    _a("internvl", "vlm", "InternVLForConditionalGeneration", "InternVLConfig",
       vision=dict(model_type="internvl_vision"), text=dict(model_type="qwen2")),
    _a("idefics3", "vlm", "Idefics3ForConditionalGeneration", "Idefics3Config",
       vision=dict(model_type="idefics3_vision"), text=dict(model_type="llama")),
)

_BY_NAME = {arch.name: arch for arch in ARCHITECTURES}


def _architecture(name: str) -> Architecture:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UsageError(f"unknown zoo architecture {name!r}; known: {', '.join(_BY_NAME)}") from None


def _transformers_class(arch: Architecture, attribute: str) -> Any:
    import transformers

    try:
        return getattr(transformers, attribute)
    except (AttributeError, ImportError, RuntimeError) as error:
        raise ArchitectureUnavailable(
            f"{arch.name}: transformers {transformers.__version__} has no {attribute} ({type(error).__name__})",
            reason=f"transformers has no {attribute}") from None


def _accepted(config_class: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``values`` that ``config_class`` declares (as a field, an ``__init__`` parameter or
    an attribute alias): configs differ in names and some reject unknown arguments."""
    names: set[str] = set()
    if dataclasses.is_dataclass(config_class):
        names.update(field.name for field in dataclasses.fields(config_class))
    names.update(inspect.signature(config_class.__init__).parameters)
    names.update(getattr(config_class, "attribute_map", {}) or {})
    return {key: value for key, value in values.items() if key in names}


def _sub_config(model_type: str | None, values: Mapping[str, Any], default_class: type | None) -> Any:
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type] if model_type else default_class
    return config_class(**_accepted(config_class, values))


def _config(arch: Architecture) -> Any:
    config_class = _transformers_class(arch, arch.config_class)
    if arch.family != "vlm":
        return config_class(**_accepted(config_class, {**_TEXT, **_MOE_DEFAULTS_OFF, **arch.overrides}))
    text_overrides = dict(arch.text or {})
    vision_overrides = dict(arch.vision or {})
    text_type, vision_type = text_overrides.pop("model_type", None), vision_overrides.pop("model_type", None)
    sub_classes = getattr(config_class, "sub_configs", {}) or {}
    text = _sub_config(text_type, {**_TEXT, **text_overrides}, sub_classes.get("text_config"))
    vision = _sub_config(vision_type, {**_VISION, **vision_overrides}, sub_classes.get("vision_config"))
    top = _accepted(config_class, {"image_token_id": VOCAB_SIZE - 1, "image_token_index": VOCAB_SIZE - 1,
                                   "tie_word_embeddings": False, **arch.overrides})
    return config_class(text_config=text, vision_config=vision, **top)


# Families other than moe get no expert counts (some dense configs would take them and build experts).
_MOE_DEFAULTS_OFF: dict[str, Any] = {}


def architecture(name: str) -> Architecture:
    """The zoo entry called ``name``."""
    return _architecture(name)


def text_config_of(model: nn.Module) -> Any:
    """The config of the text stack (the model's own config for text-only models)."""
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


def _set_experts_implementation(model_class: type, config: Any, name: str) -> str | None:
    """Ask for ``name`` where the model's experts dispatch through transformers' experts interface;
    None where they do not (their own routing runs whatever is asked: jetmoe, phimoe, dbrx)."""
    can_set = getattr(model_class, "_can_set_experts_implementation", None)
    if can_set is None or not can_set():
        return None
    config._experts_implementation = name  # transformers' setter passes it on to sub-configs
    return name


def build_architecture(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                       device: torch.device | str = "cpu", experts: str | None = None) -> nn.Module:
    """Tiny random model of architecture ``name``: weights depend only on ``seed``; eval mode, frozen,
    eager attention (the packed block-diagonal mask is an additive 4D mask). MoE and hybrid stacks
    run their experts with ``experts`` (see :func:`experts_implementation`); ``model.zoo_experts``
    says what was set (None where the model has no experts interface)."""
    arch = _architecture(name)
    model_class = _transformers_class(arch, arch.model_class)
    experts = experts_implementation(experts)
    try:
        config = _config(arch)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise ArchitectureUnavailable(f"{name}: cannot build a tiny {arch.config_class}: {error}",
                                      reason=f"cannot build a tiny {arch.config_class}") from None
    config._attn_implementation = "eager"
    for key in ("text_config", "vision_config"):
        sub = getattr(config, key, None)
        if sub is not None:
            sub._attn_implementation = "eager"
    chosen_experts = (_set_experts_implementation(model_class, config, experts)
                      if arch.family in ("moe", "hybrid") else None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = model_class(config)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            # e.g. transformers 5.24's DbrxAttention reads attn_config.rope_theta, which its config lacks
            import transformers

            raise ArchitectureUnavailable(
                f"{name}: transformers {transformers.__version__} cannot build {arch.model_class} from its own "
                f"config: {type(error).__name__}: {error}",
                reason=f"transformers cannot build {arch.model_class} from its own config") from None
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    model.zoo_name = name
    model.zoo_family = arch.family
    model.zoo_layout = arch.layout
    model.zoo_experts = chosen_experts
    return model
