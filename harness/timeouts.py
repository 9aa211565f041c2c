"""Time limits that a hang cannot escape: a test, the start-up load of an implementation, a child process.

Safe to use: :func:`time_limit`, :func:`arm` / :func:`disarm`, :func:`limits_available`. Limits nest and
need ``SIGALRM`` and the main thread (elsewhere they impose nothing); :class:`TimeLimitExceeded` says
why it is a ``BaseException``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["TimeLimitExceeded", "time_limit", "limits_available", "arm", "disarm", "where", "REFIRE_SECONDS"]

# After a limit expires, the signal repeats at this interval until the limit is left.
REFIRE_SECONDS = 2.0


class TimeLimitExceeded(BaseException):
    """A time limit expired. Its message is one line naming what ran out of time and where it was stuck.

    A ``BaseException``, as ``KeyboardInterrupt`` is, because hypothesis catches every ``Exception`` (and
    pytest's ``Failed``, which pytest-timeout raises) as a failing example and goes on to the next one, so
    pytest-timeout's one-shot signal never stopped a hang inside a ``@given`` test or a state machine (the
    harness's profiles set ``deadline=None``). Should something swallow it anyway, the signal fires again
    every :data:`REFIRE_SECONDS` until the limit is left. Nested limits report the innermost that expires."""


@dataclasses.dataclass(eq=False)
class _Limit:
    deadline: float
    describe: Callable[[FrameType | None], str]


_active: list[_Limit] = []
_previous_handler: object = None


def limits_available() -> bool:
    """Whether :func:`time_limit` can interrupt here (``SIGALRM`` exists and this is the main thread)."""
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


def where(frame: FrameType | None) -> str:
    """``file.py:LINE in function`` of the innermost Python frame (what was running when time ran out)."""
    if frame is None:
        return "an unknown place"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _schedule() -> None:
    if not _active:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return
    delay = min(limit.deadline for limit in _active) - time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(delay, 0.001), REFIRE_SECONDS)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    __tracebackhide__ = True  # pytest: the traceback ends where the main thread was, not here
    now = time.monotonic()
    expired = [limit for limit in _active if limit.deadline <= now + 0.005]
    if not expired:  # a limit was left or re-armed since the timer was set
        _schedule()
        return
    raise TimeLimitExceeded(min(expired, key=lambda limit: limit.deadline).describe(frame))


def arm(seconds: float, describe: Callable[[FrameType | None], str]) -> _Limit | None:
    """Start a limit of ``seconds``; ``describe(frame)`` gives the message when it expires (``frame``
    is where the main thread was). Returns a token for :func:`disarm`, or None where limits are unavailable
    or ``seconds`` is not positive."""
    global _previous_handler
    if not seconds or seconds <= 0 or not limits_available():
        return None
    if not _active:
        _previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
    limit = _Limit(time.monotonic() + seconds, describe)
    _active.append(limit)
    _schedule()
    return limit


def disarm(limit: _Limit | None) -> None:
    """End a limit that :func:`arm` started (None: nothing to end)."""
    if limit is None or limit not in _active:
        return
    _active.remove(limit)
    _schedule()
    if not _active:
        signal.signal(signal.SIGALRM, _previous_handler if _previous_handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def time_limit(seconds: float | None, describe: Callable[[FrameType | None], str]) -> Iterator[None]:
    """Run the body under a limit of ``seconds`` (None or 0: none); see :func:`arm`."""
    limit = arm(seconds or 0, describe)
    try:
        yield
    finally:
        disarm(limit)
