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
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.oracle import _globals
from harness.oracle._allowed import NOT_DRAWN, allowed

__all__ = ["settable", "caller_contexts", "caller_context_applied", "drawn_caller_context", "described",
           "STRING_VALUES"]

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


def _takes(setting: _globals.Setting, value: Any) -> bool:
    """Whether torch takes ``value`` for ``setting`` and reads it back (the setting is put back either way)."""
    assert setting.write is not None
    before = setting.read()
    try:
        setting.write(value)
        return bool(setting.read() == value)
    except Exception:  # refused (a setting torch allows once, a value it does not know): not a context here
        return False
    finally:
        with contextlib.suppress(Exception):
            setting.write(before)


@functools.cache
def settable() -> dict[str, tuple[_globals.Setting, tuple[Any, ...]]]:
    """``{name: (setting, values)}``: each setting with a setter and the values, other than the current one, that
    torch takes for it; :data:`NOT_DRAWN` left out."""
    found = {}
    for setting in _globals.settings():
        if setting.write is None or setting.name in NOT_DRAWN:
            continue
        values = tuple(value for value in _candidates(setting.name, setting.read()) if _takes(setting, value))
        if values:
            found[setting.name] = (setting, values)
    return found


def caller_contexts(component: str, *, max_settings: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    """A context a caller of ``component`` can set: up to ``max_settings`` settings with a value each (none is the
    simplest, and what a failure shrinks towards); settings the allowed table lets ``component`` ignore left out."""
    if allowed(component, "caller context"):
        return st.just({})
    choices = {name: values for name, (_, values) in settable().items()
               if not allowed(component, f"caller context: {name}")}
    if not choices:
        return st.just({})
    names = st.lists(st.sampled_from(sorted(choices)), max_size=max_settings, unique=True)
    return names.flatmap(lambda picked: st.fixed_dictionaries({name: st.sampled_from(choices[name])
                                                               for name in picked}))


def drawn_caller_context(component: str) -> dict[str, Any]:
    """A context drawn in the running hypothesis example (its draws shrink with the example's), or none outside one
    (a plain test, a thread of a thread test): the one place every property test draws it."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        build = current_build_context()
    except InvalidArgument:  # no example is running in this thread
        return {}
    if getattr(build.data, "max_choices", None) == 0:
        # An explicit @example runs on data that holds no choices: a draw there overruns and ends the example. It
        # is the caller's call as written, in no context of the harness's.
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
