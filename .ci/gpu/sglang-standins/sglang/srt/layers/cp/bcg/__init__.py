"""Stand-in (harness .ci/gpu/extract-sglang): breakable-graph context parallelism is off on one GPU."""

from sglang_standin import returns

supports_prefill_cp_bcg = returns(False)
