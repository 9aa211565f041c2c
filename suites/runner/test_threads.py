"""Concurrent callers (docs/runner.md): two runners, each over its own model, called from two threads at once.

Each thread's calls go through ``check_run`` with a checker of their own, so every result is compared with eager
on that thread's model and batch, and each thread's results must survive the other thread's calls. A
:class:`~harness.oracle.concurrency.Rendezvous` in a forward pre-hook on each runner's layer module holds every forward
of a thread there until the other thread's forward has arrived too: the two replays are both under way (each
runner's layer forward patched, its forward context published) when either calls its layer stack. The layer
stacks' forwards themselves then take turns (a lock from that hook to a forward hook that runs even when the
forward raises): what overlaps is everything a runner does around its stack, and the state it leaves published
meanwhile. A runner that sends one thread's call into the other's graph is then caught by values or shapes, not
by two threads launching one CUDA graph at once, which CUDA leaves undefined (a run could hang instead of fail)."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.models import build_model
from harness.oracle import Checker
from harness.oracle.concurrency import THREAD_TIMEOUT_S, Rendezvous, run_in_threads
from harness.runner.cases import SEED, make_batch

pytestmark = pytest.mark.clause("concurrent-runners")

_THREADS = ("first thread", "second thread")
_BUCKETS = (4, 8)
# Per thread: the request lengths of each call, every one replayed (both threads then make the same forwards,
# so each forward of one meets the same forward of the other at the rendezvous).
_LENGTHS = (((3, 2), (1,), (2, 2, 2)), ((4,), (1, 3, 2, 1), (2, 1)))


def test_two_runners_run_from_two_threads_at_once(build_runner, check_run, failure_context, device):
    """Runners over two models (weights of their own, so a call served by the other runner's graph shows), built
    one after the other, replay from two threads at once: each call equals eager on its own model and batch."""
    models = [build_model("dense", seed=SEED + index, dtype=torch.float32, device=device)
              for index in range(len(_THREADS))]
    runners = [build_runner(model, buckets=_BUCKETS) for model in models]
    rendezvous = Rendezvous(len(_THREADS))
    turns, holding = threading.Lock(), threading.local()

    def arrive(module, args):
        rendezvous.wait()
        if not turns.acquire(timeout=THREAD_TIMEOUT_S):
            raise TimeoutError(f"the other thread's layer-stack forward held its turn for {THREAD_TIMEOUT_S:.0f} s")
        holding.turn = True

    def leave(module, args, output):
        if getattr(holding, "turn", False):  # not where the pre-hook failed before taking its turn
            holding.turn = False
            turns.release()

    for runner in runners:
        runner.discovery.module.register_forward_pre_hook(arrive)
        runner.discovery.module.register_forward_hook(leave, always_call=True)
    checkers = [Checker("runner", context=failure_context) for _ in _THREADS]

    def calls(index):
        def body():
            for step, lengths in enumerate(_LENGTHS[index]):
                batch = make_batch("dense", list(lengths), seed=60 + 10 * index + step, dtype=torch.float32,
                                   device=device, hidden_mode="last")
                check_run(runners[index], models[index], batch, buckets=_BUCKETS, checker=checkers[index],
                          model="dense", thread=_THREADS[index], step=step)

        return body

    with rendezvous.armed():
        run_in_threads([calls(0), calls(1)], rendezvous=rendezvous, names=_THREADS)
    for index, (runner, model) in enumerate(zip(runners, models)):
        assert runner.stats.replays == len(_LENGTHS[index]) and runner.stats.eager_fallbacks == 0, runner.stats
        check_run(runner, model, make_batch("dense", [3], seed=90 + index, dtype=torch.float32, device=device),
                  buckets=_BUCKETS, checker=checkers[index], model="dense", thread=_THREADS[index],
                  after="both threads ended")
