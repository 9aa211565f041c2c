"""Mutants of the ``graphs`` component: each reproduces one bug class seen in graph runners.

Every mutant is a :class:`~harness.graphs.GraphCapturer` subclass that changes one behaviour
through the seams the reference exposes (``session_class``, ``graph_class``, ``capture``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.errors import CaptureError
from harness.graphs import Break, BreakableGraph, CaptureSession, GraphCapturer, check_capturable, write_back
from harness.mutants import MutantSet

__all__ = ["MUTANTS"]  # the mutants are reached through the registry, never imported by name

MUTANTS = MutantSet("graphs")


class _RerunGraph(BreakableGraph):
    def __init__(self, steps: list, output: Any, fn: Callable[[], Any]) -> None:
        super().__init__(steps, output)
        self.fn = fn

    def replay(self) -> Any:
        self.output = write_back(self.output, self.fn())
        return self.output


@MUTANTS.add("rerun-on-replay", bug="replay re-runs the Python function, so it reads whatever inputs are live "
         "instead of the captured static buffers")
class RerunOnReplay(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        graph = super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        return _RerunGraph(graph.steps, graph.output, fn)


class _NoWritebackGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        step.fn(*step.args, **step.kwargs)


@MUTANTS.add("no-writeback", bug="break outputs are recomputed at replay but not written back into the captured buffers")
class NoWriteback(GraphCapturer):
    graph_class = _NoWritebackGraph


class _OutOfOrderGraph(BreakableGraph):
    def replay(self) -> Any:
        for step in self.steps:  # breaks first, then segments
            if isinstance(step, Break):
                self.replay_break(step)
        for step in self.steps:
            if not isinstance(step, Break):
                step.replay()
        return self.output


@MUTANTS.add("out-of-order", bug="replay runs all eager breaks before the captured segments")
class OutOfOrder(GraphCapturer):
    graph_class = _OutOfOrderGraph


class _SkipBreakGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        if step is not [s for s in self.steps if isinstance(s, Break)][-1]:
            super().replay_break(step)


@MUTANTS.add("skip-break", bug="the last eager break is not run at replay, its captured output is reused")
class SkipBreak(GraphCapturer):
    graph_class = _SkipBreakGraph


class _InlineBreakSession(CaptureSession):
    def run_break(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)


@MUTANTS.add("break-captured", bug="a break body is captured into the graph instead of running eagerly at replay")
class BreakCaptured(GraphCapturer):
    session_class = _InlineBreakSession


class _LeakySession(CaptureSession):
    def retract(self, token: Any, *, failed: bool) -> None:
        if not failed:  # never reset on failure
            super().retract(token, failed=failed)


@MUTANTS.add("state-leak-on-error", bug="an exception during capture leaves the capture marked active")
class StateLeakOnError(GraphCapturer):
    session_class = _LeakySession


def _write_back_tensors_only(captured: Any, new: Any) -> Any:
    if isinstance(captured, dict) and isinstance(new, dict):
        for key in captured:
            if isinstance(captured[key], torch.Tensor) and key in new:
                write_back(captured[key], new[key])
        return captured
    if hasattr(captured, "__dict__") and not isinstance(captured, (torch.Tensor, type)):
        for name, value in vars(captured).items():
            if isinstance(value, torch.Tensor):
                write_back(value, getattr(new, name))
        return captured
    return write_back(captured, new)


class _DroppingGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        step.output = _write_back_tensors_only(step.output, step.fn(*step.args, **step.kwargs))


@MUTANTS.add("writeback-drops-members", bug="writeback updates only tensor members present at capture: other dict "
         "keys and object attributes keep capture-time values, keys added at replay are lost")
class WritebackDropsMembers(GraphCapturer):
    graph_class = _DroppingGraph


class _HostSyncSwallower(TorchDispatchMode):
    """Runs forbidden ops outside the graph, once, so their capture-time value is frozen."""

    def __init__(self, session: "_HostSyncSession") -> None:
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            check_capturable(func, args, kwargs)
        except CaptureError:
            return self.session.run_uncaptured(lambda: func(*args, **kwargs))
        return func(*args, **kwargs)


class _HostSyncSession(CaptureSession):
    def begin_segment(self) -> None:
        super().begin_segment()
        self._swallower = _HostSyncSwallower(self)
        self._swallower.__enter__()

    def _stop_swallowing(self) -> None:
        swallower, self._swallower = getattr(self, "_swallower", None), None
        if swallower is not None:
            swallower.__exit__(None, None, None)

    def end_segment(self) -> None:
        self._stop_swallowing()
        super().end_segment()

    def abort(self) -> None:
        self._stop_swallowing()
        super().abort()


@MUTANTS.add("host-sync-allowed", bug="an op that synchronises with the host is silently run outside the graph at "
         "capture, freezing its value, instead of failing the capture")
class HostSyncAllowed(GraphCapturer):
    session_class = _HostSyncSession


@MUTANTS.add("reentrant-capture", bug="a capture started inside another capture is silently accepted")
class ReentrantCapture(GraphCapturer):
    def check_not_capturing(self) -> None:
        return None
