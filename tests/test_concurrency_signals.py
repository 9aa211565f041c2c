"""``harness.oracle.concurrency.Signals``: the order a thread test sets must hold at every run, and a failed thread
must release the others at once instead of leaving them to time out."""

from __future__ import annotations

import threading
import time

import pytest

from harness.oracle.concurrency import Signals, run_in_threads


def test_a_wait_ends_when_another_thread_gives_the_signal_and_not_before():
    signals, events = Signals(timeout=10), []

    def waiter():
        signals.wait((0, "ready"))
        events.append("waiter ran")

    def giver():
        time.sleep(0.2)  # the waiter is blocked by now; it must stay blocked until the signal
        events.append("giver gave")
        signals.give((0, "ready"))

    run_in_threads([waiter, giver], rendezvous=signals, names=("waiter", "giver"))
    assert events == ["giver gave", "waiter ran"]


def test_a_signal_given_before_the_wait_is_kept():
    signals = Signals(timeout=1)
    signals.give("early")
    signals.wait("early")  # returns at once


def test_a_signal_never_given_raises_naming_it():
    with pytest.raises(TimeoutError, match=r"waited 0 s for \(3, 'leader at its stack'\)"):
        Signals(timeout=0.05).wait((3, "leader at its stack"))


def test_a_failed_thread_releases_the_waiting_one_and_its_error_wins():
    signals = Signals(timeout=30)
    released = threading.Event()

    def waiter():
        try:
            signals.wait("never given")
        finally:
            released.set()

    def failing():
        time.sleep(0.1)
        raise ValueError("the call under test failed")

    started = time.monotonic()
    with pytest.raises(ValueError, match="the call under test failed"):
        run_in_threads([waiter, failing], rendezvous=signals, names=("waiter", "failing"))
    assert released.is_set() and time.monotonic() - started < 10


def test_a_wait_begun_after_an_abort_ends_at_once():
    signals = Signals(timeout=30)
    signals.abort()
    with pytest.raises(threading.BrokenBarrierError):
        signals.wait("anything")
