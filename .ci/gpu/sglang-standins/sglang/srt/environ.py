"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.environ (the real module declares every SGLANG_*
variable and imports the runtime): the variables the runner's control path reads, with the release's defaults
(all ``EnvBool(False)`` in 0.5.23), read from the environment as SGLang reads them."""

import os


class _EnvBool:
    def __init__(self, name, default):
        self.name, self.default = name, default

    def get(self):
        value = os.environ.get(self.name)
        return self.default if value is None else value.strip().lower() in ("1", "true", "yes", "y")


class _Envs:
    SGLANG_ENABLE_CUDA_GRAPH_DEDUP = _EnvBool("SGLANG_ENABLE_CUDA_GRAPH_DEDUP", False)
    SGLANG_ENABLE_GRAPH_POOL_BORROW = _EnvBool("SGLANG_ENABLE_GRAPH_POOL_BORROW", False)
    SGLANG_ENABLE_GRAPH_POOL_PRECARVE = _EnvBool("SGLANG_ENABLE_GRAPH_POOL_PRECARVE", False)
    SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE = _EnvBool("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", False)
    SGLANG_PP_PARALLEL_DEEPGEMM_WARMUP = _EnvBool("SGLANG_PP_PARALLEL_DEEPGEMM_WARMUP", False)


envs = _Envs()
