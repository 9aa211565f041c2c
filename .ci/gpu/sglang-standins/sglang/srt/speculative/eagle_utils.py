"""Stand-in (harness .ci/gpu/extract-sglang): no speculative decoding (not an EAGLE draft worker)."""

from sglang_standin import unreached

get_draft_input_from_target_hidden_dim = unreached("get_draft_input_from_target_hidden_dim")
