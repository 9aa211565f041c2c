"""Stand-in (harness .ci/gpu/extract-sglang): context parallelism is off on one GPU."""

from sglang_standin import returns

is_cp_active = returns(False)
is_mla_cp_enabled = returns(False)
