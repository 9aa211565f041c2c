"""The compiled gather of speculative-decoding extras: oracle, reference, relay and accounting.

The contract every gather implementation must meet (the suites in ``suites/gather`` check it):

* Called as ``gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)``,
  it returns ``(topk_p, topk_index, bonus_tokens, hidden_states)``, each ``buf[indices]``: bit-identical
  to eager advanced indexing (a gather is a copy), same dtype, shape ``(len(indices), *buf.shape[1:])``.
* ``indices`` is 1-D, int32 or int64, any length (0 included, duplicates allowed), with values in
  ``[-pool, pool)`` where ``pool = buf.shape[0]``; negative values wrap as in Python indexing.
* Indices and sources may have any memory layout (strided, sliced, offset views); a source may have
  any trailing shape and any dtype (bf16, fp16, float8 where the build has it, bool, integers, ...).
* Outputs are new tensors that alias no source; sources are never modified.
* ``hidden_states_buf=None`` (hidden states not captured) gives ``hidden_states=None``.
* An index outside ``[-pool, pool)`` must raise (a device-side assert counts), never return made-up data.

Contents: :func:`eager_gather` (the oracle), :func:`compiled_gather` (the reference, one
``torch.compile(dynamic=True)`` function), :class:`SpecExtrasRelay` (a FutureMap-style relay),
:mod:`harness.gather.accounting` (compile and launch counts), :mod:`harness.gather.probe`
(crash-prone cases in a child process); the benchmark is :mod:`harness.bench.gather`.
"""

from harness.gather.accounting import (
    COMPILED_GRAPH_BUDGET,
    CompileTally,
    LaunchCount,
    compile_accounting,
    count_launches,
    open_recompile_limit,
)
from harness.gather.candidate import PROMISE_ATTRIBUTE, promised_launches, validate_gather
from harness.gather.cases import BufferSpec, GatherCase, GatherInputs, gather_dtypes
from harness.gather.reference import BUFFER_NAMES, OUTPUT_NAMES, GatherOutputs, compiled_gather, eager_gather
from harness.gather.relay import SENTINEL, ResolvedExtras, SpecExtrasRelay

__all__ = [
    "eager_gather",
    "compiled_gather",
    "GatherOutputs",
    "BUFFER_NAMES",
    "OUTPUT_NAMES",
    "SpecExtrasRelay",
    "ResolvedExtras",
    "SENTINEL",
    "validate_gather",
    "promised_launches",
    "PROMISE_ATTRIBUTE",
    "GatherCase",
    "BufferSpec",
    "GatherInputs",
    "gather_dtypes",
    "COMPILED_GRAPH_BUDGET",
    "CompileTally",
    "compile_accounting",
    "open_recompile_limit",
    "LaunchCount",
    "count_launches",
]
