"""Stand-in (harness .ci/gpu/extract-sglang) for LogitsProcessorOutput of sglang.srt.layers.logits_processor (the
real module imports the sampling and DP-attention machinery): the dataclass with the fields the runner's
``_trim_logits_output`` passes, each ``None`` unless given."""

from dataclasses import dataclass
from typing import Any


@dataclass
class LogitsProcessorOutput:
    next_token_logits: Any = None
    hidden_states: Any = None
    last_hidden_states: Any = None
    input_token_logprobs: Any = None
    input_top_logprobs_val: Any = None
    input_top_logprobs_idx: Any = None
    input_token_ids_logprobs_val: Any = None
    input_token_ids_logprobs_idx: Any = None
    input_logprobs_copy_done: Any = None
    customized_info: Any = None
    mm_input_embeds: Any = None
    hidden_states_token_indices: Any = None
