"""Concurrent callers (docs/runner.md): two runners, each over its own model, called from two threads at once.

Each thread's calls go through ``check_run`` with a checker of their own, so every result is compared with eager
on that thread's model and batch, and each thread's results must survive the other thread's calls. The calls
overlap in one order set by the test, not by the scheduler: at each step one thread leads (they alternate). The
other thread starts its runner call only once the leader's call has reached its layer stack (a forward pre-hook),
and the leader's stack runs only once the other's call has reached its own: the leader's layer stack then runs
while both calls are under way (each runner's layer forward patched, its forward context published), the leader's
call begun first. The other's stack runs after the leader's has returned, while the leader's call may still be
finishing. The two stacks never run at once: a runner that sends one thread's call into the other's graph is then
caught by values or shapes, not by two threads launching one CUDA graph at once, which CUDA leaves undefined (a run
could hang instead of fail). The order is the same at every run: a race that would pass in the scheduler's
favourite order is met in both orders."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.models import build_model
from harness.oracle import Checker
from harness.oracle.concurrency import Signals, run_in_threads
from harness.runner.cases import SEED, make_batch

pytestmark = pytest.mark.clause("concurrent-runners")

_THREADS = ("first thread", "second thread")
_BUCKETS = (4, 8)
# Per thread: the request lengths of each call, every one replayed; the same number of calls in both threads, each
# call of one overlapping the call of the other at the same step.
_LENGTHS = (((3, 2), (1,), (2, 2, 2)), ((4,), (1, 3, 2, 1), (2, 1)))


def test_two_runners_run_from_two_threads_at_once(build_runner, check_run, failure_context, device):
    """Runners over two models (weights of their own, so a call served by the other runner's graph shows), built
    one after the other, replay from two threads at once, each thread leading at every other step: each call equals
    eager on its own model and batch."""
    models = [build_model("dense", seed=SEED + index, dtype=torch.float32, device=device)
              for index in range(len(_THREADS))]
    runners = [build_runner(model, buckets=_BUCKETS) for model in models]
    order = Signals()  # keys: (step, what happened)
    here = threading.local()  # this thread's index and step, while its runner call is under way

    def leads(index: int, step: int) -> bool:
        return step % len(_THREADS) == index

    def arrive(module, args):
        if getattr(here, "step", None) is None or getattr(here, "arrived", False):
            return  # an eager twin's forward, or the stack again in the same call
        here.arrived = True
        if leads(here.index, here.step):
            order.give((here.step, "leader at its stack"))
            order.wait((here.step, "follower at its stack"))
        else:
            order.give((here.step, "follower at its stack"))
            order.wait((here.step, "leader's stack returned"))

    def leave(module, args, output):
        if getattr(here, "step", None) is not None and leads(here.index, here.step):
            order.give((here.step, "leader's stack returned"))

    for runner in runners:
        runner.discovery.module.register_forward_pre_hook(arrive)
        runner.discovery.module.register_forward_hook(leave, always_call=True)
    checkers = [Checker("runner", context=failure_context) for _ in _THREADS]

    def calls(index):
        def body():
            for step, lengths in enumerate(_LENGTHS[index]):
                batch = make_batch("dense", list(lengths), seed=60 + 10 * index + step, dtype=torch.float32,
                                   device=device, hidden_mode="last")

                def run(batch, step=step):  # the runner call, in this step's order
                    leader = leads(index, step)
                    if not leader:
                        order.wait((step, "leader at its stack"))
                    here.index, here.step, here.arrived = index, step, False
                    try:
                        return runners[index].run(batch)
                    finally:
                        here.step = None
                        # a call that ended without reaching its stack (or failed) holds no one up
                        for what in (("leader at its stack", "leader's stack returned") if leader
                                     else ("follower at its stack",)):
                            order.give((step, what))

                check_run(runners[index], models[index], batch, via=run, buckets=_BUCKETS, checker=checkers[index],
                          model="dense", thread=_THREADS[index], step=step)

        return body

    run_in_threads([calls(0), calls(1)], rendezvous=order, names=_THREADS)
    for index, (runner, model) in enumerate(zip(runners, models)):
        assert runner.stats.replays == len(_LENGTHS[index]) and runner.stats.eager_fallbacks == 0, runner.stats
        check_run(runner, model, make_batch("dense", [3], seed=90 + index, dtype=torch.float32, device=device),
                  buckets=_BUCKETS, checker=checkers[index], model="dense", thread=_THREADS[index],
                  after="both threads ended")
