"""One call of an implementation checked against its eager twin on everything a caller can observe."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from harness.compare import ComputeSettings, assert_equivalent, format_context
from harness.errors import MismatchError
from harness.hazards import poison_free_memory
from harness.oracle import _contexts, _facts, _recording, _resources, _state
from harness.oracle._allowed import allowed

__all__ = ["CALLING_MODES", "calling_mode", "Checker", "check_call"]

CALLING_MODES = ("grad", "no_grad", "inference_mode")


@contextlib.contextmanager
def calling_mode(mode: str | None) -> Iterator[None]:
    """The caller's autograd mode: ``grad``, ``no_grad``, ``inference_mode``; None keeps the current one."""
    if mode is None:
        yield
    elif mode == "grad":
        with torch.enable_grad():
            yield
    elif mode == "no_grad":
        with torch.no_grad():
            yield
    elif mode == "inference_mode":
        with torch.inference_mode():
            yield
    else:
        raise ValueError(f"unknown calling mode {mode!r}: expected one of {', '.join(CALLING_MODES)}")


@dataclasses.dataclass
class _Snapshot:
    process: dict[str, Any]
    modules: dict[str, Any]
    inputs: dict[str, Any]
    rng: tuple[torch.Tensor, ...]


def _input_state(inputs: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for path, tensor in _facts.tensors_in(inputs, "input"):
        state[f"{path} metadata"] = _facts.facts_of(tensor)
        state[f"{path} values"] = tensor.detach().clone()
    return state


def _snapshot(modules: Sequence[torch.nn.Module], inputs: Any) -> _Snapshot:
    return _Snapshot(_state.process_state(), _state.module_state(modules), _input_state(inputs), _state.rng_state())


def _new_changes(start: dict[str, Any], after_eager: dict[str, Any], after_candidate: dict[str, Any]) -> list[str]:
    """What the candidate changed that eager left as it was (eager ran first, from ``start``)."""
    by_eager = set(_state.changes(start, after_eager))
    return [name for name in _state.changes(after_eager, after_candidate) if name not in by_eager]


class Checker:
    """Runs calls of one component's implementation beside their eager twin and raises
    :class:`~harness.errors.MismatchError` on any difference a caller could observe that :data:`ALLOWED` does not
    list: values (bitwise or by the tolerance table), each output's metadata and aliasing, the process, module and
    input state the call leaves, the random state, and whether the results of the previous call survive this one.

    One checker per test: it keeps the results of the last ``keep`` calls (the previous call's by default) to check
    that each later call leaves them alone; a larger ``keep`` also catches results that survive one call and not
    the next few (output buffers used in turn)."""

    def __init__(self, component: str, *, context: Callable[..., Mapping[str, Any]] | None = None,
                 keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"a checker keeps the results of at least the previous call, got keep={keep}")
        self.component = component
        self._context = context
        self._kept: collections.deque[list[tuple[str, torch.Tensor, torch.Tensor]]] = collections.deque(maxlen=keep)

    def call(self, candidate: Callable[[], Any], eager: Callable[[], Any], *, inputs: Any = (),
             eager_inputs: Any = None, modules: Sequence[torch.nn.Module] = (), exact: bool,
             mode: str | None = None, **details: Any) -> Any:
        """Run ``eager()`` then ``candidate()`` (each under the caller's ``mode``, from the same random state) and
        return the candidate's result after checking it. ``inputs`` are the arguments both read (for aliasing and
        writes), ``modules`` the modules they run; ``details`` go into the failure message.

        ``eager_inputs``: where eager runs on a twin of the candidate's inputs (a program that writes its own state,
        a KV cache or an accumulator, cannot run twice on one), the twin, in the same structure. Each side then
        writes its own copy, and every tensor of ``inputs`` must end as its twin ends: values (bitwise if ``exact``,
        else the tolerance table) and metadata; aliasing is judged against each side's own inputs."""
        __tracebackhide__ = True
        twin = eager_inputs is not None
        # Inside a hypothesis example, a caller's context (settings torch has a setter for) is drawn for every call:
        # eager in the same context is the oracle (harness.oracle._contexts). A component that replays what it
        # captured holds one context from its first capture to the example's end: in force already, not set again.
        lifecycle = _contexts.spans_lifecycle(self.component)
        context = (_contexts.example_caller_context(self.component, enter=False) if lifecycle
                   else _contexts.drawn_caller_context(self.component))
        if context:
            details = {**details, "caller context": _contexts.described(context)}
        # Set again for the call even where held (a value set back to itself changes nothing): leaving an
        # inference_mode block restores the thread's dispatch keys, so autocast set inside one ends with it.
        with calling_mode(mode), _contexts.caller_context_applied(context):
            start = _snapshot(modules, inputs)
            # A context held across calls stands for a caller entering it around each call, as torch.autocast does,
            # whose exit empties autocast's cast cache: a cast cached by an earlier call (weights since written in
            # place) must not serve this one, on either side.
            torch.clear_autocast_cache()
            # Memory nobody owns holds NaN bytes when each side starts (harness.hazards; on CUDA): a read of it,
            # which eager makes too, gives NaN on both sides; one the candidate alone makes shows.
            poison_free_memory()
            expected = eager()
            after_eager = _snapshot(modules, eager_inputs if twin else inputs)
            _state.set_rng_state(start.rng)
            torch.clear_autocast_cache()
            poison_free_memory()
            actual = candidate()
            after_candidate = _snapshot(modules, inputs)
            settings = ComputeSettings.now()  # the precision both sides computed in, for the tolerance
        problems = []
        try:
            assert_equivalent(actual, expected, exact=exact, settings=settings)
        except MismatchError as mismatch:
            problems.append(f"values: {mismatch}")
        problems += self._kept_results_changed()
        problems += self._output_differences(actual, expected, inputs, eager_inputs if twin else inputs)
        problems += self._state_differences(start, after_eager, after_candidate, inputs=not twin)
        if twin:
            problems += self._twin_differences(after_eager.inputs, after_candidate.inputs, exact=exact,
                                               settings=settings)
        self._keep(actual)
        self._raise(problems, self._details(mode=mode, **details))
        return actual

    def construct(self, build: Callable[[], Any], *, modules: Sequence[torch.nn.Module], what: str = "construction",
                  **details: Any) -> Any:
        """Run ``build()`` (a runner's or capturer's construction) and check it leaves the process and ``modules``
        as eager, which builds nothing, would: no parameter, buffer, hook, flag or ``forward`` changed. ``what``
        names it in a failure: also a call that must leave them as it found them (one that raises, as eager
        raising from the same place would)."""
        __tracebackhide__ = True
        context: Mapping[str, Any] = {}
        if _contexts.spans_lifecycle(self.component):  # the caller's context, from this capture to the example's end
            context = _contexts.example_caller_context(self.component)
            if context:
                details = {**details, "caller context": _contexts.described(context)}
        with _contexts.caller_context_applied(context):  # set again, as in call
            before = _snapshot(modules, ())
            built = build()
            after = _snapshot(modules, ())
        poison_free_memory()  # what the construction (a capture) released, before anything replays over it
        _state.set_rng_state(before.rng)  # construction may draw (warm-up inputs); the caller's stream is theirs
        problems = self._state_differences(before, before, after, rng=False)
        self._raise(problems, self._details(**details, call=what))
        return built

    def released(self, candidate: Callable[[], Mapping[str, Any]], eager: Callable[[], Mapping[str, Any]],
                 **details: Any) -> None:
        """Check the candidate keeps alive nothing more than eager once the caller lets go. Each of ``candidate``
        and ``eager`` is a session: it builds what a caller holds (inputs, models, outputs, a graph), makes its
        calls, and returns those objects as ``{name: object}``, keeping no other reference; each object (or each
        tensor inside a tuple or dict) is then followed by a weak reference after the caller's are dropped."""
        __tracebackhide__ = True
        kept_by_eager = set(_resources.survivors(eager))
        kept = [name for name in _resources.survivors(candidate) if name not in kept_by_eager]
        problems = [self._differs("objects kept alive", f"{', '.join(kept)} still alive after the caller dropped "
                                                        f"every reference and the collector ran; eager keeps "
                                                        f"{sorted(kept_by_eager) or 'nothing'} (a strong reference "
                                                        f"kept by the implementation)")] if kept else []
        self._raise(problems, self._details(**details, call="release"))

    def steady(self, candidate: Callable[[], Any], eager: Callable[[], Any], *, calls: int, **details: Any) -> None:
        """Check a long run of the candidate grows no more than eager's: live tensors, their bytes, and the device
        allocator's bytes after ``calls`` calls and after ``2 * calls`` (``candidate``/``eager`` each make one call
        and drop its result); a per-call cache grows with the run, a warm-up does not."""
        __tracebackhide__ = True
        eager_growth = _resources.growth(eager, calls=calls)
        grown = _resources.growth(candidate, calls=calls)
        over = [f"{field} +{getattr(grown, field)} (eager's +{getattr(eager_growth, field)})"
                for field in ("tensors", "tensor_bytes", "device_bytes")
                if getattr(grown, field) > max(getattr(eager_growth, field), 0)]
        problems = [self._differs("growth over a run", f"from call {calls} to call {2 * calls} the process gained "
                                                       f"{', '.join(over)}: something kept per call")] if over else []
        self._raise(problems, self._details(**details, call=f"{2 * calls} calls"))

    def _details(self, **details: Any) -> Mapping[str, Any]:
        shown = {key: value for key, value in details.items() if value is not None}
        return self._context(**shown) if self._context else shown

    def _raise(self, problems: list[str], context: Mapping[str, Any]) -> None:
        __tracebackhide__ = True
        problems = [p for p in problems if p]
        if problems:
            shown = problems[:6] + ([f"... and {len(problems) - 6} more"] if len(problems) > 6 else [])
            error = MismatchError(f"{self.component}: observably different from eager (harness.oracle):\n  "
                                  + "\n  ".join(shown) + format_context(context))
            error.problems, error.context = problems, format_context(context)  # type: ignore[attr-defined]
            _recording.deliver(error)  # raised, or recorded in a conformance run

    def _differs(self, fact: str, message: str) -> str:
        return "" if allowed(self.component, fact) else f"{fact}: {message}"

    def _output_differences(self, actual: Any, expected: Any, inputs: Any, eager_inputs: Any) -> list[str]:
        mine, theirs = dict(_facts.tensors_in(actual)), dict(_facts.tensors_in(expected))
        problems = []
        for path in theirs.keys() & mine.keys():
            a, e = _facts.facts_of(mine[path]), _facts.facts_of(theirs[path])
            for field in ("strides", "contiguous", "requires_grad", "is_inference", "attached_to_autograd"):
                got, want = getattr(a, field), getattr(e, field)
                if got != want:
                    fact = "output strides" if field in ("strides", "contiguous") else f"output {field}"
                    fact = "output attached to autograd" if field == "attached_to_autograd" else fact
                    problems.append(self._differs(fact, f"{path} has {field} {got}, eager's {want}"))
        for path in [path for path in mine if path in theirs]:
            held, eager_held = _resources.storage_bytes(mine[path]), _resources.storage_bytes(theirs[path])
            if held > eager_held:  # a narrow view of a larger buffer keeps all of it alive for as long as it lives
                problems.append(self._differs(
                    "output storage", f"{path} keeps {held} bytes of storage alive for its "
                                      f"{mine[path].numel() * mine[path].element_size()} bytes of elements, "
                                      f"eager's {eager_held} bytes"))
        mine_shared = _facts.aliases(mine, dict(_facts.tensors_in(inputs)))
        theirs_shared = _facts.aliases(theirs, dict(_facts.tensors_in(eager_inputs)))
        for path in theirs.keys() & mine.keys():
            if mine_shared[path] != theirs_shared[path]:
                problems.append(self._differs(
                    "output aliasing", f"{path} shares memory with {sorted(mine_shared[path]) or 'nothing'}, "
                                       f"eager's with {sorted(theirs_shared[path]) or 'nothing'}"))
        return problems

    def _state_differences(self, start: _Snapshot, after_eager: _Snapshot, after_candidate: _Snapshot, *,
                           rng: bool = True, inputs: bool = True) -> list[str]:
        problems = []
        parts = (("process state", "process"), ("module state", "modules")) + ((("input values", "inputs"),)
                                                                                if inputs else ())
        for fact, part in parts:
            changed = _new_changes(getattr(start, part), getattr(after_eager, part), getattr(after_candidate, part))
            # The table may allow one setting ("process state: <name>") without allowing the rest.
            changed = [name for name in changed if not allowed(self.component, f"{fact}: {name}")]
            if changed:
                shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
                problems.append(self._differs(fact, f"the call changed {shown}, which eager leaves as it was"))
        if rng and not _state._same(after_eager.rng, after_candidate.rng):
            problems.append(self._differs("rng", "the random state after the call is not eager's (the call drew "
                                                 "other random numbers, or reseeded)"))
        return problems

    def _twin_differences(self, eager_end: dict[str, Any], candidate_end: dict[str, Any], *, exact: bool,
                          settings: ComputeSettings) -> list[str]:
        """Where the candidate's inputs end other than eager's twin inputs end (``call`` with ``eager_inputs``)."""
        problems = []
        if eager_end.keys() != candidate_end.keys():
            return [self._differs("input values", f"the inputs hold {sorted(candidate_end)}, their eager twin "
                                                  f"{sorted(eager_end)}: not twins")]
        changed = [name for name in eager_end if name.endswith(" metadata")
                   and not _state._same(candidate_end[name], eager_end[name])]
        if changed:
            problems.append(self._differs("input values", f"{', '.join(changed)} after the call "
                                                          f"{[candidate_end[n] for n in changed]}, eager's twin "
                                                          f"{[eager_end[n] for n in changed]}"))
        values = [name for name in eager_end if name.endswith(" values")]
        try:
            assert_equivalent({n: candidate_end[n] for n in values}, {n: eager_end[n] for n in values}, exact=exact,
                              settings=settings)
        except MismatchError as mismatch:
            problems.append(self._differs("input values", f"an input ends other than its eager twin ends: {mismatch}"))
        return problems

    def _kept_results_changed(self) -> list[str]:
        if allowed(self.component, "results outlive the next call"):
            return []  # nothing to compare where the table allows it
        problems = []
        for age, kept in enumerate(reversed(self._kept), start=1):
            changed = [path for path, tensor, values in kept if not _state._same(tensor.detach(), values)]
            if changed:
                which = "the previous call" if age == 1 else f"the call {age} calls before this one"
                problems.append(self._differs("results outlive the next call",
                                              f"{', '.join(changed)} returned by {which} changed when called again "
                                              "(a result must belong to the caller, as eager's do)"))
        return problems[:1]  # the latest call whose results changed; older ones add nothing to the message

    def _keep(self, actual: Any) -> None:
        self._kept.append([(path, tensor, tensor.detach().clone()) for path, tensor in _facts.tensors_in(actual)])


def check_call(component: str, candidate: Callable[[], Any], eager: Callable[[], Any], *, exact: bool,
               inputs: Any = (), modules: Sequence[torch.nn.Module] = (), mode: str | None = None,
               context: Mapping[str, Any] | None = None) -> Any:
    """One checked call without a kept history (see :meth:`Checker.call`)."""
    __tracebackhide__ = True
    extra = dict(context or {})
    return Checker(component, context=lambda **d: {**d, **extra}).call(
        candidate, eager, inputs=inputs, modules=modules, exact=exact, mode=mode)
