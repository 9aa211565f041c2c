"""The break seam: the break markers, and how a capturer receives their calls.

Safe to use: :func:`eager_on_graph`, :func:`break_graph`, :func:`receive_breaks` and the
:class:`BreakReceiver` protocol (``run_break(fn, args, kwargs)``). ``docs/graphs.md`` has a worked adapter."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

__all__ = [
    "BreakReceiver",
    "INLINE_BREAKS",
    "EngineBreakBody",
    "receive_breaks",
    "current_break_receiver",
    "eager_on_graph",
    "break_graph",
    "is_capturing",
]

F = TypeVar("F", bound=Callable[..., Any])


@runtime_checkable
class BreakReceiver(Protocol):
    """What a capturer hands to :func:`receive_breaks`."""

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Called instead of ``fn(*args, **kwargs)`` for every marked call during the capture; its
        return value is what the caller gets. ``fn`` is the undecorated function (a method comes
        with its instance as ``args[0]``), so calling it runs the break's body once."""


class _InlineBreaks:
    """The receiver of a break body: breaks called from it run inline, yet a capture is in progress."""

    in_break_body = True  # is_capturing() is False here; a capturer's own receiver for a break body may say so too

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return fn(*args, **kwargs)

    def __repr__(self) -> str:
        return "INLINE_BREAKS"


INLINE_BREAKS = _InlineBreaks()
"""Receiver for a break body: ``with receive_breaks(INLINE_BREAKS): fn(*args, **kwargs)`` runs the
body with its own breaks inline, while :func:`current_break_receiver` still says a capture runs."""

# Per thread and per asyncio context, so two threads can capture independently.
_RECEIVER: contextvars.ContextVar[BreakReceiver | None] = contextvars.ContextVar(
    "harness_break_receiver", default=None)


class receive_breaks:  # noqa: N801 - a context manager named for what its block does, like contextlib.suppress
    """``with receive_breaks(receiver):`` sends every marked break call made in this context to
    ``receiver.run_break`` until the block ends (also when it raises); the receiver active before is
    restored. Nesting is allowed: the innermost receiver gets the calls. Whether a capturer refuses a
    capture inside another is its own decision (:func:`current_break_receiver` tells it whether one
    runs). ``__enter__`` returns the receiver.

    Only ``__exit__`` restores the previous receiver (a capturer that enters it by hand must exit it
    on every path): nothing is restored behind the caller's back when the object is collected.
    """

    def __init__(self, receiver: BreakReceiver) -> None:
        if not callable(getattr(receiver, "run_break", None)):
            raise TypeError(f"receive_breaks() needs an object with run_break(fn, args, kwargs); got {receiver!r}")
        self.receiver = receiver
        self._token: contextvars.Token[BreakReceiver | None] | None = None

    def __enter__(self) -> BreakReceiver:
        if self._token is not None:
            raise RuntimeError("this receive_breaks() block is already entered; make one per block")
        self._token = _RECEIVER.set(self.receiver)
        return self.receiver

    def __exit__(self, *exc_info: Any) -> None:
        token, self._token = self._token, None
        if token is not None:
            _RECEIVER.reset(token)


class EngineBreakBody:
    """The receiver an engine adapter installs while the engine runs a break body (``wrap(fn)`` is that body):
    :func:`is_capturing` is False there, and a break the body calls goes to ``mark(fn)``, the engine's own
    break decorator, so that the engine's nesting rule decides what a break inside a break does."""

    in_break_body = True

    def __init__(self, mark: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._mark = mark

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._mark(fn)(*args, **kwargs)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> Any:
            with receive_breaks(self):
                return fn(*args, **kwargs)

        return body


def current_break_receiver() -> BreakReceiver | None:
    """The receiver of this context: a capturer's, :data:`INLINE_BREAKS` inside a break body, or None."""
    return _RECEIVER.get()


def is_capturing() -> bool:
    """True while a capture (not a break body inside it) is running in this context: a receiver is active and
    it is not one for a break body (:data:`INLINE_BREAKS`, or any receiver with ``in_break_body = True``)."""
    receiver = _RECEIVER.get()
    return receiver is not None and not getattr(receiver, "in_break_body", False)


def eager_on_graph(fn: F | None = None, *, enable: bool = True) -> Any:
    """Mark ``fn`` (function or method) as an eager break of any capture that calls it.

    ``enable=False`` makes it a plain call (handy to compare the broken and unbroken graphs).
    """

    def decorate(function: F) -> F:
        if not enable:
            return function

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            receiver = _RECEIVER.get()
            if receiver is not None:
                return receiver.run_break(function, args, kwargs)
            return function(*args, **kwargs)

        cast(Any, wrapper).__eager_on_graph__ = True  # the mark a capturer looks for
        return cast(F, wrapper)

    return decorate(fn) if fn is not None else decorate


@eager_on_graph
def _empty_break() -> None:
    return None


def break_graph() -> None:
    """Insert an empty break: the current segment ends here and a new one begins."""
    _empty_break()
