"""Concurrent callers (docs/gather.md): a gather called from two threads at once, every call checked.

Each thread has its own checker (``check_gather.anew()``), which compares each call with eager indexing of that
call's own arguments and holds the results of its last calls to see that no later call, in either thread,
changes them. A gather is one opaque call, so the overlap is made by a :class:`~harness.oracle.concurrency.Lockstep`:
the two threads' calls start together and run op by op in turn, the same way at every run, so state one call
leaves between two of its ops (a shared workspace) is met by the other call for certain, not by luck."""

from __future__ import annotations

import pytest
import torch

from harness.gather import GatherCase
from harness.oracle.concurrency import Lockstep, run_in_threads

pytestmark = pytest.mark.clause("bit-identical")

_THREADS = ("first thread", "second thread")


@pytest.mark.parametrize("sources", ["shared", "own"])
def test_two_threads_gather_at_once(check_gather, device, sources):
    """Two threads gather at once, from the same sources (read by both, written by neither) or each from its
    own, with index counts and values of their own: each call equals eager indexing of its arguments, and
    each thread's results survive the other thread's calls."""
    cases = [GatherCase(pool=64, count=7, seed=21), GatherCase(pool=64, count=5, seed=22)]
    built = [case.build(device) for case in cases]
    if sources == "shared":
        built[1].buffers = built[0].buffers
    lockstep = Lockstep(len(_THREADS))
    calls = [check_gather.anew(in_turns=lambda i=i: lockstep.turns(i)) for i in range(len(_THREADS))]

    def gathers(i):
        case, inputs = cases[i], built[i]

        def body():
            generator = torch.Generator().manual_seed(case.seed)
            for step in range(3):
                inputs.indices.copy_(torch.randint(0, case.pool, (case.count,), generator=generator))
                calls[i].args(*inputs.args, case=case, thread=_THREADS[i], step=step, sources=sources)

        return body

    run_in_threads([gathers(0), gathers(1)], rendezvous=lockstep, names=_THREADS)
