"""Stand-in (harness .ci/gpu/extract-sglang): breakable-graph context parallelism, not reached on one GPU."""

from sglang_standin import unreached

PrefillCPBCGInput = unreached("PrefillCPBCGInput")
execute_prefill_cp_bcg = unreached("execute_prefill_cp_bcg")
filter_prefill_cp_bcg_capture_num_tokens = unreached("filter_prefill_cp_bcg_capture_num_tokens")
