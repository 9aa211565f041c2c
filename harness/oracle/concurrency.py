"""Calls from several threads at once, made to overlap for certain: what the suites' thread tests use.

A thread test asserts results, never timings, so it must not depend on the scheduler for the overlap it
claims to test. :class:`Rendezvous` is a meeting point placed inside the calls (a break body, a hook, the
captured function): every thread waits there until all have arrived, so each call is under way while the
others are. After the meeting the scheduler picks who goes first; where that order matters (a bug that shows
in one order only), :class:`Signals` lets the test set it: named one-shot signals that one thread gives and
another waits for. :class:`Lockstep` interleaves calls that offer no such place (one opaque call): the threads
take turns at every tensor op their own code calls. :func:`run_in_threads` starts the bodies together and hands
back their results or the first error, with the thread named; a thread that fails breaks the rendezvous, the
signals or the lockstep, so the others stop waiting at once."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from harness.hazards import amplifiers_paused
from harness.oracle import _contexts

__all__ = ["Rendezvous", "Signals", "Lockstep", "run_in_threads", "THREAD_TIMEOUT_S"]

#: How long a thread waits at a rendezvous, or for its peers to end, before the test fails: far above what an
#: overlapping call takes, so only a hung or deadlocked implementation reaches it.
THREAD_TIMEOUT_S = 30.0


class Rendezvous:
    """A meeting point of ``parties`` threads, inside the calls a test makes overlap.

    Disarmed (as it is built) :meth:`wait` returns at once: the same code also runs alone (a capture, the
    set-up, an eager run in one thread) and must not block there. Within ``with rendezvous.armed():`` each
    :meth:`wait` blocks until every party has reached its own, and raises
    :class:`threading.BrokenBarrierError` once a party failed (:meth:`abort`) or after ``timeout`` seconds."""

    def __init__(self, parties: int = 2, *, timeout: float = THREAD_TIMEOUT_S) -> None:
        self._barrier = threading.Barrier(parties, timeout=timeout)
        self._armed = False

    @contextlib.contextmanager
    def armed(self) -> Iterator[Rendezvous]:
        self._barrier.reset()
        self._armed = True
        try:
            yield self
        finally:
            self._armed = False

    @property
    def is_armed(self) -> bool:
        """Whether the parties are meeting now (within :meth:`armed`)."""
        return self._armed

    def wait(self) -> None:
        if self._armed:
            self._barrier.wait()

    def abort(self) -> None:
        """Release every waiting party with :class:`threading.BrokenBarrierError` (a peer failed)."""
        self._barrier.abort()


class Signals:
    """One-shot signals between threads, each named by a key (a step and what happened, say): :meth:`give` sets
    one, :meth:`wait` blocks until it is set. A test orders its threads' calls with them, the same way at every
    run. :meth:`abort` (called by :func:`run_in_threads` when a thread fails) releases every waiter with
    :class:`threading.BrokenBarrierError`; a signal not given within ``timeout`` seconds raises
    :class:`TimeoutError` naming it."""

    def __init__(self, *, timeout: float = THREAD_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._events: dict[Any, threading.Event] = {}
        self._lock = threading.Lock()
        self._aborted = False

    def _event(self, key: Any) -> threading.Event:
        with self._lock:
            event = self._events.setdefault(key, threading.Event())
            if self._aborted:  # a wait begun after the abort ends at once too
                event.set()
            return event

    def give(self, key: Any) -> None:
        self._event(key).set()

    def wait(self, key: Any) -> None:
        if not self._event(key).wait(self.timeout):
            raise TimeoutError(f"waited {self.timeout:.0f} s for {key!r}")
        if self._aborted:
            raise threading.BrokenBarrierError

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            events = list(self._events.values())
        for event in events:
            event.set()


class Lockstep:
    """Interleaves the calls of ``parties`` threads step by step, the same way at every run.

    Within ``with lockstep.turns(party):`` (each party enters once, and all enter together) a thread runs up to
    its next tensor op called from Python (a ``torch`` function or a tensor method: a ``c_call`` profile event
    of this thread) and hands the turn to the next party still inside, then waits for it to come back before
    making that call. Two calls of one opaque function thus run op by op in turn, so state one call leaves for
    the other between two of its ops (a shared workspace) is met by the other whatever the scheduler does.

    Only ops called from the implementation's own code are turns (a file outside torch: the implementation,
    or the code a compiler generated for it), not other builtins nor the ops torch's own machinery calls:
    Dynamo's guards read tensor sizes under a lock that a peer waiting for its turn would hold. A call with no
    such op (a compiled function whose generated code calls kernels only) runs as one step. A party whose turn
    does not come back within ``patience`` seconds (its peer blocked on a lock all the same) carries on alone
    until it leaves: less interleaving, never a deadlock.
    """

    def __init__(self, parties: int = 2, *, patience: float = 2.0, timeout: float = THREAD_TIMEOUT_S) -> None:
        self.parties = parties
        self.patience = patience
        self._entry = threading.Barrier(parties, timeout=timeout)
        self._turn = threading.Condition()
        self._holder = 0
        self._inside: list[int] = []
        self._alone: set[int] = set()

    @contextlib.contextmanager
    def turns(self, party: int) -> Iterator[None]:
        previous = sys.getprofile()
        with self._turn:
            self._inside.append(party)
            self._inside.sort()
        try:
            self._entry.wait()
            sys.setprofile(lambda frame, event, arg: self._step(party, event, frame, arg))
            yield
        finally:
            sys.setprofile(previous)
            with self._turn:
                self._inside.remove(party)
                if not self._entry.broken:
                    self._alone.discard(party)
                if self._holder == party or not self._inside:  # the next round starts as this one did
                    self._holder = self._inside[0] if self._inside else 0
                self._turn.notify_all()

    def abort(self) -> None:
        """Stop the turns: waiting parties carry on alone, and a party entering later raises
        :class:`threading.BrokenBarrierError` (a peer failed and will not come)."""
        self._entry.abort()
        with self._turn:
            self._alone.update(range(self.parties))
            self._turn.notify_all()

    def _step(self, party: int, event: str, frame: Any, callee: Any) -> None:
        if event != "c_call" or party in self._alone or not _is_tensor_op(callee) or not _own_code(frame):
            return
        with self._turn:
            if self._holder == party:
                later = [p for p in self._inside if p > party]
                self._holder = (later or self._inside)[0]
                self._turn.notify_all()
            if not self._turn.wait_for(lambda: self._holder == party, timeout=self.patience):
                self._alone.add(party)


def _is_tensor_op(callee: Any) -> bool:
    """Whether a C function is a tensor op: ``torch.*`` (``torch.empty_like``), a bound tensor method
    (``t.copy_``) or an unbound one (``torch.Tensor.copy_``)."""
    return (getattr(callee, "__module__", None) == "torch"
            or isinstance(getattr(callee, "__self__", None), torch.Tensor)
            or getattr(callee, "__objclass__", None) is torch._C.TensorBase)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _own_code(frame: Any) -> bool:
    """Whether ``frame`` runs code from a file outside torch (not ``<string>``-made code, such as guards)."""
    filename = frame.f_code.co_filename
    return not filename.startswith(("<", _TORCH_DIR))


def run_in_threads(bodies: Sequence[Callable[[], Any]], *, rendezvous: Rendezvous | Signals | Lockstep | None = None,
                   names: Sequence[str] | None = None, timeout: float = THREAD_TIMEOUT_S) -> list[Any]:
    """Run each of ``bodies`` in its own thread, all released together, and return their results in order.

    An exception in a body aborts ``rendezvous`` (a :class:`Rendezvous`, :class:`Signals` or :class:`Lockstep`: its
    peers stop waiting) and is raised here once every thread has ended, naming the thread; the root cause wins over the
    peers' :class:`threading.BrokenBarrierError`. A thread still running after ``timeout`` seconds is reported
    as hung (it is a daemon: it cannot keep the test process alive)."""
    names = list(names) if names is not None else [f"thread {index}" for index in range(len(bodies))]
    start = threading.Barrier(len(bodies), timeout=timeout)
    results: list[Any] = [None] * len(bodies)
    errors: dict[int, BaseException] = {}
    # The caller's context the example holds from capture to last replay, thread-local settings (autocast) included:
    # each thread serves in it, as an engine's threads serve in the configuration it was built in.
    context = _contexts.entered_contexts()

    def run(index: int) -> None:
        try:
            start.wait()
            with _contexts.caller_context_applied(context):
                results[index] = bodies[index]()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread, never swallowed
            errors[index] = error
            start.abort()
            if rendezvous is not None:
                rendezvous.abort()

    threads = [threading.Thread(target=run, args=(index,), name=f"harness-{name}", daemon=True)
               for index, name in enumerate(names)]
    # One thread's capture allocates and writes blocks another thread's poisoning would see free.
    with amplifiers_paused():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
    hung = [name for name, thread in zip(names, threads) if thread.is_alive()]
    if hung:
        if rendezvous is not None:
            rendezvous.abort()
        raise TimeoutError(f"{', '.join(hung)} still running after {timeout:.0f} s: a call that overlaps another "
                           "one hangs (a deadlock, or a wait for a peer that failed)")
    if errors:
        causes = [index for index, error in errors.items() if not isinstance(error, threading.BrokenBarrierError)]
        index = min(causes or errors)
        raise _named(errors[index], names[index])
    return results


def _named(error: BaseException, name: str) -> BaseException:
    """``error`` with a note naming the thread it came from (the checker's message stays first)."""
    if hasattr(error, "add_note"):
        error.add_note(f"(raised in {name}, while the other threads' calls overlapped it)")
    return error
