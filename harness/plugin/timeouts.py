"""Pytest plugin: each test's time limit stops a hang, also inside a hypothesis test, and names the example.

pytest-timeout still decides the limit; this plugin replaces its timer (``pytest_timeout_set_timer``)
with :func:`harness.timeouts.arm` where ``SIGALRM`` is available and the harness is active (or
``-p harness.plugin.timeouts`` is given). README.md (Options) says what a timed-out test reports."""

from __future__ import annotations

import functools
import inspect
from types import FrameType
from typing import Any

import pytest

from harness import timeouts
from harness.plugin import session

__all__ = ["describe_hang", "running_example"]

_LIMIT = pytest.StashKey[Any]()
_MAX_ARGUMENT = 200  # characters of one argument's repr in the message


def _acts(config: pytest.Config) -> bool:
    return (session.current_session(config) is not None
            or __name__ in (getattr(config.option, "plugins", None) or ()))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal" or not timeouts.limits_available() or not _acts(item.config):
        return None  # pytest-timeout's own timer
    import pytest_timeout

    if not settings.disable_debugger_detection and pytest_timeout.is_debugging():
        return True  # no limit under a debugger, as pytest-timeout does
    item.stash[_LIMIT] = timeouts.arm(settings.timeout, functools.partial(describe_hang, item, settings.timeout))
    return True


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    if _LIMIT not in item.stash:
        return None
    timeouts.disarm(item.stash[_LIMIT])
    del item.stash[_LIMIT]
    return True


def _short(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"<{type(value).__name__} shape={tuple(shape)} dtype={value.dtype}>"
    if type(value) in (tuple, list):  # arguments passed on as *args: their tensors short too
        inner = ", ".join(_short(item) for item in value)
        text = f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        text = " ".join(repr(value).split())  # one line: a message is one line
    return text if len(text) <= _MAX_ARGUMENT else text[:_MAX_ARGUMENT - 3] + "..."


def _arguments(frame: FrameType, skip: set[str]) -> str:
    info = inspect.getargvalues(frame)
    names = [*info.args, *([info.varargs] if info.varargs else []), *([info.keywords] if info.keywords else [])]
    return ", ".join(f"{name}={_short(frame.f_locals[name])}" for name in names
                     if name not in skip and name in frame.f_locals)


def running_example(item: pytest.Item, frame: FrameType | None) -> str | None:
    """The hypothesis example ``item`` is running, read from the stack at ``frame``: the ``@given``
    test's drawn arguments, or a state machine's rule and its arguments; None outside hypothesis."""
    from hypothesis.stateful import RuleBasedStateMachine

    inner = getattr(getattr(getattr(item, "obj", None), "hypothesis", None), "inner_test", None)
    test_code = getattr(inspect.unwrap(inner), "__code__", None) if inner is not None else None
    fixtures = set(getattr(item, "fixturenames", ()))
    rule, callee = None, None
    while frame is not None:
        if test_code is not None and frame.f_code is test_code:
            example = f"{item.name}({_arguments(frame, fixtures | {'self'})})"
            # what the test body was calling, with its arguments: values drawn with st.data() show here
            return example + (f", calling {callee.f_code.co_name}({_arguments(callee, {'self'})})" if callee else "")
        machine = frame.f_locals.get("self")
        if isinstance(machine, RuleBasedStateMachine) and hasattr(type(machine), frame.f_code.co_name):
            rule = f"{type(machine).__name__}.{frame.f_code.co_name}({_arguments(frame, {'self'})})"  # outermost wins
        frame, callee = frame.f_back, frame
    return f"the state machine step {rule}" if rule else None


def _example_blob() -> bytes | None:
    """The ``@reproduce_failure`` blob of the choices hypothesis has made so far, if it is running."""
    try:
        from hypothesis.control import current_build_context
        from hypothesis.core import encode_failure

        choices = getattr(current_build_context().data, "choices", None)
        return encode_failure(choices) if choices is not None else None
    except Exception:  # noqa: BLE001 - no build context (not in a hypothesis test), or another hypothesis
        return None


def describe_hang(item: pytest.Item, seconds: float, frame: FrameType | None) -> str:
    """The message of a test that ran past its limit, one line: the test, its limit, the hypothesis example
    being run (a ``@given`` test's drawn arguments, or a state machine's rule and arguments; never a shrunk
    example, which a hang does not yield) and where it was stuck; then the example's ``@reproduce_failure``
    blob, which the failure's reproduce line turns into ``--reproduce-failure``."""
    import hypothesis

    example = running_example(item, frame)
    message = (f"{item.nodeid} ran past its time limit of {seconds:g} s (--timeout, or @pytest.mark.timeout)"
               + (f" while running the hypothesis example {example}" if example else "")
               + f"; stuck at {timeouts.where(frame)}")
    blob = _example_blob() if example else None
    if blob is not None:
        message += f"\n@reproduce_failure({hypothesis.__version__!r}, {blob!r})"
    return message
