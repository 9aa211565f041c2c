"""The compiled gather of speculative-decoding extras: oracle, reference, relay and accounting.

Safe to use: :func:`eager_gather` (the oracle), :func:`compiled_gather` (the reference),
:class:`SpecExtrasRelay`, :mod:`harness.gather.accounting` and :mod:`harness.gather.probe`. The
contract every implementation must meet is in ``docs/gather.md``."""

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
