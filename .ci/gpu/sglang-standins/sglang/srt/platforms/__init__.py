"""Stand-in (harness .ci/gpu/extract-sglang) for SGLang's platform registry: the in-tree CUDA platform."""

from types import SimpleNamespace

current_platform = SimpleNamespace(is_out_of_tree=lambda: False)
