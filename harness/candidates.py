"""Start-up checks of an implementation under test, shared by every component's validator.

A validator (the ``validator`` of a row of :mod:`harness.components`) checks a candidate in two
steps, so that a wrong candidate stops the run with one line instead of failing every test:

1. :func:`check_signature`: the candidate can be called the way the suites call it;
2. a smoke call on a tiny case, each step through :func:`smoke_step`, and :func:`require_members`
   on what it returns. A smoke call checks the *shape* of the interface, never the values: mutants
   are wrong on purpose and must still load, so that the suites (not the loader) kill them.

Every failure is an :class:`~harness.errors.ImplementationError` whose message is one line naming
the ``--impl`` spec, the call, the exception and where in the candidate's code it was raised.
"""

from __future__ import annotations

import inspect
import os
import traceback
from typing import Any, Callable, Iterable, TypeVar

from harness.errors import ImplementationError

__all__ = ["describe", "require_callable", "check_signature", "smoke_step", "require_members", "describe_exception"]

T = TypeVar("T")


def describe(candidate: Any) -> str:
    """A short name for ``candidate``: its qualified name, else its type's."""
    return getattr(candidate, "__qualname__", None) or type(candidate).__name__


def describe_exception(error: BaseException) -> str:
    """``Type: message (at file.py:line)``, on one line; the location is the innermost frame."""
    if isinstance(error, SyntaxError):  # its own location is the offending line, not a frame
        where = f"{os.path.basename(error.filename or '?')}:{error.lineno}"
        return f"SyntaxError: {error.msg} (at {where})"
    message = " ".join(str(error).split()) or "(no message)"
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {message}{where}"


def require_callable(candidate: Any, spec: str, expected: str) -> None:
    """:class:`ImplementationError` unless ``candidate`` is callable; ``expected`` says what it should be."""
    if not callable(candidate):
        raise ImplementationError(f"--impl {spec}: expected {expected}; got a {type(candidate).__name__}")


def check_signature(candidate: Any, spec: str, call: str, *args: Any, **kwargs: Any) -> None:
    """:class:`ImplementationError` unless ``candidate``'s signature accepts ``args`` and ``kwargs``.

    ``call`` is how the suites call it, for the message. Objects without a signature (builtins,
    extension functions) pass; the smoke call checks them.
    """
    try:
        signature = inspect.signature(candidate)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise ImplementationError(
            f"--impl {spec}: {describe(candidate)}{signature} cannot be called as {call} ({error})") from None


def smoke_step(spec: str, call: str, step: Callable[[], T]) -> T:
    """Run one step of a smoke call; any exception becomes a one-line :class:`ImplementationError`."""
    try:
        return step()
    except ImplementationError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the candidate raises is the candidate's problem
        raise ImplementationError(
            f"--impl {spec}: on a tiny smoke case, {call} raised {describe_exception(error)}") from None


def require_members(obj: Any, spec: str, what: str, members: Iterable[str], *, callables: Iterable[str] = ()) -> None:
    """:class:`ImplementationError` naming every member of the interface that ``obj`` lacks."""
    callables = tuple(callables)
    missing = [name for name in (*members, *callables) if not hasattr(obj, name)]
    not_callable = [name for name in callables if name not in missing and not callable(getattr(obj, name))]
    if missing or not_callable:
        problems = ([f"no {', '.join(missing)}"] if missing else []) + (
            [f"{', '.join(not_callable)} not callable"] if not_callable else [])
        raise ImplementationError(
            f"--impl {spec}: {what} is a {type(obj).__name__} with {'; '.join(problems)} "
            f"(needs {', '.join((*members, *(f'{name}()' for name in callables)))})")
