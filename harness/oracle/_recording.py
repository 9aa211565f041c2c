"""Checks that record instead of stopping, in conformance runs.

A suite's run stops a test at its first failed check. A conformance run (``python -m harness conformance``) wants
to know more: whether a call that left the wrong state behind also gave the wrong values, and whether later calls
did. There every failed :class:`~harness.oracle.Checker` check is recorded and the test goes on; the recorded ones
are raised together where the hypothesis example ends (so that hypothesis still shrinks it), or where the test ends
(``harness.conformance.plugin``). :func:`checks_stop` makes them raise at once again (a positive control that
expects the checker to fail)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

from harness.errors import MismatchError

__all__ = ["checks_stop", "combined", "deliver", "recording", "take_recorded"]

_lock = threading.Lock()
_state = {"on": False}
_recorded: list[MismatchError] = []
# id(hypothesis build context) -> the failures recorded in that example, raised by its cleanup
_by_example: dict[int, list[MismatchError]] = {}
_stopping: contextvars.ContextVar[bool] = contextvars.ContextVar("harness_checks_stop", default=False)


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Failed checks are recorded inside the block (in every thread), not raised; the conformance plugin holds it
    open for the run."""
    with _lock:
        before, _state["on"] = _state["on"], True
    try:
        yield
    finally:
        with _lock:
            _state["on"] = before


@contextlib.contextmanager
def checks_stop() -> Iterator[None]:
    """Inside the block a failed check raises at once, also in a conformance run."""
    token = _stopping.set(True)
    try:
        yield
    finally:
        _stopping.reset(token)


def deliver(error: MismatchError) -> None:
    """Raise ``error``, or record it where checks record (see the module's docstring)."""
    __tracebackhide__ = True
    if not _state["on"] or _stopping.get():
        raise error
    from harness.oracle._contexts import _running_example

    build = _running_example()
    with _lock:
        if build is None:
            _recorded.append(error)
            return
        first = id(build) not in _by_example
        _by_example.setdefault(id(build), []).append(error)
    if first:
        from hypothesis.control import cleanup

        def fail_the_example() -> None:
            __tracebackhide__ = True
            with _lock:
                failures = _by_example.pop(id(build), [])
            if failures:
                raise combined(failures)

        cleanup(fail_the_example)


def take_recorded() -> list[MismatchError]:
    """The failures recorded outside any hypothesis example since the last call (the running test's)."""
    with _lock:
        taken = list(_recorded)
        _recorded.clear()
    return taken


def combined(failures: list[MismatchError]) -> MismatchError:
    """One failure that says every recorded one: the first one's headline, every distinct problem once, in the order
    first seen, then the first one's context (a failure from :class:`~harness.oracle.Checker` carries its
    ``problems`` and ``context`` apart)."""
    if len(failures) == 1:
        return failures[0]
    problems: list[str] = []
    for failure in failures:
        for problem in getattr(failure, "problems", None) or [str(failure)]:
            if problem not in problems:
                problems.append(problem)
    first = failures[0]
    headline = str(first).splitlines()[0]
    return MismatchError("\n  ".join([headline, *problems]) + getattr(first, "context", "")
                         + f"\n  ({len(failures)} failed checks recorded in this test, a conformance run records each "
                           "and goes on)")
