"""Mutants of the ``graphs`` component: bug classes seen in graph runners.

Each is a :class:`~harness.graphs.GraphCapturer` subclass changing one behaviour through its public seams."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.errors import CaptureError, ReplayError
from harness.graphs import (
    INLINE_BREAKS,
    Break,
    BreakableGraph,
    CaptureSession,
    GraphCapturer,
    RaisedBreak,
    _seam,
    check_capturable,
    copy_tensor,
    receive_breaks,
    write_back,
)
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


@MUTANTS.add("no-writeback",
             bug="break outputs are recomputed at replay but not written back into the captured buffers")
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

    def __init__(self, session: _HostSyncSession) -> None:
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


# --- how a break is called: what the capture keeps of its arguments -----------------------------


class _ArgumentsRewritingSession(CaptureSession):
    """Keeps ``keep_arguments(args, kwargs)`` as what a break is called with at replay."""

    def keep_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs

    def run_break(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        kept: list[tuple[tuple, dict]] = []

        def body(*call_args: Any, **call_kwargs: Any) -> Any:
            # Between two segments, so the copies are made once, now, and are not part of the graph.
            kept.append(self.keep_arguments(call_args, call_kwargs))
            return fn(*call_args, **call_kwargs)

        output = super().run_break(body, args, kwargs)
        step = self.steps[-1]
        step.fn, (step.args, step.kwargs) = fn, kept[0]
        return output


class _KeywordSnapshotSession(_ArgumentsRewritingSession):
    def keep_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {name: value.clone() if isinstance(value, torch.Tensor) else value
                      for name, value in kwargs.items()}


@MUTANTS.add("kwargs-snapshotted", bug="keyword tensor arguments of a break are copied at capture, so at replay the "
         "break reads their capture-time values instead of what the segment before it just computed")
class KeywordArgumentsSnapshotted(GraphCapturer):
    session_class = _KeywordSnapshotSession


def _clone_nested_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_nested_tensors(item) for item in value)
    if isinstance(value, dict):
        return {key: _clone_nested_tensors(item) for key, item in value.items()}
    return value


class _NestedSnapshotSession(_ArgumentsRewritingSession):
    def keep_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def keep(value: Any) -> Any:  # top-level tensors are tracked as static buffers; containers are copied
            return value if isinstance(value, torch.Tensor) else _clone_nested_tensors(value)

        return tuple(keep(a) for a in args), {name: keep(value) for name, value in kwargs.items()}


@MUTANTS.add("nested-args-snapshotted", bug="only top-level tensor arguments of a break stay live; tensors inside "
         "lists, tuples and dicts are deep-copied at capture, so the break reads stale values at replay")
class NestedArgumentsSnapshotted(GraphCapturer):
    session_class = _NestedSnapshotSession


def _freeze_python_values(value: Any) -> Any:
    if isinstance(value, (torch.Tensor, type)) or callable(value):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_freeze_python_values(item) for item in value)
    if isinstance(value, dict):
        return {key: _freeze_python_values(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        return copy.copy(value)  # same tensors, but its Python attributes keep their capture-time values
    return value


class _FrozenMetadataSession(_ArgumentsRewritingSession):
    def keep_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _freeze_python_values(args), _freeze_python_values(kwargs)


@MUTANTS.add("metadata-frozen", bug="break arguments are flattened at capture like a pytree: tensors stay live, but "
         "Python values in metadata objects and dicts (sequence lengths, steps, scales) are frozen")
class MetadataFrozen(GraphCapturer):
    session_class = _FrozenMetadataSession


def _rebuild_sequences(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild_sequences(item) for item in value)
    return value


class _RebuiltSequencesSession(_ArgumentsRewritingSession):
    def keep_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _rebuild_sequences(args), {name: _rebuild_sequences(value) for name, value in kwargs.items()}


@MUTANTS.add("list-arguments-rebuilt", bug="each list or tuple argument of a break is rebuilt at capture with the "
         "same members (tensors stay live, dicts and objects are kept): the break reads the members the caller's "
         "list had at capture, not the ones it has now (SGLang 0.5.23's _weak_ref_if_tensor)")
class ListArgumentsRebuilt(GraphCapturer):
    session_class = _RebuiltSequencesSession


# --- what a break returns: how its new output reaches the captured one ------------------------------


def _copy_letting_torch_broadcast(captured: torch.Tensor, new: Any) -> torch.Tensor:
    if not isinstance(new, torch.Tensor):
        raise ReplayError(f"a break returned {type(new).__name__} where it returned a tensor at capture")
    try:
        captured.copy_(new)  # broadcasts (1, n) or (n,) over (m, n), casts other dtypes
    except RuntimeError as error:
        raise ReplayError(f"a break's output no longer fits its captured buffer: {error}") from error
    return captured


class _BroadcastingGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        step.output = write_back(step.output, step.fn(*step.args, **step.kwargs),
                                 copy_tensor=_copy_letting_torch_broadcast)


@MUTANTS.add("broadcasting-writeback", bug="write-back lets Tensor.copy_ judge a break's new output: a (1, n) or (n,) "
         "result is broadcast over the captured (m, n) buffer and another dtype is cast, instead of a ReplayError")
class BroadcastingWriteback(GraphCapturer):
    graph_class = _BroadcastingGraph


def _same_structure(captured: Any, new: Any) -> bool:
    if isinstance(captured, torch.Tensor):
        return isinstance(new, torch.Tensor)
    if isinstance(captured, (list, tuple)):
        return type(new) is type(captured) and len(new) == len(captured) and all(
            _same_structure(c, n) for c, n in zip(captured, new))
    if isinstance(captured, dict):
        return isinstance(new, dict) and all(key in new and _same_structure(value, new[key])
                                             for key, value in captured.items())
    if hasattr(captured, "__dict__") or hasattr(type(captured), "__slots__"):
        return type(new) is type(captured)
    return True


class _ReplacingGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        new = step.fn(*step.args, **step.kwargs)
        # A changed structure replaces the captured output; later segments still read the old tensors.
        step.output = write_back(step.output, new) if _same_structure(step.output, new) else new


@MUTANTS.add("structure-change-accepted", bug="a break whose output changes structure at replay (a shorter list, a "
         "dict key gone, a list turned tuple, another class) replaces the captured output silently, so later "
         "segments read stale tensors")
class StructureChangeAccepted(GraphCapturer):
    graph_class = _ReplacingGraph


class _FreshOutputGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        if step.output is self.output:  # "no copy needed": hand the break's new result out directly
            self._fresh_output = step.fn(*step.args, **step.kwargs)
        else:
            super().replay_break(step)

    def replay(self) -> Any:
        self._fresh_output = None
        super().replay()
        return self.output if self._fresh_output is None else self._fresh_output


@MUTANTS.add("output-alias-not-refreshed", bug="when the function's output is a break's output, replay returns the "
         "break's new result but never writes it into graph.output, so a held handle to the output goes stale")
class OutputAliasNotRefreshed(GraphCapturer):
    graph_class = _FreshOutputGraph


# --- faults at replay ---------------------------------------------------------------------------------


class _SwallowingGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        try:
            super().replay_break(step)
        except Exception as error:  # noqa: BLE001 - the bug is exactly this
            warnings.warn(f"break {step.name} failed at replay ({error}); reusing its captured output", stacklevel=2)


@MUTANTS.add("break-error-swallowed", bug="an exception raised by a break at replay is turned into a warning and the "
         "break's capture-time output is reused, so the caller gets stale results instead of the error")
class BreakErrorSwallowed(GraphCapturer):
    graph_class = _SwallowingGraph


class _ResumingGraph(BreakableGraph):
    def replay(self) -> Any:
        start = getattr(self, "_resume_at", 0)
        for position in range(start, len(self.steps)):
            self._resume_at = position  # left here by a failure: the next replay "retries" from this step
            step = self.steps[position]
            if isinstance(step, Break):
                self.replay_break(step)
            else:
                step.replay()
        self._resume_at = 0
        return self.output


@MUTANTS.add("resume-after-fault", bug="a replay that failed at a break leaves its position behind, and the next "
         "replay resumes there, skipping the segments before it (which would have read the refilled inputs)")
class ResumeAfterFault(GraphCapturer):
    graph_class = _ResumingGraph


class _SkipsNoneBreaksGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        if step.output is not None:  # "nothing to write back": a side-effect-only break is never re-run
            super().replay_break(step)


@MUTANTS.add("none-break-skipped", bug="a break that returned None at capture (a KV-cache store writing in place) is "
         "skipped at replay as having nothing to write back, so later segments read the buffer it wrote at capture")
class NoneBreakSkipped(GraphCapturer):
    graph_class = _SkipsNoneBreaksGraph


# --- break outputs and arguments that hold Python values ----------------------------------------------


def _holds_a_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_a_tensor(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_a_tensor(item) for item in value.values())
    if dataclasses.is_dataclass(value):
        return any(_holds_a_tensor(getattr(value, field.name)) for field in dataclasses.fields(value))
    return any(_holds_a_tensor(item) for item in getattr(value, "__dict__", {}).values())


class _ReplacesTensorlessGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        new = step.fn(*step.args, **step.kwargs)
        # "Nothing a segment reads": the new object replaces the captured one, which later breaks still hold.
        step.output = write_back(step.output, new) if _holds_a_tensor(step.output) else new


@MUTANTS.add("tensorless-output-replaced", bug="a break output that holds no tensor (a list of lengths, a plan dict "
         "of ints) is replaced at replay instead of updated in place, so a later break that received it at capture "
         "reads its capture-time values")
class TensorlessOutputReplaced(GraphCapturer):
    graph_class = _ReplacesTensorlessGraph


class _FrozenDictValuesSession(_ArgumentsRewritingSession):
    def keep_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def keep(value: Any) -> Any:  # a dict argument is rebuilt from its leaves: same tensors, frozen numbers
            return dict(value) if isinstance(value, dict) else value

        return tuple(keep(a) for a in args), {name: keep(value) for name, value in kwargs.items()}


@MUTANTS.add("dict-values-frozen", bug="a dict argument of a break is rebuilt at capture from its leaves: its tensors "
         "stay live but its Python values (a gain, a step) keep their capture-time values")
class DictValuesFrozen(GraphCapturer):
    session_class = _FrozenDictValuesSession


# --- views and windows a break returns ------------------------------------------------------------------


def _copy_raw_memory(captured: torch.Tensor, new: Any) -> torch.Tensor:
    copy_tensor(captured, new.clone() if isinstance(new, torch.Tensor) else new)  # the shape, dtype, device checks
    # A memcpy of numel elements from the captured view's first address, in the new tensor's row-major order.
    raw = torch.empty(0, dtype=captured.dtype, device=captured.device).set_(
        captured.untyped_storage(), captured.storage_offset(), (captured.numel(),), (1,))
    raw.copy_(new.reshape(-1))
    return captured


class _RawMemoryGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        step.output = write_back(step.output, step.fn(*step.args, **step.kwargs), copy_tensor=_copy_raw_memory)


@MUTANTS.add("writeback-copies-raw-memory",
             bug="write-back copies a break's new tensor as raw memory from the captured view's first address instead "
                 "of element by element through its strides: right for dense tensors, scrambles column slices of a "
                 "fused buffer and transposed views")
class WritebackCopiesRawMemory(GraphCapturer):
    graph_class = _RawMemoryGraph


def _copy_unless_same_buffer(captured: torch.Tensor, new: Any) -> torch.Tensor:
    if isinstance(new, torch.Tensor) and new.untyped_storage().data_ptr() == captured.untyped_storage().data_ptr():
        return captured  # "the break wrote into the captured buffer itself"
    return copy_tensor(captured, new)


class _SameBufferGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        step.output = write_back(step.output, step.fn(*step.args, **step.kwargs), copy_tensor=_copy_unless_same_buffer)


@MUTANTS.add("window-position-frozen", bug="write-back skips a new output that lives in the captured output's buffer "
         "(taken as written in place), so a break returning a moving window of a ring buffer is read at its "
         "capture-time position")
class WindowPositionFrozen(GraphCapturer):
    graph_class = _SameBufferGraph


# --- random numbers drawn in a break ---------------------------------------------------------------------


class _ReseededBreakGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        # "Deterministic replays": each break runs under the generator state of its first replay.
        states = self.__dict__.setdefault("_break_rng_states", {})
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        saved = states.setdefault(id(step), (torch.get_rng_state(),
                                             [torch.cuda.get_rng_state(d) for d in devices]))
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(saved[0])
            for d, state in zip(devices, saved[1]):
                torch.cuda.set_rng_state(state, d)
            super().replay_break(step)


@MUTANTS.add("break-rng-frozen", bug="breaks replay under the generator state saved at their first replay, so a "
         "sampler or dropout in an eager region draws the same numbers every replay, out of eager's stream")
class BreakRngFrozen(GraphCapturer):
    graph_class = _ReseededBreakGraph


# --- process state a capture changes -----------------------------------------------------------------------


@MUTANTS.add("stance-leaked-on-failure", bug="the capturer forces eager compile stance for the capture and restores it "
         "only when the capture succeeds: after a failed capture compiled functions silently run eagerly")
class StanceLeakedOnFailure(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        torch.compiler.set_stance("force_eager")
        graph = super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        torch.compiler.set_stance("default")
        return graph


class _StateLeakingSession(CaptureSession):
    """Captures under no_grad with the collector off (as CUDA-graph capture code does), and gives both
    back only on the failure path."""

    def publish(self) -> Any:
        self._restore = (torch.is_grad_enabled(), gc.isenabled())
        torch.set_grad_enabled(False)
        gc.disable()
        return super().publish()

    def retract(self, token: Any, *, failed: bool) -> None:
        super().retract(token, failed=failed)
        if failed:
            grad_enabled, collector_enabled = self._restore
            torch.set_grad_enabled(grad_enabled)
            if collector_enabled:
                gc.enable()


@MUTANTS.add("state-leaked-after-success", bug="the capturer turns grad mode and the garbage collector off for the "
         "capture and restores them only when it fails: after a successful capture the process runs without both")
class StateLeakedAfterSuccess(GraphCapturer):
    session_class = _StateLeakingSession


class _BareNamesGraph(BreakableGraph):
    @property
    def break_names(self) -> list[str]:
        return [getattr(step.fn, "__name__", repr(step.fn)) for step in self.steps if isinstance(step, Break)]


@MUTANTS.add("bare-break-names", bug="break names are the functions' bare __name__: every layer's `forward` or "
         "`attend` reads alike, whatever class or scope it belongs to")
class BareBreakNames(GraphCapturer):
    graph_class = _BareNamesGraph


class _CopyingReplayGraph(BreakableGraph):
    def replay(self) -> Any:
        super().replay()
        return copy.deepcopy(self.output)


@MUTANTS.add("replay-returns-copy", bug="replay() returns a copy of graph.output: right at that replay, stale from the "
         "next one for a caller that kept the handle")
class ReplayReturnsCopy(GraphCapturer):
    graph_class = _CopyingReplayGraph


# --- what a capture leaves behind and what a replay hands out, beyond the values -----------------------------


@MUTANTS.add("tf32-left-on", bug="the capturer allows TF32 matmuls for the capture (float32 matmul precision "
         "'high', as engines do for speed) and never gives the caller's precision back")
class Tf32LeftOn(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        torch.set_float32_matmul_precision("high")
        return super().capture(fn, pool=pool, warmup_runs=warmup_runs)


@MUTANTS.add("module-left-in-eval", bug="a module (or a module's bound method) handed to capture is put in eval mode "
         "for the capture, as graphs are for inference, and left there: the caller's training flag is lost")
class ModuleLeftInEval(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            owner.eval()
        return super().capture(fn, pool=pool, warmup_runs=warmup_runs)


@MUTANTS.add("captured-without-grad", bug="warm-up and capture run under torch.no_grad() to save memory (the mode is "
         "given back): a grad-mode caller's replayed outputs are detached where eager's require grad")
class CapturedWithoutGrad(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        with torch.no_grad():
            return super().capture(fn, pool=pool, warmup_runs=warmup_runs)


def _dense_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device=value.device).copy_(value)
    if isinstance(value, list):
        return [_dense_copy(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_dense_copy(item) for item in value)
    if isinstance(value, dict):
        return {key: _dense_copy(item) for key, item in value.items()}
    return value


class _DenseOutputGraph(BreakableGraph):
    def __init__(self, steps: list, output: Any) -> None:
        super().__init__(steps, output)
        self._captured_output = output
        with torch.no_grad():
            self.output = _dense_copy(output)  # preallocated dense output buffers

    def replay(self) -> Any:
        super().replay()  # refreshes the captured objects, which the caller no longer holds
        with torch.no_grad():
            return write_back(self.output, self._captured_output)


@MUTANTS.add("dense-static-outputs", bug="the graph's outputs are copied into preallocated dense static buffers, "
         "refreshed at every replay: the values are right and handles stay valid, but an output's strides, its "
         "autograd facts and its aliasing with the static inputs are not eager's")
class DenseStaticOutputs(GraphCapturer):
    graph_class = _DenseOutputGraph


# --- concurrent callers: state that belongs to one thread, or to one graph, shared by all -------------------


class _ProcessWideSlot:
    """A process-wide stand-in for the seam's receiver variable, with a ContextVar's get/set/reset: the capture
    state an engine keeps in a module-level flag (``is_capture_mode``) instead of per thread."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value

    def set(self, value: Any) -> Any:
        previous, self.value = self.value, value
        return previous

    def reset(self, previous: Any) -> None:
        self.value = previous


class _ProcessWideSession(CaptureSession):
    def publish(self) -> Any:
        self._variable = _seam._RECEIVER
        _seam._RECEIVER = _ProcessWideSlot(self._variable.get())  # type: ignore[assignment]
        return super().publish()

    def retract(self, token: Any, *, failed: bool) -> None:
        try:
            super().retract(token, failed=failed)
        finally:
            _seam._RECEIVER = self._variable


@MUTANTS.add("capture-state-process-wide", bug="the capture in progress is kept in a process-wide slot, not per "
         "thread: exactly right for one thread, but while one thread captures, every other thread's breaks are "
         "sent into that capture and is_capturing() is true there")
class CaptureStateProcessWide(GraphCapturer):
    session_class = _ProcessWideSession


class _SharedSlotGraph(BreakableGraph):
    # The break being replayed, kept where the fault report and the write-back read it: one slot for every graph.
    replaying: Break | None = None

    def replay_break(self, step: Break) -> None:
        _SharedSlotGraph.replaying = step
        new = step.fn(*step.args, **step.kwargs)
        current = _SharedSlotGraph.replaying
        current.output = write_back(current.output, new)


@MUTANTS.add("replaying-break-shared", bug="replay keeps the break it is running in one slot shared by every graph "
         "and writes the break's result back through it: right for one replay at a time, but two graphs replayed "
         "from two threads at once write one break's result into the other graph's captured output")
class ReplayingBreakShared(GraphCapturer):
    graph_class = _SharedSlotGraph


# --- warm-up (CUDA only: the emulated backend does not model it) and memory pools ---------------------------


@MUTANTS.add("warm-up-skipped", backends={"cuda"}, bug="the capturer skips the warm-up (the capture runs the "
         "function anyway), so state created lazily on the first call is created inside the graph")
class WarmUpSkipped(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        return super().capture(fn, pool=pool, warmup_runs=0)


_PROCESS_POOLS: dict[int, Any] = {}
# Every graph captured into the shared pool, kept for the process as an engine keeps its graphs: a pool
# whose graphs all died is released, and capturing into its handle again trips the caching allocator's
# internal assert, a crash that is not the bug this mutant stands for.
_GRAPHS_IN_SHARED_POOLS: list[BreakableGraph] = []


@MUTANTS.add("default-pool-shared", bug="a capture given no pool uses one pool shared by every "
         "such capture, so an unrelated graph's replay overwrites memory another graph's output lives in")
class DefaultPoolShared(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        if pool is not None:
            return super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        if id(type(self.backend)) not in _PROCESS_POOLS:
            _PROCESS_POOLS[id(type(self.backend))] = shared = self.new_pool()
            # A first graph pins the pool for the process, also when a later capture fails half-way.
            pin = torch.zeros(1, device=getattr(self.backend, "device", None))
            _GRAPHS_IN_SHARED_POOLS.append(super().capture(lambda: pin + 1, pool=shared))
        graph = super().capture(fn, pool=_PROCESS_POOLS[id(type(self.backend))], warmup_runs=warmup_runs)
        _GRAPHS_IN_SHARED_POOLS.append(graph)
        return graph


# --- pool lifetime: what the capturer keeps alive in a shared pool ------------------------------------------


class _WeakTensor:
    """What a weak reference to a break argument keeps (SGLang's ``weak_ref_tensors``, vLLM's ``weak_ref_tensor``):
    the tensor's memory and geometry, not its ownership. While the storage lives (the program, or the emulated
    pool's graphs, still hold it) it is read there; on CUDA, once it is gone, an unowned alias reads whatever the
    allocator has put at its address since, as theirs does; a released host tensor cannot be read safely."""

    def __init__(self, tensor: torch.Tensor) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        storage = tensor.untyped_storage()
        self.storage = StorageWeakRef(storage)
        self.address, self.nbytes = storage.data_ptr(), storage.nbytes()
        self.geometry = (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        self.dtype, self.device = tensor.dtype, tensor.device

    def resolve(self) -> torch.Tensor:
        if not self.storage.expired():
            storage = torch.UntypedStorage._new_with_weak_ptr(self.storage.cdata)
        elif self.device.type == "cuda":
            storage = torch._C._construct_storage_from_data_pointer(self.address, self.device, self.nbytes)
        else:
            raise ReplayError("a tensor a break reads or writes, held by a weak reference, was released, and host "
                              "memory cannot be read after it is freed")
        return self.over(storage)

    def over(self, storage: torch.UntypedStorage) -> torch.Tensor:
        """A tensor of the held geometry and dtype over ``storage``."""
        offset, shape, stride = self.geometry
        with torch.no_grad():
            return torch.empty((0,), dtype=self.dtype, device=self.device).set_(storage, offset, shape, stride)


def _weakly(value: Any) -> Any:
    return _WeakTensor(value) if isinstance(value, torch.Tensor) and value.numel() > 0 else value


class _WeakArgumentsSession(CaptureSession):
    def run_break(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        output = super().run_break(fn, args, kwargs)
        step = self.steps[-1]  # the break's output stays a strong reference, its tensor arguments do not
        step.args = tuple(_weakly(value) for value in step.args)
        step.kwargs = {name: _weakly(value) for name, value in step.kwargs.items()}
        return output


class _WeakArgumentsGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        def resolve(value: Any) -> Any:
            return value.resolve() if isinstance(value, _WeakTensor) else value

        args = tuple(resolve(value) for value in step.args)
        kwargs = {name: resolve(value) for name, value in step.kwargs.items()}
        step.output = write_back(step.output, step.fn(*args, **kwargs))


@MUTANTS.add("break-args-held-weakly", bug="a break's tensor arguments are kept as weak references (SGLang 0.5.23's "
         "_weak_ref_if_tensor, vLLM 0.33.0's weak_ref_tensor): once the program drops a segment's intermediate "
         "passed to a break, its block in the shared pool is free, a later capture re-carves it, and the break "
         "reads that graph's data whenever it replays between the segment and the break (SGLang #37606)")
class BreakArgumentsHeldWeakly(GraphCapturer):
    session_class = _WeakArgumentsSession
    graph_class = _WeakArgumentsGraph


class _WeakBreakOutputSession(CaptureSession):
    def run_break(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        output = super().run_break(fn, args, kwargs)
        self.steps[-1].output = _weakly(output)  # what the break returned: the program's, not the graph's
        return output


class _WeakBreakOutputGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        if not isinstance(step.output, _WeakTensor):
            super().replay_break(step)
            return
        write_back(step.output.resolve(), step.fn(*step.args, **step.kwargs))


@MUTANTS.add("break-output-held-weakly", bug="a break's tensor output, allocated in the eager region outside the "
             "graph's pool, is kept as a weak reference (SGLang #30584, TensorRT-LLM PR 17500): once the program "
             "drops it the caching allocator hands its block to a later allocation, and every replay copies the "
             "break's result into that reassigned address, over whatever lives there now")
class BreakOutputHeldWeakly(GraphCapturer):
    session_class = _WeakBreakOutputSession
    graph_class = _WeakBreakOutputGraph


class _WeakOutputTensor(_WeakTensor):
    """A graph's output held as a weak reference: the tensor itself while anyone else holds it, after that an alias at
    its address that owns nothing, made in the autograd mode the output was made in."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__(tensor)
        self.tensor = weakref.ref(tensor)
        self.inference = tensor.is_inference()

    def resolve(self) -> torch.Tensor:
        tensor = self.tensor()
        if tensor is not None:
            return tensor
        # By address on every device: a storage object revived from the weak reference would own the block again.
        with torch.inference_mode(self.inference):
            return self.over(torch._C._construct_storage_from_data_pointer(self.address, self.device, self.nbytes))


class _WeakOutputGraph(BreakableGraph):
    @property  # type: ignore[override]
    def output(self) -> Any:
        kept = self._kept
        return kept.resolve() if isinstance(kept, _WeakOutputTensor) else kept

    @output.setter
    def output(self, value: Any) -> None:
        self._kept = _WeakOutputTensor(value) if isinstance(value, torch.Tensor) and value.numel() else value


@MUTANTS.add("output-held-weakly", bug="keeps a tensor output of the graph as a weak reference only, as a runner that "
             "keeps weak_ref_tensor views of its graphs' outputs (TensorRT-LLM #17010): once the program holds no "
             "reference to it, its block in the shared pool is free, a later capture re-carves it, and the output "
             "reads that graph's data after it replays")
class OutputHeldWeakly(GraphCapturer):
    graph_class = _WeakOutputGraph


@MUTANTS.add("keeps-every-graph", bug="keeps every graph it captured in a list of its own (for a reset of them all "
             "later): a graph the program drops, with its pool and its output, is never released, and a runner that "
             "captures a bucket again grows by one graph each time")
class KeepsEveryGraph(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        graph = super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        vars(self).setdefault("_captured", []).append(graph)
        return graph


class _CarriedStepsSession(CaptureSession):
    def __init__(self, backend: Any, pool: Any, *, steps: list[Any]) -> None:
        super().__init__(backend, pool)
        self.steps = steps  # the capturer's recording list, kept from its earlier captures


@MUTANTS.add("capture-steps-carried", bug="the capturer records every capture into one list it keeps (cleared only "
             "when it is built), so a graph captured after another holds the earlier graph's segments and breaks "
             "too (SGLang PR 32288's class: state of one capture recorded into a later one): B captured after A "
             "replays A first and rewrites A's output from A's inputs of the moment, where B captured alone does not")
class CaptureStepsCarried(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        steps = vars(self).setdefault("_recording", [])
        self.session_class = functools.partial(_CarriedStepsSession, steps=steps)  # type: ignore[assignment]
        graph = super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        graph.steps = list(steps)
        return graph


class _DroppedHandlerSession(CaptureSession):
    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.end_segment()
        with receive_breaks(INLINE_BREAKS):
            output = fn(*args, **kwargs)  # raising here leaves no segment open: the handler's ops go unrecorded
        self.steps.append(Break(fn, args, kwargs, output))
        self.begin_segment()
        return output


@MUTANTS.add("drops-handled-region", bug="a break that raises during capture, handled by the program, ends the "
             "segment for good: the handler's ops up to the next break are not recorded, and replay reuses their "
             "capture-time values")
class DropsHandledRegion(GraphCapturer):
    session_class = _DroppedHandlerSession


class _FailedBreakFrozenGraph(BreakableGraph):
    def replay_raised_break(self, step: RaisedBreak) -> None:
        pass  # the failed break is taken as done: its partial work stays capture's


@MUTANTS.add("failed-break-frozen", bug="a break that raised during capture is recorded but not run at replay: its "
             "partial work keeps its capture-time values, and a replay where it would no longer raise goes on")
class FailedBreakFrozen(GraphCapturer):
    graph_class = _FailedBreakFrozenGraph


def _containers(value: Any, seen: set[int] | None = None) -> list[Any]:
    """Every list, dict and object with attributes reachable in a break output (cycles allowed), outermost first."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor) or id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        found, items = [value], list(value.values())
    elif isinstance(value, (list, tuple)):
        found, items = ([value] if isinstance(value, list) else []), list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value):
        found, items = [value], list(vars(value).values())
    else:
        return []
    return found + [inner for item in items for inner in _containers(item, seen)]


class _CaptureOrderGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        orders = [(d, list(d)) for d in _containers(step.output) if isinstance(d, dict)]
        super().replay_break(step)
        for d, before in orders:  # keys kept where they were, keys that came back appended
            for key in [k for k in before if k in d] + [k for k in list(d) if k not in before]:
                d[key] = d.pop(key)


@MUTANTS.add("writeback-keeps-key-order", bug="a dict written back keeps its capture-time key order and appends keys "
             "that come back at the end, so whoever iterates it (a later break, the caller) meets its members in "
             "another order than eager's new dict")
class WritebackKeepsKeyOrder(GraphCapturer):
    graph_class = _CaptureOrderGraph


class _PositionalRaisedBreakGraph(BreakableGraph):
    def replay_raised_break(self, step: RaisedBreak) -> None:
        super().replay_raised_break(dataclasses.replace(step, kwargs={}))


@MUTANTS.add("raised-break-keywords-dropped", bug="a break that raised at capture (a fast path refusing a shape) is "
             "called again at replay with its positional arguments only, so it raises another error and the replay "
             "fails where eager takes the captured handler")
class RaisedBreakKeywordsDropped(GraphCapturer):
    graph_class = _PositionalRaisedBreakGraph


class _PositionalInlineBreaks:
    in_break_body = True

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return fn(*args)


class _PositionalInlineSession(CaptureSession):
    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.end_segment()
        try:
            with receive_breaks(_PositionalInlineBreaks()):
                output = fn(*args, **kwargs)
        except Exception as error:
            self.steps.append(RaisedBreak(fn, args, kwargs, None, type(error)))
            self.begin_segment()
            raise
        self.steps.append(Break(fn, args, kwargs, output))
        self.begin_segment()
        return output


@MUTANTS.add("nested-break-keywords-dropped", bug="a break called inside a break body during capture (an attention "
             "wrapper calling a kernel that is a break too) gets its positional arguments only")
class NestedBreakKeywordsDropped(GraphCapturer):
    session_class = _PositionalInlineSession


def _is_immutable_record(value: Any) -> bool:
    return isinstance(value, tuple) or (dataclasses.is_dataclass(value) and not isinstance(value, type)
                                        and value.__dataclass_params__.frozen)  # type: ignore[union-attr]


def _members_holding_records(value: Any) -> list[tuple[Any, Any, Any]]:
    """(container, key or attribute name, the tuple or frozen dataclass it holds) for every such member."""
    found = []
    for container in _containers(value):
        if isinstance(container, (dict, list)):
            pairs = container.items() if isinstance(container, dict) else enumerate(container)
            found += [(container, key, item) for key, item in pairs if _is_immutable_record(item)]
        else:
            found += [(container, name, item) for name, item in vars(container).items() if _is_immutable_record(item)]
    return found


class _StaleRecordGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        records = _members_holding_records(step.output)
        super().replay_break(step)
        for container, key, old in records:  # the new tuple or frozen dataclass is dropped, the old one stays
            if isinstance(container, (dict, list)):
                if (key in container if isinstance(container, dict) else key < len(container)):
                    container[key] = old
            elif hasattr(container, key):
                setattr(container, key, old)


@MUTANTS.add("immutable-records-stale", bug="write-back updates tuples, namedtuples and frozen dataclasses only "
             "through their mutable members: one whose Python value changed (a namedtuple of step counts in a dict) "
             "keeps its capture-time value where eager returns the new one")
class ImmutableRecordsStale(GraphCapturer):
    graph_class = _StaleRecordGraph


class _AttributesKeptGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        objects = [(o, dict(vars(o))) for o in _containers(step.output)
                   if not isinstance(o, (dict, list)) and not dataclasses.is_dataclass(o)]
        super().replay_break(step)
        for obj, before in objects:  # an attribute the new object lacks stays with its capture-time value
            for name, value in before.items():
                if not hasattr(obj, name):
                    setattr(obj, name, value)


@MUTANTS.add("lost-attributes-kept", bug="an object a break returns that lacks an attribute at replay keeps the "
             "attribute it had at capture, where eager's new object has none")
class LostAttributesKept(GraphCapturer):
    graph_class = _AttributesKeptGraph


class _ChangedLeafAcceptedGraph(BreakableGraph):
    def replay_break(self, step: Break) -> None:
        try:
            super().replay_break(step)
        except ReplayError as error:
            if "returned another value" not in str(error):
                raise  # only a changed immutable leaf outside any container (a dtype in a tuple) is let through


@MUTANTS.add("changed-leaf-accepted", bug="a break output whose immutable leaf changed where no list, dict or object "
             "can take the new one (a dtype in a tuple) is accepted silently: the holders keep the capture-time leaf")
class ChangedLeafAccepted(GraphCapturer):
    graph_class = _ChangedLeafAcceptedGraph


@contextlib.contextmanager
def _torch_defaults() -> Iterator[None]:
    """torch's own defaults for the block (float32 default dtype, autocast off), the caller's put back after it."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            yield
    finally:
        torch.set_default_dtype(dtype)


@MUTANTS.add("captures-in-defaults", bug="captures under torch's defaults (float32 default dtype, autocast off) "
             "whatever context the caller set, and puts the caller's back after: an engine configured for bfloat16 "
             "or autocast gets graphs of another program than the one it runs eagerly")
class CapturesInDefaults(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        with _torch_defaults():
            return super().capture(fn, pool=pool, warmup_runs=warmup_runs)


class _UnjoinedBreakStreamGraph(BreakableGraph):
    _side: Any = None

    def replay_break(self, step: Break) -> None:
        if isinstance(step, RaisedBreak) or not torch.cuda.is_available():
            super().replay_break(step)
            return
        caller = torch.cuda.current_stream()
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(caller)
        with torch.cuda.stream(self._side):
            super().replay_break(step)
        # the way back is forgotten: the next segment replays on the caller's stream at once


@MUTANTS.add("break-on-unjoined-stream", backends={"cuda"}, bug="replay runs each eager break on a side stream "
             "ordered after the caller's, and replays the next segment without waiting for it (vLLM #57759): the "
             "segment reads the break's output buffer before the break has written it")
class BreakOnUnjoinedStream(GraphCapturer):
    graph_class = _UnjoinedBreakStreamGraph


@MUTANTS.add("warms-up-on-a-side-stream", backends={"cuda"}, bug="the warm-up runs on a fresh side stream of its "
             "own, as torch's documentation shows, and the capture on another (vLLM PR 53818): state a library keeps "
             "per stream is missing for the capture stream, and a library that refuses to create it during a capture "
             "fails the capture")
class WarmsUpOnASideStream(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        from harness.graphs._cuda import _on_own_stream  # the backend's stream switch, which the widener skips

        caller = torch.cuda.current_stream()
        for _ in range(warmup_runs):
            side = torch.cuda.Stream()
            side.wait_stream(caller)
            with _on_own_stream(side):
                fn()
            caller.wait_stream(side)
        return super().capture(fn, pool=pool, warmup_runs=0)


class _WaitDroppingSession(CaptureSession):
    def wait_on_uncaptured_stream(self, stream: Any, other: Any) -> None:
        return  # skipped so that the capture goes through; the order with ``other`` is lost at replay


@MUTANTS.add("wait-on-outside-stream-dropped", backends={"cuda"}, bug="during a capture, a capturing stream's "
             "wait_stream on a stream that is not capturing is skipped so that the capture goes through (SGLang "
             "0.5.23's wait-stream hook, TensorRT-LLM PR 16609's review): a segment that joins a break's prefetch "
             "stream reads the prefetch buffer before the side stream wrote it at every replay")
class WaitOnOutsideStreamDropped(GraphCapturer):
    session_class = _WaitDroppingSession


# Every aborted capture's session, kept for a post-mortem nobody reads.
_ABORTED_SESSIONS: list[CaptureSession] = []


class _KeepsAbortedSession(CaptureSession):
    def abort(self) -> None:
        super().abort()
        _ABORTED_SESSIONS.append(self)


@MUTANTS.add("failed-capture-kept", bug="a capture aborted by an error keeps its session, with the segments and "
             "break records it made, alive for diagnostics (PyTorch #188439): every failed capture leaks what it "
             "allocated")
class FailedCaptureKept(GraphCapturer):
    session_class = _KeepsAbortedSession


@MUTANTS.add("cast-cache-off-for-capture", backends={"cuda"}, bug="turns autocast's cast cache off for the warm-up and "
             "the capture and back on after, whether autocast is on or not: Dynamo guards on that setting, so every "
             "compiled function the program calls compiles once more when a bucket is captured at serving time "
             "(vLLM #57227's class: a compile inside the capture procedure)")
class CastCacheOffForCapture(GraphCapturer):
    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        enabled = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            return super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        finally:
            torch.set_autocast_cache_enabled(enabled)
