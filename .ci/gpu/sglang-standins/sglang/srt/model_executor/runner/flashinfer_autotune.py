"""Stand-in (harness .ci/gpu/extract-sglang): FlashInfer autotuning is not run (no FlashInfer kernels in the zoo)."""

from sglang_standin import returns, unreached

should_run_flashinfer_autotune = returns(False)
maybe_flashinfer_autotune_extend = unreached("maybe_flashinfer_autotune_extend")
run_flashinfer_autotune_forward = unreached("run_flashinfer_autotune_forward")
