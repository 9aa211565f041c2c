"""Stand-in (harness .ci/gpu/extract-sglang): DeepGEMM's JIT is off (no FP8 GEMMs in the zoo)."""

ENABLE_JIT_DEEPGEMM = False
