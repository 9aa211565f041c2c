"""Stand-in (harness .ci/gpu/extract-sglang): AMD's aiter chip-info pre-warming is a no-op off ROCm."""


def maybe_pre_warm_aiter_chip_info():
    return None
