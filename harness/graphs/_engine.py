"""What the engine adapters' capturers share (public as ``harness.graphs.EngineCapturer`` and ``EngineBreaks``):
the capturer interface over an engine's breakable CUDA graph, set up as the engines' runners capture. One capture
stream per capturer that first waits for the caller's stream, one pool handle (``torch.cuda.graph_pool_handle()``)
for every segment of a capture, the garbage collector run and then off while a capture runs (a collection that
destroys a graph during a capture ends the capture), and a CUDA capture failure (a host sync, a copy to the host)
raised as the harness's ``CaptureError``; the engine's own exceptions and the breaks' propagate unchanged.

A subclass names its engine's bridges: :meth:`EngineCapturer.begin` (the engine's graph or capture object and the
break receiver), :meth:`EngineCapturer.capturing` (the context its runner opens a capture in),
:meth:`EngineCapturer.warm_up`, :meth:`EngineCapturer.failed` and :meth:`EngineCapturer.finish` (the graph handed
back). :class:`EngineBreaks` sends each harness break to the engine's decorator; a subclass may say how the engine
counts breaks and what a counted break must keep to."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch

from harness.errors import UsageError
from harness.graphs._backend import GraphBackend
from harness.graphs._seam import EngineBreakBody, receive_breaks

__all__ = ["EngineBreaks", "EngineCapturer", "EngineGraph"]


class EngineBreaks:
    """The break receiver of one capture: each harness break call goes to the engine's break decorator ``mark``.

    The engine's decorator reads its active capture when called, so decorating the harness's break body at call
    time is the same as decorating it where it is defined. The body runs as a break body for the harness
    (``is_capturing()`` is False there; :class:`harness.graphs.EngineBreakBody`), and a break it calls goes to the
    engine's decorator, whose nesting rule is the engine's. A name is recorded for every call the engine counted
    as a break (:meth:`engine_breaks`; without a count of its own, every call)."""

    def __init__(self, mark: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._mark = mark
        self.names: list[str] = []

    def engine_breaks(self) -> int | None:
        """The engine's own count of the breaks captured so far; None where it keeps none (safe to override)."""
        return None

    def counted(self, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called after each break the engine counted, with its result and arguments (safe to override)."""

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        before = self.engine_breaks()
        result = self._mark(EngineBreakBody(self._mark).wrap(fn))(*args, **kwargs)
        after = self.engine_breaks()
        if before is None or (after is not None and after > before):
            self.names.append(getattr(fn, "__qualname__", repr(fn)))
            self.counted(result, args, kwargs)
        return result


class EngineGraph:
    """A captured engine graph with the harness's graph interface: ``output`` is what the capture returned (the
    engine's replay refreshes it in place), ``break_names`` the breaks the receiver recorded. Counts default to the
    breaks recorded and one segment more than breaks; :meth:`replay_engine` runs the engine's own replay (safe to
    override, as the counts are)."""

    def __init__(self, graph: Any, output: Any, break_names: list[str]) -> None:
        self._graph = graph
        self.output = output
        self.break_names = list(break_names)

    @property
    def break_count(self) -> int:
        return len(self.break_names)

    @property
    def segment_count(self) -> int:
        return self.break_count + 1

    def replay_engine(self) -> None:
        self._graph.replay()

    def replay(self) -> Any:
        # The engines' replay() returns None; their runners hand back the objects the capture returned.
        self.replay_engine()
        return self.output

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.segment_count} segments, {self.break_count} breaks>"


class EngineCapturer:
    """The capturer interface (``docs/graphs.md``) over an engine's breakable capture; subclasses name the
    engine's bridges. ``needs_cuda`` is the one line refusing any backend but CUDA."""

    needs_cuda: ClassVar[str]

    def __init__(self, backend: GraphBackend) -> None:
        if backend.name != "cuda":
            raise UsageError(self.needs_cuda)
        self.backend = backend
        self.device = torch.device(getattr(backend, "device", None) or "cuda")
        self._stream = torch.cuda.Stream(device=self.device)

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def begin(self, pool: Any) -> tuple[Any, EngineBreaks]:
        """The engine's object for one capture into ``pool`` and the break receiver for it."""
        raise NotImplementedError

    def warm_up(self, fn: Callable[[], Any], runs: int) -> None:
        """Run ``fn`` eagerly ``runs`` times on the capture stream before capturing, as the engine's runner does."""
        for _ in range(runs):
            fn()

    def capturing(self, state: Any, pool: Any) -> contextlib.AbstractContextManager[Any]:
        """The context the engine's runner captures in, around the call of ``fn``."""
        raise NotImplementedError

    def failed(self, state: Any) -> None:
        """What the engine's runner does with the graph of a capture that raised (safe to override)."""

    def finish(self, state: Any, output: Any, names: list[str]) -> Any:
        """The captured graph, with the harness's graph interface."""
        raise NotImplementedError

    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> Any:
        pool = self.new_pool() if pool is None else pool
        state, receiver = self.begin(pool)
        caller = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(caller)
        with _collector_off():
            try:
                with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
                    self.warm_up(fn, warmup_runs)
                    with receive_breaks(receiver), self.capturing(state, pool):
                        output = fn()
            except BaseException as error:
                self.failed(state)
                translated = self.backend.translate_errors(error)
                if translated is not error:
                    raise translated from error
                raise
            finally:
                caller.wait_stream(self._stream)
        return self.finish(state, output, receiver.names)


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
