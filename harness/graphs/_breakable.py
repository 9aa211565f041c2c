"""Breakable graphs: captured segments with eager breaks between them.

A function decorated with :func:`eager_on_graph` becomes a *break*: called during a capture, it
ends the current segment, runs eagerly, and a new segment begins; at replay the segments replay
and each break runs eagerly again, its new outputs written back in place into the objects it
returned at capture (later segments, and the caller, hold those). Outside a capture a break is a
plain call. :class:`GraphCapturer` is the reference implementation of the ``graphs`` component;
its ``session_class`` and ``graph_class`` are the seams mutants and other implementations override.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Iterator, TypeVar

import torch

from harness.errors import CaptureError, ReplayError
from harness.graphs._backend import GraphBackend, Segment, SegmentRecording

__all__ = [
    "eager_on_graph",
    "break_graph",
    "is_capturing",
    "write_back",
    "Break",
    "BreakableGraph",
    "CaptureSession",
    "GraphCapturer",
]

F = TypeVar("F", bound=Callable[..., Any])


class _InsideBreak:
    """Marks that a break body is running: breaks called from it run inline."""


_INSIDE_BREAK = _InsideBreak()
# Per thread and per asyncio context, so two threads can capture independently.
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("harness_active_capture", default=None)


def is_capturing() -> bool:
    """True while a capture (not a break body inside it) is running in this context."""
    return isinstance(_ACTIVE.get(), CaptureSession)


def eager_on_graph(fn: F | None = None, *, enable: bool = True) -> Any:
    """Mark ``fn`` (function or method) as an eager break of any capture that calls it.

    ``enable=False`` makes it a plain call (handy to compare the broken and unbroken graphs).
    """

    def decorate(function: F) -> F:
        if not enable:
            return function

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            session = _ACTIVE.get()
            if isinstance(session, CaptureSession):
                return session.run_break(function, args, kwargs)
            return function(*args, **kwargs)

        wrapper.__eager_on_graph__ = True  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


@eager_on_graph
def _empty_break() -> None:
    return None


def break_graph() -> None:
    """Insert an empty break: the current segment ends here and a new one begins."""
    _empty_break()


def write_back(captured: Any, new: Any) -> Any:
    """Copy ``new`` into ``captured`` in place, recursively, and return the merged object.

    Tensors are copied (same shape required); lists, dicts and objects with attributes are
    updated member by member; a non-tensor leaf takes the new value where its container allows.
    """
    if isinstance(captured, torch.Tensor):
        if not isinstance(new, torch.Tensor):
            raise ReplayError(f"a break returned {type(new).__name__} at replay where it returned a tensor at capture")
        if new.shape != captured.shape:
            raise ReplayError(
                f"a break returned shape {tuple(new.shape)} at replay but {tuple(captured.shape)} at capture; "
                "graph segments after it read the captured buffer, so the shape must not change"
            )
        if new.data_ptr() != captured.data_ptr() or new.stride() != captured.stride():
            captured.copy_(new)
        return captured
    if isinstance(captured, list) and isinstance(new, list) and len(captured) == len(new):
        for i, item in enumerate(new):
            captured[i] = write_back(captured[i], item)
        return captured
    if isinstance(captured, tuple) and isinstance(new, tuple) and len(captured) == len(new):
        merged = [write_back(c, n) for c, n in zip(captured, new)]
        if all(m is c for m, c in zip(merged, captured)):
            return captured
        return type(captured)(*merged) if hasattr(captured, "_fields") else type(captured)(merged)
    if isinstance(captured, dict) and isinstance(new, dict):
        for key, value in new.items():
            captured[key] = write_back(captured[key], value) if key in captured else value
        return captured
    if hasattr(captured, "__dict__") and type(captured) is type(new) and not isinstance(captured, type):
        for name, value in vars(new).items():
            current = captured.__dict__.get(name, None)
            setattr(captured, name, write_back(current, value) if name in captured.__dict__ else value)
        return captured
    return new


@dataclasses.dataclass
class Break:
    """An eager call between two segments, with the objects it returned at capture."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


class CaptureSession:
    """One capture in progress.

    Safe to override (the seams other implementations and mutants build on): :meth:`run_break`,
    :meth:`begin_segment`, :meth:`end_segment`, :meth:`abort`, :meth:`publish` and :meth:`retract`.
    :meth:`run_uncaptured` is offered to subclasses; the reference never calls it.
    """

    def __init__(self, backend: GraphBackend, pool: Any) -> None:
        self.backend = backend
        self.pool = pool
        self.steps: list[Segment | Break] = []
        self._recording: SegmentRecording | None = None

    def begin_segment(self) -> None:
        self._recording = self.backend.begin_segment(self.pool)

    def end_segment(self) -> None:
        recording, self._recording = self._recording, None
        if recording is not None:
            self.steps.append(recording.end())

    def abort(self) -> None:
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.abort()

    @property
    def recording(self) -> SegmentRecording | None:
        """The segment being recorded, or None between segments (inside a break)."""
        return self._recording

    def run_uncaptured(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` eagerly, outside the graph: its result is frozen into the capture and ``fn``
        does not run at replay. Where the backend can suspend a recording it does; otherwise the
        current segment ends and a new one begins at the backend (without calling
        :meth:`begin_segment` again, so a subclass's per-segment set-up stays as it is)."""
        suspended = getattr(self._recording, "suspended", None)
        if suspended is not None:
            with suspended():
                return fn()
        recording, self._recording = self._recording, None
        if recording is not None:
            self.steps.append(recording.end())
        try:
            return fn()
        finally:
            self._recording = self.backend.begin_segment(self.pool)

    def publish(self) -> Any:
        """Make this the capture of the current context; returns the token :meth:`retract` takes."""
        return _ACTIVE.set(self)

    def retract(self, token: Any, *, failed: bool) -> None:
        """Undo :meth:`publish`; runs on every exit of the capture, ``failed`` when it raised."""
        _ACTIVE.reset(token)

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.end_segment()
        token = _ACTIVE.set(_INSIDE_BREAK)
        try:
            output = fn(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)
        self.steps.append(Break(fn, args, kwargs, output))
        self.begin_segment()
        return output

    @contextlib.contextmanager
    def active(self) -> Iterator["CaptureSession"]:
        """Make this the capture of the current context; on any exception leave nothing behind."""
        token = self.publish()
        failed = True
        try:
            with self.backend.capture_context():
                self.begin_segment()
                try:
                    yield self
                    self.end_segment()
                    failed = False
                except BaseException as error:
                    self.abort()
                    translated = self.backend.translate_errors(error)
                    if translated is not error:
                        raise translated from error
                    raise
        finally:
            self.retract(token, failed=failed)


class BreakableGraph:
    """A captured graph: segments and breaks, replayed in capture order.

    ``output`` is what the captured function returned; replay refreshes it in place. ``steps`` is
    the list of segments (objects with ``replay()``) and :class:`Break` records. Safe to override:
    :meth:`replay` and :meth:`replay_break`.
    """

    def __init__(self, steps: list[Segment | Break], output: Any) -> None:
        self.steps = steps
        self.output = output

    @property
    def segment_count(self) -> int:
        return sum(1 for step in self.steps if not isinstance(step, Break))

    @property
    def break_count(self) -> int:
        return sum(1 for step in self.steps if isinstance(step, Break))

    @property
    def break_names(self) -> list[str]:
        return [step.name for step in self.steps if isinstance(step, Break)]

    def replay_break(self, step: Break) -> None:
        step.output = write_back(step.output, step.fn(*step.args, **step.kwargs))

    def replay(self) -> Any:
        """Replay every segment and break in order; returns :attr:`output`."""
        for step in self.steps:
            if isinstance(step, Break):
                self.replay_break(step)
            else:
                step.replay()
        return self.output

    def __repr__(self) -> str:
        return f"<BreakableGraph {self.segment_count} segments, {self.break_count} breaks>"


class GraphCapturer:
    """Reference implementation of the ``graphs`` component.

    ``GraphCapturer(backend).capture(fn)`` warms ``fn`` up, captures it and returns a
    :class:`BreakableGraph`. Safe to override: ``session_class``, ``graph_class``, :meth:`capture`
    and :meth:`check_not_capturing`.
    """

    session_class = CaptureSession
    graph_class = BreakableGraph

    def __init__(self, backend: GraphBackend) -> None:
        self.backend = backend

    def new_pool(self) -> Any:
        return self.backend.new_pool()

    def check_not_capturing(self) -> None:
        if _ACTIVE.get() is not None:
            raise CaptureError(
                "capture is not re-entrant: a capture (or a break body) is already running in this context"
            )

    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        self.check_not_capturing()
        for _ in range(warmup_runs):
            self.backend.warm_up(fn)
        session = self.session_class(self.backend, self.new_pool() if pool is None else pool)
        with session.active():
            output = fn()
        return self.graph_class(session.steps, output)
