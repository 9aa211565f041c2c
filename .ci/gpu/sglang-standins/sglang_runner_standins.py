"""Stand-ins (harness .ci/gpu/extract-sglang) for the engine objects SGLang 0.5.23's PrefillCudaGraphRunner is
built on and the data-path methods that read them, so that its control path runs unchanged on the harness's zoo
models: ``__init__`` (layer-stack discovery, backend choice, capture), ``capture`` -> ``capture_one_shape`` ->
``BreakableCudaGraphBackend.capture_one``, ``_run_forward``, ``can_run_graph``/``can_replay_locally``, ``execute``
-> ``_execute_body_capture`` and the output trimming.

- ModelRunner: sglang.srt.model_executor.model_runner.ModelRunner (loads the model, owns the KV pools and the
  attention backend): here the zoo model on one GPU, no LoRA, no speculative decoding, no pipeline stages.
- AttentionBackend: SGLang's attention backends, whose forward metadata the runner prepares before capture and
  replay: the zoo's attention reads the request boundaries of the live batch itself (the forward context its
  model's forward publishes), so there is no metadata to prepare.
- PrefillCudaGraphRunner, a subclass of SGLang's, replacing three methods: ``load_batch`` (pads to the bucket and
  fills the static buffers: SGLang's reads its ForwardBatch's KV-pool and sampling fields, which the harness's
  batch lacks), ``_finalize_execute_output`` (SGLang's trims its LogitsProcessorOutput; the zoo returns the
  harness's LogitsOutput: converted, trimmed by SGLang's own ``_trim_logits_output``, converted back) and
  ``model_context`` (DeepSeek's shared-experts layout, which the zoo's models do not have).
Each says so to the harness's conformance report when a test reaches it."""

import dataclasses
from contextlib import nullcontext
from types import SimpleNamespace

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner as _SGLangRunner
from sglang.srt.runtime_context import configure_prefill_buckets
from sglang_standin import reached

from harness.models.transformers_zoo import text_config_of

__all__ = ["AttentionBackend", "ModelRunner", "PrefillCudaGraphRunner", "configure_prefill_buckets"]

# A server's request pool: more request slots than any suite's batch has requests (padding requests included).
REQUEST_SLOTS = 4096
CONTEXT_LENGTH = 1 << 20

_LOAD_BATCH = ("PrefillCudaGraphRunner.load_batch (the harness's stand-in: pad to the bucket, fill the static "
               "input buffers, refresh attention metadata)")
_OUTPUT = ("PrefillCudaGraphRunner._finalize_execute_output (the harness's LogitsOutput through SGLang's "
           "_trim_logits_output)")


class AttentionBackend:
    dllm_attention = None
    prefill_cuda_graph_default_max_seq_len = None
    supports_prefill_cuda_graph_max_context_size = False
    use_captured_forward_metadata_for_breakable_cuda_graph = False
    skips_prefill_metadata_on_idle_dp_rank = False

    def init_forward_metadata(self, forward_batch):
        return None

    def resolve_prefill_shared_read_ends(self, forward_batch, *, num_qo_tokens, build_snapshot):
        return None


def _nothing(*args, **kwargs):
    return None


class ModelRunner:
    def __init__(self, model):
        # The text model's settings: a multimodal model's config (LlavaConfig) keeps them in its text config.
        config = text_config_of(model)
        parameter = next(model.parameters())
        self.model = model
        self.device = "cuda"
        self.gpu_id = parameter.device.index or 0
        self.dtype = parameter.dtype
        self.attn_backend = AttentionBackend()
        # The harness's VLM-style wrapper (a text model at language_model) is what SGLang's multimodal models are.
        self.model_config = SimpleNamespace(
            is_multimodal=hasattr(model, "language_model") or config is not model.config,
            hidden_size=config.hidden_size, vocab_size=config.vocab_size, context_len=CONTEXT_LENGTH,
            hf_config=SimpleNamespace(model_type="harness-zoo"))
        self.lora_manager = None
        self.is_generation = True
        self.is_draft_worker = False
        self.spec_algorithm = SimpleNamespace(is_eagle=lambda: False, is_eagle3=lambda: False,
                                              is_dflash_family=lambda: False, is_speculative=lambda: False)
        self.req_to_token_pool = SimpleNamespace(size=REQUEST_SLOTS,
                                                 req_to_token=SimpleNamespace(shape=(REQUEST_SLOTS, CONTEXT_LENGTH)))
        self.pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True)
        self.attention_layers, self.mha_companion_layers, self.moe_layers, self.moe_fusions = [], [], [], []
        self.server_args = SimpleNamespace()
        self.graph_shared_output = None
        self.kv_index_translator = SimpleNamespace(bind_runner_slots=_nothing)
        self.ngram_embedding_manager = SimpleNamespace(enabled=False)
        # BaseRunner.warmup runs once per model runner, for the decode and prefill runners together; its kernel
        # workspaces (FlashInfer, all-reduce fusion) are not used by the zoo.
        self._kernel_warmed_up = True

    def get_pp_proxy_topk_size(self):
        return None

    def get_pp_proxy_residual_num_blocks(self):
        return None

    def get_pp_proxy_dspark_hidden_size(self):
        return None

    def attn_tp_sequence_sharded(self, num_tokens):
        return False

    def prepare_dummy_forward_batch(self, forward_batch):
        return forward_batch


class PrefillCudaGraphRunner(_SGLangRunner):
    def model_context(self):
        return nullcontext()

    def load_batch(self, forward_batch, **kwargs):
        reached(_LOAD_BATCH)
        num_tokens = len(forward_batch.input_ids)
        static_num_tokens = self._pad_to_bucket(num_tokens, self.capture_num_tokens)
        self.raw_num_tokens = num_tokens
        self.raw_bs = forward_batch.batch_size
        registry = self.buffer_registry
        registry.fill_from(forward_batch, raw_bs=self.raw_bs, padded_bs=self.raw_bs, raw_num_tokens=num_tokens,
                           padded_num_tokens=static_num_tokens, pp_proxy_tensors=kwargs.get("pp_proxy_tensors"))

        def slot(name):
            return registry.get_slot(name).slice_for(self.raw_bs, static_num_tokens)

        padded = forward_batch.padded_to(static_num_tokens)
        static_forward_batch = dataclasses.replace(padded, input_ids=slot("input_ids"), positions=slot("positions"))
        static_forward_batch.out_cache_loc = slot("out_cache_loc")
        if registry.has_slot("input_embeds"):
            static_forward_batch.input_embeds = slot("input_embeds")
        shape_key = self._shape_key(static_num_tokens, forward_batch)
        shared_read_ends = self._prepare_forward_metadata_for_replay(forward_batch, static_forward_batch, shape_key)
        return static_forward_batch, shared_read_ends

    def _finalize_execute_output(self, output):
        if not (dataclasses.is_dataclass(output) and hasattr(output, "next_token_logits")):
            return super()._finalize_execute_output(output)
        reached(_OUTPUT)
        trimmed = super()._finalize_execute_output(
            LogitsProcessorOutput(next_token_logits=output.next_token_logits, hidden_states=output.hidden_states))
        return dataclasses.replace(output, next_token_logits=trimmed.next_token_logits,
                                   hidden_states=trimmed.hidden_states)
