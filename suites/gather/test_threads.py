"""Concurrent callers (docs/gather.md): a gather called from several threads at once (1 to 8), every call checked.

Each thread has its own checker (``check_gather.anew()``), which compares each call with eager indexing of that
call's own arguments and holds the results of its last calls to see that no later call, in any thread,
changes them. A gather is one opaque call, so the overlap is made by a :class:`~harness.oracle.concurrency.Lockstep`:
the threads' calls start together and run op by op in turn, the same way at every run, so state one call
leaves between two of its ops (a shared workspace) is met by the other call for certain, not by luck."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.gather import GatherCase
from harness.oracle.concurrency import Lockstep, run_in_threads
from harness.plugin.profiles import capped_examples

pytestmark = pytest.mark.clause("bit-identical")

_MAX_THREADS = 8
# A pool of workspaces sized for two callers shows at three; the largest count is every thread a host could
# plausibly run the scheduler, the forward and the samplers on.
thread_counts = st.one_of(st.sampled_from([1, 2, 3, _MAX_THREADS]), st.integers(1, _MAX_THREADS))


@pytest.mark.parametrize("sources", ["shared", "own"])
@example(threads=2).via("the two callers of an overlap scheduler")
@example(threads=3).via("one caller more than a pair")
@example(threads=_MAX_THREADS).via("the most callers drawn")
@capped_examples(2)
@given(threads=thread_counts)
def test_threads_gather_at_once(check_gather, device, sources, threads):
    """A drawn number of threads (1 to 8) gather at once, from the same sources (read by all, written by none) or
    each from its own, with index counts and values of their own: each call equals eager indexing of its arguments,
    and each thread's results survive the other threads' calls."""
    names = [f"thread {i + 1} of {threads}" for i in range(threads)]
    cases = [GatherCase(pool=64, count=7 - i % 3 * 2 + i // 3, seed=21 + i) for i in range(threads)]
    built = [case.build(device) for case in cases]
    if sources == "shared":
        for inputs in built[1:]:
            inputs.buffers = built[0].buffers
    lockstep = Lockstep(threads)
    calls = [check_gather.anew(in_turns=lambda i=i: lockstep.turns(i)) for i in range(threads)]

    def gathers(i):
        case, inputs = cases[i], built[i]

        def body():
            generator = torch.Generator().manual_seed(case.seed)
            for step in range(3):
                inputs.indices.copy_(torch.randint(0, case.pool, (case.count,), generator=generator))
                calls[i].args(*inputs.args, case=case, thread=names[i], threads=threads, step=step, sources=sources)

        return body

    run_in_threads([gathers(i) for i in range(threads)], rendezvous=lockstep, names=names)
