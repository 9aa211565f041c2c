"""Stand-in (harness .ci/gpu/extract-sglang) for set_graph_pool_id of SGLang's PyNccl symmetric-memory allocator:
it tells the NCCL allocator which graph pool to use; one GPU runs no NCCL."""


def set_graph_pool_id(pool_id):
    return None
