"""Stand-in (harness .ci/gpu/extract-sglang): diffusion LLM configuration, read by the decode runner only."""

from sglang_standin import unreached

DllmConfig = unreached("DllmConfig")
