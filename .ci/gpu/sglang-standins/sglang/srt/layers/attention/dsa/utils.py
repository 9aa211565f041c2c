"""Stand-in (harness .ci/gpu/extract-sglang): DeepSeek sparse attention's prefill context parallelism is off."""

from sglang_standin import returns

is_dsa_enable_prefill_cp = returns(False)
