"""Stand-in (harness .ci/gpu/extract-sglang): torch.compile is off for the breakable backend."""

from sglang_standin import unreached

set_torch_compile_config = unreached("set_torch_compile_config")
