"""Compile accounting: a decode-step stream of index counts compiles a bounded number of graphs.

After ``torch._dynamo.reset()``, a stream of index counts (0, 1, 2, 3, 17, 777, ...) with and without
hidden states, under dynamo's default recompile limit, must compile at most
:data:`~harness.gather.COMPILED_GRAPH_BUDGET` graphs, never fall back to eager (a failed frame, a graph
break, or the recompile limit), and a second pass over the same stream must compile nothing. The
reference's exact counts are a golden per torch minor version (``golden/gather/test_compile/``).
"""

from __future__ import annotations

import pytest
import torch

from harness.gather import COMPILED_GRAPH_BUDGET, GatherCase, compile_accounting
from harness.golden import assert_upstream_golden

pytestmark = pytest.mark.clause("compile-bounded")

_COUNTS = (0, 1, 2, 3, 17, 777, 5, 1, 0, 2048, 64, 1023, 3)
_DEFAULT_RECOMPILE_LIMIT = 8  # dynamo's default: what an engine runs with


def _run_stream(check_gather, case, inputs, device, *, generator: torch.Generator, rounds: str) -> None:
    pool = case.pool
    described = {key: value for key, value in case.describe().items() if key != "indices"}
    for with_hidden in (True, False):
        buffers = inputs.buffers if with_hidden else (*inputs.buffers[:3], None)
        for count in _COUNTS:
            indices = torch.randint(0, pool, (count,), generator=generator).to(device)
            try:
                check_gather.args(indices, *buffers, **described, stream=rounds, index_count=count,
                                  with_hidden=with_hidden)
            except Exception as error:
                if type(error).__name__ != "FailOnRecompileLimitHit":
                    raise
                raise AssertionError(
                    f"the candidate hit dynamo's recompile limit ({_DEFAULT_RECOMPILE_LIMIT}) at index count {count} "
                    f"(with_hidden={with_hidden}, {rounds} pass): in an engine it would silently run eagerly from "
                    "here on") from error


def test_index_count_stream_compiles_a_bounded_number_of_graphs(check_gather, implementation_under_test, device,
                                                                snapshot):
    candidate_name = implementation_under_test("gather").name
    torch._dynamo.reset()  # count this candidate's graphs only, whatever ran before in this process
    case = GatherCase(pool=1024, count=0, seed=9)
    inputs = case.build(device)
    generator = torch.Generator().manual_seed(9)
    with compile_accounting(recompile_limit=_DEFAULT_RECOMPILE_LIMIT) as first:
        _run_stream(check_gather, case, inputs, device, generator=generator, rounds="first")
    with compile_accounting(recompile_limit=_DEFAULT_RECOMPILE_LIMIT) as second:
        _run_stream(check_gather, case, inputs, device, generator=generator, rounds="second")
    assert first.graphs <= COMPILED_GRAPH_BUDGET and not first.fell_back, (
        f"{candidate_name}: the index-count stream {_COUNTS} with and without hidden states compiled "
        f"{first.graphs} graphs (budget {COMPILED_GRAPH_BUDGET}), {first.failed_frames} frames fell back to "
        f"eager, {first.graph_breaks} graph breaks")
    assert second.graphs == 0 and not second.fell_back, (
        f"{candidate_name}: replaying the same stream after warm-up compiled {second.graphs} more graphs "
        f"({second.failed_frames} failed frames, {second.graph_breaks} graph breaks): guards are too specific")
    if implementation_under_test("gather").kind == "reference":
        # The budget is the contract for every implementation; the golden pins the reference's exact
        # accounting per torch minor version, so a torch upgrade that changes it is a visible diff. A torch
        # minor without a golden of its own (one the project has not run) is compared with the nearest
        # recorded one, and what moved is upstream drift in the run report.
        accounting = {"graphs": first.graphs, "failed_frames": first.failed_frames, "graph_breaks": first.graph_breaks,
                      "recompiled_on_second_pass": second.graphs}
        assert_upstream_golden(snapshot, accounting, package="torch", precision=2)
