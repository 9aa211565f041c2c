"""Stand-in (harness .ci/gpu/extract-sglang) for SGLang's Triton KV-index kernels: only the full backend's
chunked-prefix capture uses them."""

from sglang_standin import unreached

create_chunked_prefix_cache_kv_indices = unreached("create_chunked_prefix_cache_kv_indices")
