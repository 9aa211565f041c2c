"""Breakable graphs: captured segments with eager breaks between them (the reference ``graphs`` component).

:class:`GraphCapturer` is the reference; its ``session_class`` and ``graph_class``, and the members of
:class:`CaptureSession`, :class:`BreakableGraph`, :class:`Break` and :func:`write_back` listed in
``docs/graphs.md`` (The reference and its seams), are what subclasses and mutants may override."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from harness.compare import ComputeSettings
from harness.errors import CaptureError, ReplayError
from harness.graphs._backend import GraphBackend, Segment, SegmentRecording
from harness.graphs._seam import (
    INLINE_BREAKS,
    break_graph,
    current_break_receiver,
    eager_on_graph,
    is_capturing,
    receive_breaks,
)

__all__ = [
    "eager_on_graph",
    "break_graph",
    "is_capturing",
    "run_outside_graph",
    "write_back",
    "copy_tensor",
    "Break",
    "BreakableGraph",
    "CaptureSession",
    "GraphCapturer",
]


def run_outside_graph(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` outside the graph being captured in this context: its work happens once, now, is
    not replayed, and what it allocates lies outside the graph's pool (:meth:`CaptureSession.run_uncaptured`);
    a plain call when nothing is being captured. Almost always a bug inside a captured region (the
    graph keeps reading the capture-time result): it exists to build such bugs on purpose."""
    session = current_break_receiver()
    if isinstance(session, CaptureSession):
        return session.run_uncaptured(fn)
    return fn()


def copy_tensor(captured: torch.Tensor, new: Any) -> torch.Tensor:
    """Copy the tensor ``new`` into ``captured`` in place: the leaf step of :func:`write_back`.

    ``new`` must have the captured shape, dtype and device exactly. ``Tensor.copy_`` alone would
    broadcast a ``(1, n)`` or ``(n,)`` result over an ``(m, n)`` buffer and cast another dtype
    silently, and graph segments after the break would read the result as if nothing changed.
    """
    if not isinstance(new, torch.Tensor):
        raise ReplayError(f"a break returned {type(new).__name__} at replay where it returned a tensor at capture")
    if new.shape != captured.shape:
        raise ReplayError(
            f"a break returned shape {tuple(new.shape)} at replay but {tuple(captured.shape)} at capture; "
            "graph segments after it read the captured buffer, so the shape must not change"
        )
    if new.dtype != captured.dtype or new.device != captured.device:
        raise ReplayError(
            f"a break returned {new.dtype} on {new.device} at replay but {captured.dtype} on {captured.device} at "
            "capture; graph segments after it read the captured buffer, so dtype and device must not change"
        )
    if new.data_ptr() == captured.data_ptr() and new.stride() == captured.stride():
        return captured  # the break wrote into the captured buffer itself
    if new.untyped_storage().data_ptr() == captured.untyped_storage().data_ptr():
        new = new.clone()  # a shifted view of the same memory: copy_ would read what it already overwrote
    captured.copy_(new)
    return captured


def _holds_tensor(value: Any, seen: set[int] | None = None) -> bool:
    """Whether a tensor is reachable in ``value`` (containers and object attributes, cycles allowed)."""
    if isinstance(value, torch.Tensor):
        return True
    seen = set() if seen is None else seen
    if id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, (list, tuple)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        items = [item for _, item in _members(value)]
    return any(_holds_tensor(item, seen) for item in items)


# Python values a break typically computes per step (lengths, counts, flags, names): immutable, so a
# new one can reach the holders of a break's output only through a mutable container around it.
_PYTHON_VALUES = (int, float, complex, bool, str, bytes)
# Leaves without members to update: compared, never merged.
_OPAQUE = (type, torch.dtype, torch.device, enum.Enum, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType, types.ModuleType, functools.partial)


def _is_frozen(value: Any) -> bool:
    # __dataclass_params__ is not in typeshed's DataclassInstance protocol
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)
            and cast(Any, value).__dataclass_params__.frozen)


def _members(value: Any) -> list[tuple[str, Any]]:
    """The attributes of a plain object, a dataclass or a ``__slots__`` class (empty for anything else)."""
    if isinstance(value, (torch.Tensor, *_PYTHON_VALUES, *_OPAQUE)) or value is None:
        return []
    names: list[str] = list(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [(name, getattr(value, name)) for name in dict.fromkeys(names)
            if name not in ("__dict__", "__weakref__") and hasattr(value, name)]


def _is_object(value: Any) -> bool:
    """An object :func:`write_back` updates attribute by attribute (a plain object, a non-frozen dataclass)."""
    if isinstance(value, (torch.Tensor, list, tuple, dict, *_PYTHON_VALUES, *_OPAQUE)) or value is None:
        return False
    return hasattr(value, "__dict__") or any("__slots__" in cls.__dict__ for cls in type(value).__mro__[:-1])


def values_not_updatable_in_place(output: Any, path: str = "output") -> list[str]:
    """Where ``output`` holds a Python value (int, float, bool, str, ...) that no mutable container
    encloses: at the top, or inside tuples and frozen dataclasses only. A new value there could never
    reach those who hold the captured object, so :class:`CaptureSession` refuses such a break output."""
    if isinstance(output, _PYTHON_VALUES):
        return [f"{path} ({type(output).__name__} {output!r})"]
    if isinstance(output, tuple):
        return [where for i, item in enumerate(output) for where in values_not_updatable_in_place(item, f"{path}[{i}]")]
    if _is_frozen(output):
        return [where for name, item in _members(output)
                for where in values_not_updatable_in_place(item, f"{path}.{name}")]
    return []


def _structure_changed(captured: Any, new: Any, what: str) -> ReplayError:
    return ReplayError(
        f"a break returned {what} at replay than at capture ({_describe(new)} vs {_describe(captured)}); later "
        "segments, breaks and the caller hold the captured object, which cannot take that change in place"
    )


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, dict):
        return f"dict with keys {sorted(map(str, value))}"
    return type(value).__name__


def _same_value(captured: Any, new: Any) -> bool:
    if new is captured:
        return True
    try:
        return type(new) is type(captured) and bool(new == captured)
    except Exception:  # noqa: BLE001 - an object whose == does not give a truth value is not "the same"
        return False


def write_back(captured: Any, new: Any, *,
               copy_tensor: Callable[[torch.Tensor, Any], torch.Tensor] = copy_tensor) -> Any:
    """Write ``new`` into ``captured`` in place, recursively, and return ``captured``.

    Tensors are copied by ``copy_tensor`` (same shape, dtype and device required: :func:`copy_tensor`);
    lists, dicts and objects with attributes (``__dict__`` or ``__slots__``, not frozen) are updated
    member by member whatever they hold (Python values only, nested containers, empty ones), so
    whoever holds them (a later break, the caller) sees the new values. A container that holds no
    tensor may change its length or keys; one that holds a tensor may not (later segments read its
    tensors). Tuples and frozen dataclasses cannot change: their members are written back, and a
    Python value in them may change only inside a list, dict or object that can take the new tuple.
    Anything that cannot be written in place (another type, a tuple of another length, a changed
    value in a tuple) raises :class:`~harness.errors.ReplayError`. ``copy_tensor`` is the extension
    point for how a tensor leaf is copied.
    """
    merged = _merge(captured, new, copy_tensor)
    if merged is not captured:
        raise _structure_changed(captured, new, "another value")
    return captured


def _merge(captured: Any, new: Any, copy_tensor: Callable[[torch.Tensor, Any], torch.Tensor],
           merging: set[tuple[int, int]] | None = None) -> Any:
    """``captured`` updated in place where it can be, else the object its container must store instead.
    ``merging`` holds the pairs being merged further up: a reference cycle that leads back to one (a request that
    points to its batch) finds the captured object, which that merge updates in place."""
    if isinstance(captured, torch.Tensor):
        return copy_tensor(captured, new)
    merging = set() if merging is None else merging
    if isinstance(captured, (list, dict)) or _is_object(captured):  # what a cycle can pass through (not a leaf)
        if (id(captured), id(new)) in merging:
            return captured
        merging.add((id(captured), id(new)))
    holds_tensor = _holds_tensor(captured)

    def merge_member(old: Any, value: Any) -> Any:
        return _merge(old, value, copy_tensor, merging)

    if isinstance(captured, list):
        if type(new) is not type(captured) or (holds_tensor and len(new) != len(captured)):
            raise _structure_changed(captured, new, "another sequence")
        for i, item in enumerate(new[:len(captured)]):
            captured[i] = merge_member(captured[i], item)
        del captured[len(new):]
        captured.extend(new[len(captured):])
        return captured
    if isinstance(captured, tuple):
        if type(new) is not type(captured) or len(new) != len(captured):
            raise _structure_changed(captured, new, "another sequence")
        merged = [merge_member(c, n) for c, n in zip(captured, new)]
        if all(m is c for m, c in zip(merged, captured)):
            return captured
        return type(captured)(*merged) if hasattr(captured, "_fields") else type(captured)(merged)
    if isinstance(captured, dict):
        if not isinstance(new, dict):
            raise _structure_changed(captured, new, "another type")
        gone = [key for key in captured if key not in new]
        if any(_holds_tensor(captured[key]) for key in gone):
            raise _structure_changed(captured, new, "a dict without a key holding a tensor")
        for key in gone:
            del captured[key]
        for key, value in new.items():
            captured[key] = merge_member(captured[key], value) if key in captured else value
        _reorder(captured, list(new))
        return captured
    if _is_frozen(captured):
        if type(new) is not type(captured):
            raise _structure_changed(captured, new, "another type")
        changes = {}
        for name, old in _members(captured):
            merged_member = merge_member(old, getattr(new, name))
            if merged_member is not old:
                changes[name] = merged_member
        return dataclasses.replace(captured, **changes) if changes else captured
    if _is_object(captured):
        if type(new) is not type(captured):
            raise _structure_changed(captured, new, "another type")
        old_members, new_members = dict(_members(captured)), dict(_members(new))
        gone = [name for name in old_members if name not in new_members]
        if any(_holds_tensor(old_members[name]) for name in gone):
            raise _structure_changed(captured, new, "an object without an attribute holding a tensor")
        for name in gone:
            delattr(captured, name)
        for name, value in new_members.items():
            merged_member = merge_member(old_members[name], value) if name in old_members else value
            if merged_member is not old_members.get(name, _MISSING):
                setattr(captured, name, merged_member)
        if isinstance(getattr(captured, "__dict__", None), dict):
            _reorder(captured.__dict__, list(getattr(new, "__dict__", {})))
        return captured
    # A leaf: None, a Python value, an opaque object. Kept where it is equal, else its container stores the new one.
    return captured if _same_value(captured, new) else new


_MISSING = object()


def _reorder(captured: dict[Any, Any], order: list[Any]) -> None:
    """Put ``captured``'s keys in ``order`` (the new object's), as eager's new dict or object has them: whoever
    iterates the captured one (a later break, the caller) meets its members in this call's order."""
    if list(captured) != order:
        for key in order:
            captured[key] = captured.pop(key)


@dataclasses.dataclass
class Break:
    """An eager call between two segments, with the objects it returned at capture."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any

    def __post_init__(self) -> None:
        # Refused at capture rather than at the replay where the value first changes: whether it
        # changes depends on the data, whether it can be written back does not.
        frozen = values_not_updatable_in_place(self.output)
        if frozen:
            raise CaptureError(
                f"break {self.name} returned {', '.join(frozen)}: a Python value outside any list, dict or object "
                "cannot be updated in place at replay, so later breaks and the caller, which hold the captured "
                "output, would read its capture-time value. Return it inside a list, dict or object, or as a tensor."
            )

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


@dataclasses.dataclass
class RaisedBreak(Break):
    """A break that raised ``error_type`` at capture, which the captured program handled: the program's handler,
    recorded after it, is where the capture went on. At replay it runs again and must raise as it did, so that
    eager would take the same handler (its partial work is redone as eager redoes it)."""

    error_type: type[BaseException] = Exception

    def __post_init__(self) -> None:
        pass  # it returned nothing to write back into


class CaptureSession:
    """One capture in progress.

    Safe to override (the seams other implementations and mutants build on): :meth:`run_break`,
    :meth:`begin_segment`, :meth:`end_segment`, :meth:`abort`, :meth:`publish`, :meth:`retract` and
    :meth:`wait_on_uncaptured_stream`.
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
        """Make this session the receiver of the current context's breaks (the public seam,
        :func:`~harness.graphs.receive_breaks`); returns the token :meth:`retract` takes."""
        token = receive_breaks(self)
        token.__enter__()
        return token

    def retract(self, token: Any, *, failed: bool) -> None:
        """Undo :meth:`publish`; runs on every exit of the capture, ``failed`` when it raised."""
        token.__exit__(None, None, None)

    def wait_on_uncaptured_stream(self, stream: Any, other: Any) -> None:
        """A capturing ``stream`` was asked to wait for ``other``, a stream outside the capture (CUDA backend: a
        segment joins a side stream a break queued work on). A replayed segment cannot wait for work the replay
        queues eagerly, and CUDA keeps, drops or refuses such a wait by chance: the reference refuses the capture.
        """
        raise CaptureError(
            f"a captured segment waits for stream {other!r}, which is not part of the capture (the segment after a "
            "break joins the stream the break queued work on); the order cannot be kept at replay: join that "
            "stream inside the break, before it returns")

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Receive one break call (:class:`~harness.graphs.BreakReceiver`): end the segment, run the
        body eagerly with its own breaks inline, record it, begin the next segment."""
        self.end_segment()
        try:
            with receive_breaks(INLINE_BREAKS):
                output = fn(*args, **kwargs)
        except Exception as error:
            # The program may handle it and go on (a fast path falling back to a slow one): what it runs next
            # is recorded in a segment of its own; where it does not, the capture fails with this error.
            self.steps.append(RaisedBreak(fn, args, kwargs, None, type(error)))
            self.begin_segment()
            raise
        self.steps.append(Break(fn, args, kwargs, output))
        self.begin_segment()
        return output

    @contextlib.contextmanager
    def active(self) -> Iterator[CaptureSession]:
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
    the list of segments (objects with ``replay()``) and :class:`Break` records (:class:`RaisedBreak` for a break
    that raised at capture). Safe to override: :meth:`replay`, :meth:`replay_break` and :meth:`replay_raised_break`.
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
        if isinstance(step, RaisedBreak):  # a subclass's own replay() may hand every recorded break here
            self.replay_raised_break(step)
            return
        step.output = write_back(step.output, step.fn(*step.args, **step.kwargs))

    def replay_raised_break(self, step: RaisedBreak) -> None:
        """Run a break that raised at capture again: it must raise as it did (then the captured handler is the path
        eager takes too); returning, or raising another error, means eager would leave the captured path."""
        try:
            step.fn(*step.args, **step.kwargs)
        except step.error_type:
            return
        except Exception as error:
            raise ReplayError(
                f"break {step.name} raised {step.error_type.__name__} at capture, which the captured program "
                f"handled; at replay it raised {type(error).__name__} ({error}): the program could take another path "
                "than the captured one. Capture again for this case") from error
        raise ReplayError(
            f"break {step.name} raised {step.error_type.__name__} at capture, which the captured program handled; at "
            "replay it returned, so eager would take the path the capture never recorded. Capture again for this "
            "case")

    def replay(self) -> Any:
        """Replay every segment and break in order; returns :attr:`output`."""
        for step in self.steps:
            if isinstance(step, RaisedBreak):  # apart from replay_break, which subclasses override for the others
                self.replay_raised_break(step)
            elif isinstance(step, Break):
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
        if current_break_receiver() is not None:
            raise CaptureError(
                "capture is not re-entrant: a capture (or a break body) is already running in this context"
            )

    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        self.check_not_capturing()
        # Where the caller's autocast is on, its cast cache is emptied before the capture and after it: a cast cached
        # before the capture (by the caller, by the warm-up) would be read by the captured ops without a cast op in
        # the graph, so a replay after the weights were written in place would read the stale copy; a cast cached
        # during the capture lives in the graph's pool. The cache stays enabled (torch.cuda.make_graphed_callables
        # turns it off instead): Dynamo guards on that setting, and compiled code would compile again for the capture.
        autocast = bool(ComputeSettings.now().autocast)
        try:
            for _ in range(warmup_runs):
                self.backend.warm_up(fn)
            if autocast:
                torch.clear_autocast_cache()
            session = self.session_class(self.backend, self.new_pool() if pool is None else pool)
            with session.active():
                output = fn()
        finally:
            if autocast:
                torch.clear_autocast_cache()
        return self.graph_class(session.steps, output)
