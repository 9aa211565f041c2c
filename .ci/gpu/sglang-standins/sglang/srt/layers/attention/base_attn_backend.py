"""Stand-in (harness .ci/gpu/extract-sglang) for the attention backends' base module, which the runner imports for
the type SharedReadEnds only (annotations); the harness's stand-in attention backend is in sglang_runner_standins."""

from sglang_standin import unreached

SharedReadEnds = unreached("SharedReadEnds")
