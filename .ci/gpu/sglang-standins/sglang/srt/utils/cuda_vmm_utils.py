"""Stand-in (harness .ci/gpu/extract-sglang): the graph pool's borrow arena (SGLANG_ENABLE_GRAPH_POOL_BORROW, off)."""

from sglang_standin import unreached

BumpArenaStub = unreached("BumpArenaStub")
