"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.model_executor.cuda_graph_buffer_registry: the static
token-axis buffers captured graphs read (same addresses at capture and replay), and ``fill_from``, which copies a
live batch into them before a replay.

Holds the slots the zoo's models read: ``input_ids``, ``positions`` and ``out_cache_loc`` (int64, ``max_num_token``
rows), and ``input_embeds`` (``[max_num_token, hidden_size]``) where the runner registers it (a multimodal model).
``fill_from`` copies ``input_ids`` and ``positions`` into the first ``raw_num_tokens`` rows and zeroes the padded
tail up to ``padded_num_tokens``, as SGLang's padding policy for those slots does (``input_embeds`` is filled by the
runner's own ``_fill_input_embeds_slot``)."""

import torch
from sglang_standin import reached

_NAME = ("sglang.srt.model_executor.cuda_graph_buffer_registry (the static input buffers and their refill from a "
         "live batch)")


class _Slot:
    def __init__(self, buffer):
        self.buffer = buffer

    def slice_for(self, bs, num_tokens):
        return self.buffer[:num_tokens]


class CudaGraphBufferRegistry:
    def __init__(self, slots):
        self._slots = slots

    def has_slot(self, name):
        return name in self._slots

    def get_slot(self, name):
        return self._slots[name]

    def fill_from(self, forward_batch, *, raw_bs, padded_bs, raw_num_tokens, padded_num_tokens,
                  pp_proxy_tensors=None):
        reached(_NAME)
        for name in ("input_ids", "positions"):
            buffer = self._slots[name].buffer
            buffer[:raw_num_tokens].copy_(getattr(forward_batch, name)[:raw_num_tokens])
            buffer[raw_num_tokens:padded_num_tokens].zero_()


def build_prefill_registry(*, device, max_bs, max_num_token, cache_loc_dtype, is_multimodal, hidden_size,
                           embed_dtype, register_input_embeds=False, **options):
    with torch.device(device):
        slots = {
            "input_ids": _Slot(torch.zeros((max_num_token,), dtype=torch.int64)),
            "positions": _Slot(torch.zeros((max_num_token,), dtype=torch.int64)),
            "out_cache_loc": _Slot(torch.zeros((max_num_token,), dtype=cache_loc_dtype)),
        }
        if register_input_embeds:
            slots["input_embeds"] = _Slot(torch.zeros((max_num_token, hidden_size), dtype=embed_dtype))
    return CudaGraphBufferRegistry(slots)
