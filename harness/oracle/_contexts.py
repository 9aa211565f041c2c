"""The contexts a caller can set around a call, drawn by hypothesis: every setting torch has a setter for.

The settings are those :mod:`harness.oracle._globals` finds; each one's values come from its type (a flag's other
value, fewer threads, another floating default dtype, the strings of :data:`STRING_VALUES`) and are kept only where
torch takes them and reads them back. :func:`caller_contexts` draws a few of them; :class:`harness.oracle.Checker`
applies the drawn context around eager and the candidate alike, inside every hypothesis example, so each property
test draws it without code of its own. Settings a component's contract lets it ignore, or that eager cannot run
under, are left out by :data:`harness.oracle._allowed.NOT_DRAWN` and the allowed table, with the reasons."""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.errors import HarnessError
from harness.oracle import _globals, _state
from harness.oracle._allowed import NOT_DRAWN, allowed

__all__ = ["settable", "caller_contexts", "caller_context_applied", "drawn_caller_context", "described",
           "STRING_VALUES", "ENGINE_SETTINGS", "CONFIGURATIONS", "engine_configurations", "held_contexts",
           "spans_lifecycle", "example_caller_context", "context_key", "entered_contexts"]

# The values of string settings torch accepts but does not list anywhere a program can read.
STRING_VALUES: dict[str, tuple[str, ...]] = {
    "torch.get_float32_matmul_precision": ("highest", "high", "medium"),
}

_FLOATING = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _candidates(name: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, bool):
        return (not value,)
    if isinstance(value, int):
        return tuple(sorted({1, value // 2} - {0, value})) if value > 1 else ()
    if isinstance(value, torch.dtype):
        return tuple(dtype for dtype in _FLOATING if dtype != value)
    if isinstance(value, str):
        return tuple(choice for choice in STRING_VALUES.get(name, ()) if choice != value)
    return ()  # no rule gives values of this type (None, a device, a tuple): not drawn


def _autocast_takes(name: str, value: Any) -> bool:
    """For an autocast dtype setting, whether ``torch.autocast`` (the way a caller sets it) takes ``value`` for its
    device type: the raw setter takes any dtype, but torch.autocast disables itself, with a warning, for a dtype the
    device type does not autocast to (float64 on CPU) or a device type it cannot run, and under such a dtype eager's
    own ops refuse to run (``promote type is double``). Other settings: True."""
    match = re.fullmatch(r"torch\.get_autocast_dtype\('(\w+)'\)", name)
    if match is None:
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            with torch.autocast(match.group(1), dtype=value):
                return True
        except Exception:  # its warning (autocast disabled) or refusal: not a context a caller can hold
            return False


def _takes(setting: _globals.Setting, value: Any) -> bool:
    """Whether torch takes ``value`` for ``setting``, reads it back, and, once the setting is put back, reads every
    setting as before: a write whose write-back leaves another setting moved (a precision that also flips a
    backend's flag) is no context a caller can leave, and drawing it would carry one example's context into the
    next. The setting is put back either way."""
    assert setting.write is not None
    found = _globals.settings()
    everything = _globals.read(found)
    before = setting.read()
    try:
        setting.write(value)
        if not bool(setting.read() == value):
            return False
    except Exception:  # refused (a setting torch allows once, a value it does not know): not a context here
        return False
    finally:
        with contextlib.suppress(Exception):
            setting.write(before)
    return not _state.changes(everything, _globals.read(found))


@functools.cache
def settable() -> dict[str, tuple[_globals.Setting, tuple[Any, ...]]]:
    """``{name: (setting, values)}``: each setting with a setter and the values, other than the current one, that
    torch takes for it; :data:`NOT_DRAWN` left out."""
    found = {}
    for setting in _globals.settings():
        if setting.write is None or setting.name in NOT_DRAWN:
            continue
        values = tuple(value for value in _candidates(setting.name, setting.read())
                       if _takes(setting, value) and _autocast_takes(setting.name, value))
        if values:
            found[setting.name] = (setting, values)
    return found


def caller_contexts(component: str, *, max_settings: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    """A context a caller of ``component`` can set: up to ``max_settings`` settings with a value each (none is the
    simplest, and what a failure shrinks towards); settings the allowed table lets ``component`` ignore left out."""
    if allowed(component, "caller context"):
        return st.just({})  # a component whose contract ignores every caller's context
    choices = {name: values for name, (_, values) in settable().items()
               if not allowed(component, f"caller context: {name}")}
    if not choices:
        return st.just({})
    names = st.lists(st.sampled_from(sorted(choices)), max_size=max_settings, unique=True)
    return names.flatmap(lambda picked: st.fixed_dictionaries({name: st.sampled_from(choices[name])
                                                               for name in picked})).filter(_consistent)


def _consistent(context: Mapping[str, Any]) -> bool:
    """Whether torch still reads every setting while ``context`` is set: some settings refuse together (the
    legacy TF32 flags beside ``float32_matmul_precision``: reading the precision then raises, in eager's own
    matmuls too), and such a mix is no context a caller can run in."""
    with caller_context_applied(context):
        for setting in _globals.settings():
            try:
                setting.read()
            except Exception:  # refused together: not drawn
                return False
    return True


def _running_example() -> Any:
    """The build context of the hypothesis example running in this thread, or None."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        build = current_build_context()
    except InvalidArgument:  # no example is running in this thread
        return None
    # An @example: its data holds no choices to draw from (a draw would end it as invalid), so it runs with none.
    return None if getattr(build.data, "max_choices", None) == 0 else build


def spans_lifecycle(component: str) -> bool:
    """Whether ``component``'s calls replay what an earlier step captured in the context then in force (the
    allowed table's ``"caller context changed after capture"`` row): its caller's context is drawn once per example
    and held from the first capture to the example's end (:func:`example_caller_context`), not per call."""
    return allowed(component, "caller context changed after capture") is not None


# How many settings a context held from capture to last replay may hold: it stands for an engine's configuration,
# which sets several at once (default dtype, deterministic algorithms, threads, matmul precision, autocast).
ENGINE_SETTINGS = 6

# Components whose construction is dear (a runner captures every bucket of its model) draw their held context from
# this many fixed engine configurations, not freely: the suites cache one construction per context, and a context
# drawn afresh for every example rebuilt the runner every example.
CONFIGURATIONS: dict[str, int] = {"runner": 3}


@functools.cache
def engine_configurations(component: str, count: int) -> tuple[dict[str, Any], ...]:
    """``count`` contexts that together set every setting ``component``'s caller can set (:func:`settable`, less
    what the allowed table lets it ignore), each setting in one of them, dealt round the contexts in name order, with
    its values taken in turn; a setting that would make its context one torch refuses to read (:func:`_consistent`)
    goes to the next context that takes it, and is left out where none does."""
    configurations: list[dict[str, Any]] = [{} for _ in range(count)]
    if allowed(component, "caller context"):
        return tuple(configurations)
    names = sorted(name for name in settable() if not allowed(component, f"caller context: {name}"))
    for index, name in enumerate(names):
        values = settable()[name][1]
        for turn in range(count):
            configuration = configurations[(index + turn) % count]
            candidate = {**configuration, name: values[(index // count) % len(values)]}
            if _consistent(candidate):
                configuration[name] = candidate[name]
                break
    return tuple(configurations)


def held_contexts(component: str) -> st.SearchStrategy[dict[str, Any]]:
    """The contexts a caller holds around ``component`` from capture to last replay: none (what a failure shrinks
    towards), else up to :data:`ENGINE_SETTINGS` settings drawn freely, or one of the component's fixed engine
    configurations where :data:`CONFIGURATIONS` names it."""
    count = CONFIGURATIONS.get(component)
    if count is None:
        return caller_contexts(component, max_settings=ENGINE_SETTINGS)
    return st.sampled_from(({},) + engine_configurations(component, count))


# id(build context) -> {component: the context entered for that example}; an entry lives as long as its example.
_ENTERED: dict[int, dict[str, dict[str, Any]]] = {}


def example_caller_context(component: str, *, enter: bool = True) -> dict[str, Any]:
    """The caller's context of the running hypothesis example for a component that :func:`spans_lifecycle`: drawn
    at the example's first capture or construction (``enter``), set then and put back when the example ends
    (``hypothesis.control.cleanup``), so that capture, warm-up, every replay and their eager twins all run in it,
    as an engine builds and serves its runner under one configuration. With ``enter=False`` (a call), the context
    entered earlier in this example, or none where nothing was captured in it (a graph or runner built outside the
    example was built in no drawn context, and a replay runs in its capture's). Outside an example: none."""
    from hypothesis.control import cleanup

    build = _running_example()
    if build is None:
        return {}
    entered = _ENTERED.get(id(build), {})
    if component in entered or not enter:
        return entered.get(component, {})
    context = build.data.draw(st.data()).draw(held_contexts(component),
                                              label=f"caller context ({component}, from capture to last replay)")
    found = tuple(settable()[name][0] for name in context)
    before = _globals.read(found)
    applied = caller_context_applied(context)
    applied.__enter__()
    _ENTERED.setdefault(id(build), {})[component] = context

    def leave() -> None:
        _ENTERED.get(id(build), {}).pop(component, None)
        if not _ENTERED.get(id(build), True):
            del _ENTERED[id(build)]
        # A setting of the context that reads otherwise at the example's end was set inside the example by a block
        # that ended since (entered before the context, left after it): putting back what the context found would
        # then carry that block's value past the example.
        held = _globals.read(found)
        moved = _state.changes(context, held)
        applied.__exit__(None, None, None)
        for setting in found:  # as the block that ended left it, not as the context found it inside that block
            if setting.name in moved:
                assert setting.write is not None
                setting.write(held[setting.name])
        if moved:
            raise HarnessError(f"the caller's context {described(context)} of {component} does not nest with a block "
                               f"of the example: {', '.join(f'{name} reads {held[name]!r}' for name in moved)} at "
                               "its end; enter the example's context (example_caller_context) before such a block")
        # Loud, not silent: a setting the context did not put back would reach every later example, whose eager
        # and runner (built before) would then run in different contexts. (Settings whose write-back moves
        # another setting are not drawn at all: _takes.)
        after = _globals.read(found)
        left = _state.changes(before, after)
        if left:
            raise HarnessError(f"the caller's context {described(context)} of {component} was not put back at the "
                               f"example's end: " + ", ".join(f"{name} {before.get(name)!r} -> {after.get(name)!r}"
                                                              for name in left))

    cleanup(leave)
    return context


def context_key(component: str) -> str:
    """The caller's context the running example holds for ``component`` (entered here if not yet, as
    :func:`example_caller_context`), as a key for a cache of what the suites build once: a runner or graph is built
    in one context and serves only in it, so a cache keeps one per context, and every example draws its context
    whether or not the cache holds what it asks for (hypothesis replays an example's draws)."""
    return described(example_caller_context(component))


def entered_contexts() -> dict[str, Any]:
    """Every setting the running example holds for the whole of its lifecycle (:func:`example_caller_context`), for
    the threads it starts: an engine's threads serve under the configuration the engine was built in, and
    thread-local settings (autocast) do not follow a new thread by themselves."""
    build = _running_example()
    merged: dict[str, Any] = {}
    for context in _ENTERED.get(id(build), {}).values() if build is not None else ():
        merged.update(context)
    return merged


def drawn_caller_context(component: str) -> dict[str, Any]:
    """A context drawn in the running hypothesis example (its draws shrink with the example's), or none outside one
    (a plain test, a thread of a thread test): the one place every property test draws it."""
    build = _running_example()
    if build is None:
        return {}
    # st.data() drawn from the example's own data: the context is one more draw of the example, printed with the
    # failing example as "Draw 1 (caller context): {...}" and shrunk (towards no context) with the rest.
    return build.data.draw(st.data()).draw(caller_contexts(component), label="caller context")


@contextlib.contextmanager
def caller_context_applied(context: Mapping[str, Any]) -> Iterator[None]:
    """Set ``context``'s settings for the block and put each back after it, the last set first."""
    found = settable()
    done: list[tuple[_globals.Setting, Any]] = []
    try:
        for name, value in context.items():
            setting = found[name][0]
            done.append((setting, setting.read()))
            assert setting.write is not None
            setting.write(value)
        yield
    finally:
        for setting, before in reversed(done):
            assert setting.write is not None
            setting.write(before)


def described(context: Mapping[str, Any]) -> str:
    """``context`` as a failure message shows it: ``name=value`` for each setting, in the order set."""
    return ", ".join(f"{name}={value!r}" for name, value in context.items())
