"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.runtime_context, which holds the launched server's
parsed arguments, parallel groups, streams and graph memory pool (set up by the engine's launch).

Answers as a one-GPU server (TP/PP/DP/CP 1) started with ``--cuda-graph-backend-prefill breakable``,
``--enable-return-hidden-states`` and the runner's buckets as the prefill token shapes
(:func:`configure_prefill_buckets`, called by the harness's adapter before it builds a runner); every other
setting is SGLang's default for it."""

from contextlib import nullcontext
from types import SimpleNamespace

import torch

_PREFILL = SimpleNamespace(backend="breakable", bs=None, max_bs=None, max_context_size=None, max_seq_len=None,
                           full_prefill_max_req=None, full_prefill_prefix_chunk_tokens=None)
_DECODE = SimpleNamespace(bs=[])  # the prefill runner captures no decode shapes
_EXEC = SimpleNamespace(
    graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(prefill=_PREFILL, decode=_DECODE),
                          enable_cudagraph_gc=False, debug_cuda_graph=False, torch_compile_max_bs=0),
    features=SimpleNamespace(enable_memory_saver=False, return_hidden_states_mode=None,
                             enable_return_hidden_states=True, enable_encoder_swa_bounded_replay=False),
    mamba=SimpleNamespace(enable_mamba_extra_buffer=False),
    comm=SimpleNamespace(flashinfer_allreduce_fusion_backend=None),
    overlap=SimpleNamespace(enable_two_batch_overlap=False),
)
_FLAGS = SimpleNamespace(
    dp=SimpleNamespace(capturing_prefill_graph=False, prefill_graph_has_dp_gather=False,
                       prefill_graph_has_rank_barrier=False),
    capture=SimpleNamespace(enable_torch_compile=False, disable_dispose_tensor=False),
)


class _Group:
    pcie_ipc_comm = None

    def barrier(self):
        return None


_PARALLEL = SimpleNamespace(tp_group=_Group(), tp_rank=0, num_dp_ranks=1, pp_size=1, pp_rank=0, attn_tp_size=1,
                            attn_dp_enabled=False, attn_cp_size=1, cp_strategy=None, dcp_enabled=False,
                            dcp_comm_backend=None, dcp_group=None)
_RESOURCE_DEFAULTS = {"graph_memory_pool": None, "graph_pool_borrow": None}  # Resources' defaults
_RESOURCES = SimpleNamespace(**_RESOURCE_DEFAULTS)
_STREAMS = {}


def configure_prefill_buckets(buckets):
    """A server launch for one runner: the prefill token shapes SGLang captures (``--cuda-graph-bs-prefill``), and
    the launch's own resources (a graph memory pool of its own). A server builds its prefill runner once; the
    harness builds one per test, and a runner built after an earlier one was freed would otherwise capture into
    the pool of graphs that no longer exist, which PyTorch's caching allocator refuses (an internal assert
    ``use_count > 0`` at capture_begin)."""
    _PREFILL.bs = list(buckets)
    vars(_RESOURCES).update(_RESOURCE_DEFAULTS)


def get_exec():
    return _EXEC


def get_flags():
    return _FLAGS


def get_parallel():
    return _PARALLEL


def get_memory():
    return SimpleNamespace(disable_radix_cache=False)


def get_schedule():
    return SimpleNamespace(enable_mixed_chunk=False, disable_chunked_prefix_cache=True, chunked_prefill_size=None)


def get_disagg():
    return SimpleNamespace(enable_pdmux=False, disaggregation_mode="null")


def get_resources():
    return _RESOURCES


def get_stream(name):
    # SGLang keeps one named stream per process (the graph capture stream among them).
    if name not in _STREAMS:
        _STREAMS[name] = torch.cuda.Stream()
    return _STREAMS[name]


class _Model:
    def override(self, **layout):
        return nullcontext()


def get_model():
    return _Model()
