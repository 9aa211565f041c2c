"""Stand-in (harness .ci/gpu/extract-sglang): the package only (context parallelism is off on one GPU)."""
