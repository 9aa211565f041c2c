"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.constants (the full backend's memory-type tag)."""

GPU_MEMORY_TYPE_CUDA_GRAPH = "cuda_graph"
