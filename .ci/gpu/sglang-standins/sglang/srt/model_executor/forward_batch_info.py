"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.model_executor.forward_batch_info, whose ForwardBatch
carries a scheduled batch through the engine (its KV pools, sampling and speculative state; the real module
imports most of the runtime).

ForwardBatch here is the harness's batch (what the zoo's models read: packed tokens, request boundaries, hidden
mode) with SGLang's attribute names on top, so SGLang's runner and the zoo's models read one object. Built with
SGLang's keywords (as PrefillCudaGraphRunner.capture_prepare builds its dummy batch), the request lengths come
from ``extend_seq_lens_cpu``, the hidden mode from ``capture_hidden_mode``, and the other keywords become
attributes; SGLang's device tensor ``seq_lens`` is not kept (the harness's ``seq_lens`` are the request lengths).
CaptureHiddenMode, ForwardMode and get_server_return_hidden_states_mode are SGLang's, copied from the release."""

import dataclasses
from enum import IntEnum, auto

import torch
from sglang.srt.layers.dp_attention import DpPaddingMode
from sglang.srt.runtime_context import get_exec
from sglang_standin import returns, unreached

from harness.batch import ForwardBatch as HarnessBatch
from harness.batch import HiddenMode, request_offsets


class CaptureHiddenMode(IntEnum):
    NULL = 0
    LAST = 1
    FULL = 2

    def need_capture(self):
        return self != CaptureHiddenMode.NULL

    def is_full(self):
        return self == CaptureHiddenMode.FULL

    def is_last(self):
        return self == CaptureHiddenMode.LAST

    def __lt__(self, other):
        return self.value < other.value


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()

    def is_target_verify(self):
        return self == ForwardMode.TARGET_VERIFY

    def is_extend(self):
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)


def get_server_return_hidden_states_mode():
    features = get_exec().features
    mode = features.return_hidden_states_mode
    if mode == "last":
        return CaptureHiddenMode.LAST
    if mode == "full" or features.enable_return_hidden_states:
        return CaptureHiddenMode.FULL
    return CaptureHiddenMode.NULL


PPProxyTensors = unreached("PPProxyTensors")
NgramEmbeddingInfo = unreached("NgramEmbeddingInfo")
compute_local_num_token_non_padded = unreached("compute_local_num_token_non_padded")
enable_num_token_non_padded = returns(False)
prefill_graph_tolerates_sum_len = returns(False)

_TO_HIDDEN = {CaptureHiddenMode.NULL: HiddenMode.NONE, CaptureHiddenMode.LAST: HiddenMode.LAST,
              CaptureHiddenMode.FULL: HiddenMode.FULL}
_FROM_HIDDEN = {hidden: capture for capture, hidden in _TO_HIDDEN.items()}
_HARNESS_FIELDS = frozenset(field.name for field in dataclasses.fields(HarnessBatch))
# Derived from the harness's fields (properties below): not stored from SGLang's keywords.
_DERIVED = frozenset({"batch_size", "capture_hidden_mode", "extend_seq_lens_cpu", "extend_prefix_lens_cpu"})


class ForwardBatch(HarnessBatch):
    # SGLang's fields the runner's control path reads, at the values of a text-only extend batch of one rank.
    forward_mode = ForwardMode.EXTEND
    global_forward_mode = ForwardMode.EXTEND
    input_embeds = None
    replace_embeds = None
    mrope_positions = None
    mm_inputs = None
    mm_input_embeds = None
    spec_info = None
    spec_algorithm = None
    lora_ids = None
    return_logprob = False
    return_pooled_hidden_states = False
    global_num_tokens_cpu = None
    global_num_tokens_gpu = None
    global_num_tokens_for_logprob_cpu = None
    global_dp_buffer_len = None
    dp_padding_mode = DpPaddingMode.MAX_LEN
    num_token_non_padded = None
    moe_num_token_non_padded = None
    attn_tp_sequence_sharded = False
    max_seq_len_override = None
    can_run_dp_prefill_cuda_graph = True

    def __init__(self, *args, **kwargs):
        if args or "forward_mode" not in kwargs:  # the harness's constructor (dataclasses.replace, from_harness)
            super().__init__(*args, **kwargs)
            return
        lengths = tuple(int(n) for n in kwargs["extend_seq_lens_cpu"])
        input_ids = kwargs["input_ids"]
        starts, last = request_offsets(lengths)
        super().__init__(input_ids, kwargs["positions"], lengths, starts, torch.tensor(last, device=input_ids.device),
                         _TO_HIDDEN[CaptureHiddenMode(kwargs["capture_hidden_mode"])], False, {},
                         input_ids.shape[0] - sum(lengths))
        for name, value in kwargs.items():
            if name not in _HARNESS_FIELDS and name not in _DERIVED:
                object.__setattr__(self, name, value)

    @classmethod
    def from_harness(cls, batch):
        """The harness's ``batch`` as SGLang's runner sees it (a new object; ``batch`` is not changed)."""
        return cls(**{field: getattr(batch, field) for field in _HARNESS_FIELDS})

    @property
    def batch_size(self):
        return self.num_requests

    @property
    def capture_hidden_mode(self):
        return _FROM_HIDDEN[self.hidden_mode]

    @property
    def extend_seq_lens_cpu(self):
        return list(self.seq_lens)

    @property
    def extend_prefix_lens_cpu(self):
        return [0] * self.num_requests

    def contains_mm_inputs(self):
        return False
