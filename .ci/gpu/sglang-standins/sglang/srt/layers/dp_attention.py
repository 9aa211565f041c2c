"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.layers.dp_attention, whose setters record the DP
gather buffer's length for data-parallel attention; without DP attention nothing reads them."""

from enum import IntEnum, auto


class DpPaddingMode(IntEnum):
    MAX_LEN = auto()
    SUM_LEN = auto()

    def is_max_len(self):
        return self == DpPaddingMode.MAX_LEN

    def is_sum_len(self):
        return self == DpPaddingMode.SUM_LEN

    @classmethod
    def get_default_mode_in_cuda_graph(cls):
        return cls.MAX_LEN


def dp_slot_in(global_num_tokens):
    return 0


def set_dp_buffer_len(global_dp_buffer_len, local_dp_buffer_len, dp_max_padding, global_num_tokens=None):
    return None


def set_is_extend_in_batch(is_extend_in_batch):
    return None
