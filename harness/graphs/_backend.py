"""The graph-backend interface (:class:`GraphBackend`): what a backend provides for captures and replays.

A backend records *segments* (``begin_segment`` ... ``end``) and never sees breaks; the members a
backend must offer are listed in ``docs/graphs.md`` (The reference and its seams)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

__all__ = ["GraphBackend", "SegmentRecording", "Segment"]


class Segment(Protocol):
    """A recorded stretch of device work."""

    def replay(self) -> None: ...


class SegmentRecording(Protocol):
    """A segment being recorded; exactly one of ``end`` or ``abort`` is called.

    A recording may also offer ``suspended()``, a context manager inside which work runs now and
    is not recorded; :meth:`~harness.graphs.CaptureSession.run_uncaptured` uses it where present.
    """

    def end(self) -> Segment: ...

    def abort(self) -> None: ...


class GraphBackend:
    """Base class of graph backends. Override every method that raises ``NotImplementedError``.

    ``translate_errors`` is safe to override: it turns a backend's own capture failure into
    :class:`~harness.errors.CaptureError` so that every backend gives the same verdict.
    """

    name = "abstract"
    #: Whether :meth:`warm_up` runs ``fn`` for real, outside any graph, so that state ``fn`` creates
    #: lazily on its first call (a cached tensor, a workspace) exists before the capture and is not
    #: allocated, and re-initialised at every replay, inside the graph. Suites that check warm-up
    #: semantics skip, with the backend's stated reason, where this is False.
    warms_up_outside_the_graph = False
    #: Why a backend does not model warm-up (shown by those skips); empty where it does.
    warm_up_difference = ""

    def new_pool(self) -> Any:
        """A memory pool shared by the segments (and graphs) captured with it."""
        raise NotImplementedError

    def warm_up(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` eagerly once before a capture (lazy initialisation, autotuning, compiles)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def capture_context(self) -> Iterator[None]:
        """Held for the whole capture (segments and the breaks between them)."""
        yield

    def begin_segment(self, pool: Any) -> SegmentRecording:
        raise NotImplementedError

    def translate_errors(self, error: BaseException) -> BaseException:
        return error

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
