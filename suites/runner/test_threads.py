"""Concurrent callers (docs/runner.md): runners, each over its own model, called from 1 to 8 threads at once.

Each thread's calls go through ``check_run`` with a checker of their own, so every result is compared with eager
on that thread's model and batch, and each thread's results must survive the other threads' calls. The calls
overlap in one order set by the test, not by the scheduler: at each step one thread leads (in turn). The others
start their runner calls only once the leader's call has reached its layer stack (a forward pre-hook), and the
leader's stack runs only once every other call has reached its own: the leader's layer stack then runs while all
calls are under way (each runner's layer forward patched, its forward context published), the leader's call begun
first. The others' stacks run after the leader's has returned, one after another in thread order, while the earlier
calls may still be finishing. No two stacks run at once: a runner that sends one thread's call into another's graph
is then caught by values or shapes, not by threads launching one CUDA graph at once, which CUDA leaves undefined (a
run could hang instead of fail). The order is the same at every run: a race that would pass in the scheduler's
favourite order is met in every thread's turn as leader."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.models import build_model
from harness.oracle import Checker
from harness.oracle.concurrency import Signals, run_in_threads
from harness.plugin.profiles import capped_examples
from harness.runner.cases import SEED, make_batch

pytestmark = pytest.mark.clause("concurrent-runners")

_MAX_THREADS = 8
_BUCKETS = (4, 8)
# The request lengths of each call, thread i taking them from position i on (every one replayed); the same number
# of calls in every thread, each call of one overlapping the calls of the others at the same step.
_LENGTHS = ((3, 2), (1,), (2, 2, 2), (4,), (1, 3, 2, 1), (2, 1), (5,), (1, 1, 1, 1, 1, 1), (7, 1), (2, 3))
_STEPS = 3


@example(threads=2).via("the pair every engine has")
@example(threads=3).via("one more than a pair")
@example(threads=_MAX_THREADS).via("the most callers drawn")
@capped_examples(1)
@given(threads=st.integers(1, _MAX_THREADS))
def test_runners_run_from_threads_at_once(build_runner, failure_context, device, check_run, threads):
    """Runners over models of their own (weights of their own, so a call served by another runner's graph shows),
    built one after the other, replay from a drawn number of threads (1 to 8) at once, a different thread leading
    at each step: each call equals eager on its own model and batch. At each step the leader's call reaches its
    layer stack first and holds it until every other call has reached its own; the others' stacks then run one after
    another, in the order of the threads after the leader, each once the previous one has returned."""
    names = [f"thread {i + 1} of {threads}" for i in range(threads)]
    models = [build_model("dense", seed=SEED + index, dtype=torch.float32, device=device) for index in range(threads)]
    runners = [build_runner(model, buckets=_BUCKETS) for model in models]
    order = Signals()  # keys: (step, thread index or "leader", what happened)
    here = threading.local()  # this thread's index and step, while its runner call is under way

    def leader(step: int) -> int:
        return step % threads

    def previous(index: int, step: int) -> int:
        """The thread whose stack runs just before this one's at ``step``."""
        return (index - 1) % threads

    def arrive(module, args):
        if getattr(here, "step", None) is None or getattr(here, "arrived", False):
            return  # an eager twin's forward, or the stack again in the same call
        here.arrived = True
        index, step = here.index, here.step
        if index == leader(step):
            order.give((step, "leader", "at its stack"))
            for other in range(threads):
                if other != index:
                    order.wait((step, other, "at its stack"))
        else:
            order.give((step, index, "at its stack"))
            order.wait((step, previous(index, step), "stack returned"))

    def leave(module, args, output):
        if getattr(here, "step", None) is not None:
            order.give((here.step, here.index, "stack returned"))

    for runner in runners:
        runner.discovery.module.register_forward_pre_hook(arrive)
        runner.discovery.module.register_forward_hook(leave, always_call=True)
    checkers = [Checker("runner", context=failure_context) for _ in names]

    def calls(index):
        def body():
            for step in range(_STEPS):
                lengths = _LENGTHS[(index + step) % len(_LENGTHS)]
                batch = make_batch("dense", list(lengths), seed=60 + 10 * index + step, dtype=torch.float32,
                                   device=device, hidden_mode="last")

                def run(batch, step=step):  # the runner call, in this step's order
                    leads = index == leader(step)
                    if not leads:
                        order.wait((step, "leader", "at its stack"))
                    here.index, here.step, here.arrived = index, step, False
                    try:
                        return runners[index].run(batch)
                    finally:
                        here.step = None
                        # a call that ended without reaching its stack (or failed) holds no one up
                        if leads:
                            order.give((step, "leader", "at its stack"))
                        order.give((step, index, "at its stack"))
                        order.give((step, index, "stack returned"))

                check_run(runners[index], models[index], batch, via=run, buckets=_BUCKETS, checker=checkers[index],
                          model="dense", thread=names[index], threads=threads, step=step)

        return body

    run_in_threads([calls(i) for i in range(threads)], rendezvous=order, names=names)
    for index, (runner, model) in enumerate(zip(runners, models)):
        assert runner.stats.replays == _STEPS and runner.stats.eager_fallbacks == 0, runner.stats
        check_run(runner, model, make_batch("dense", [3], seed=90 + index, dtype=torch.float32, device=device),
                  buckets=_BUCKETS, checker=checkers[index], model="dense", thread=names[index],
                  after="every thread ended")
