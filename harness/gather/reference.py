"""The eager oracle (:func:`eager_gather`, the definition) and the compiled reference gather.

The reference is one ``torch.compile(dynamic=True)`` function, so the four gathers can share launches;
it must be bit-identical to the oracle."""

from __future__ import annotations

import torch

__all__ = ["GatherOutputs", "eager_gather", "compiled_gather", "BUFFER_NAMES", "OUTPUT_NAMES"]

GatherOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]

# Argument and result names, in call order; failure messages and reports use them.
BUFFER_NAMES = ("topk_p_buf", "topk_index_buf", "output_tokens_buf", "hidden_states_buf")
OUTPUT_NAMES = ("topk_p", "topk_index", "bonus_tokens", "hidden_states")


def _gather_extras(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
) -> GatherOutputs:  # pragma: no mutate block
    # Not mutated by `python -m harness mutate` (docs/mutation.md): mutmut's dispatcher inside the compiled function
    # would break its graph, and this body is the oracle's too, so a mutation here changes the oracle alike.
    hidden_states = None if hidden_states_buf is None else hidden_states_buf[indices]
    return topk_p_buf[indices], topk_index_buf[indices], output_tokens_buf[indices], hidden_states


def eager_gather(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
) -> GatherOutputs:
    """The oracle: plain advanced indexing, one ``buf[indices]`` per buffer."""
    return _gather_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)


# dynamic=True: the index count changes at every decode step; one graph must serve all of them
# (dynamo still specialises counts 0 and 1, see COMPILED_GRAPH_BUDGET in harness.gather.accounting).
_compiled = torch.compile(_gather_extras, dynamic=True)


def compiled_gather(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
) -> GatherOutputs:
    """The reference: the four gathers in one ``torch.compile(dynamic=True)`` function."""
    return _compiled(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
