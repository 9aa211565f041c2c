"""Stand-in (harness .ci/gpu/extract-sglang) for the torch.compile piecewise backend's package (the real one
imports torch.compile's piecewise backend). set_tc_piecewise_forward_context publishes the layers and batch for
piecewise-compiled graphs, which the breakable backend does not run; here it publishes nothing."""

from contextlib import contextmanager

TCPCG_FAILURE_HINT = "(stand-in: the torch.compile piecewise backend's hints)\n"


@contextmanager
def set_tc_piecewise_forward_context(forward_batch, attention_layers, quant_config, moe_layers, moe_fusions,
                                     dsa_indexers=None, mha_companion_layers=None, num_tokens=None,
                                     raw_num_tokens=None, full_graph=False):
    yield
