"""Stand-in (harness .ci/gpu/extract-sglang): no speculative decoding."""

from sglang_standin import unreached

create_dummy_verify_input = unreached("create_dummy_verify_input")
