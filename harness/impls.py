"""Registry of implementations under test: references, mutants, engine adapters and external ones.

Suites ask for the implementation selected for their component (``--impl COMPONENT=SPEC``, the reference
otherwise): a registered name, ``mutant:<name>``, an adapter (``sglang``) or ``package.module:attribute``.
Everything registered comes from the component table and the mutant modules."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from harness import components as _components
from harness import timeouts
from harness.errors import ImplementationError, UsageError

__all__ = [
    "Implementation",
    "adapter_names",
    "components",
    "implementations",
    "mutants",
    "load",
    "parse_impl_option",
    "parse_impl_options",
    "STARTUP_SECONDS",
    "describe", "require_callable", "check_signature", "smoke_step", "require_members", "describe_exception"]

# The limit on loading an outside implementation: its import and the smoke call on a tiny case (both
# take well under a second for the reference). A hang there would stop the run before any test.
STARTUP_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One candidate for a component.

    ``obj`` is what the component's suites call; ``kind`` is ``reference``, ``mutant``, ``adapter``
    or ``external``; ``bug`` says, for a mutant, which real bug class it reproduces, and ``backends``
    the graph backends whose kill matrix judges it (empty: all).
    """

    component: str
    name: str
    obj: Any
    kind: str = "reference"
    bug: str = ""
    backends: frozenset[str] = frozenset()

    def judged_on(self, graph_backend: str) -> bool:
        """Whether the kill matrix of ``graph_backend`` (``cuda`` or ``emulated``) judges this implementation."""
        return not self.backends or graph_backend in self.backends

    @property
    def spec(self) -> str:
        return f"{self.component}={self.name}"


def components() -> tuple[str, ...]:
    return _components.component_names()


def _row(component: str) -> _components.Component:
    try:
        return _components.get_component(component)
    except UsageError as error:
        raise UsageError(f"{error} (in --impl)") from None


def adapter_names(component: str) -> tuple[str, ...]:
    """The engine adapters ``--impl COMPONENT=NAME`` accepts for ``component`` (such as ``sglang``)."""
    return tuple(sorted(_row(component).adapters))


def implementations(component: str) -> dict[str, Implementation]:
    """Every registered implementation of ``component``: the reference, other names, the mutants."""
    row = _row(component)
    registered = {"reference": Implementation(component, "reference", pkgutil.resolve_name(row.reference))}
    for name, target in row.also_registered.items():
        registered[name] = Implementation(component, name, pkgutil.resolve_name(target))
    for mutant in mutants(component):
        registered[mutant.name] = mutant
    return registered


def mutants(component: str) -> list[Implementation]:
    """The component's mutants, in the order its mutant module declares them."""
    row = _row(component)
    mutant_set = getattr(importlib.import_module(row.mutants), "MUTANTS", None)
    if mutant_set is None or getattr(mutant_set, "component", None) != component:
        raise ImplementationError(
            f"{row.mutants} must define MUTANTS = MutantSet({component!r}) (see docs/adding-a-component.md)")
    return [Implementation(component, mutant.spec_name, mutant.obj, "mutant", mutant.bug, mutant.backends)
            for mutant in mutant_set]


def parse_impl_option(option: str) -> tuple[str, str]:
    """Split ``COMPONENT=SPEC``; raises :class:`UsageError` naming what is malformed."""
    component, sep, spec = option.partition("=")
    if not sep or not component.strip() or not spec.strip():
        raise UsageError(
            f"bad --impl {option!r}: expected COMPONENT=SPEC, for example "
            "'gather=mypkg.kernels:gather_spec_extras' or 'graphs=mutant:skip-break'"
        )
    return component.strip(), spec.strip()


def parse_impl_options(options: list[str]) -> dict[str, str]:
    """``component -> spec`` from repeated ``--impl`` options; one component named twice is a
    :class:`UsageError` (the last would otherwise silently win)."""
    selected: dict[str, str] = {}
    for option in options:
        component, spec = parse_impl_option(option)
        if component in selected:
            raise UsageError(f"--impl {component}= is given twice ({selected[component]!r} and {spec!r}): "
                             "the suites test one implementation per component; give one --impl for it")
        selected[component] = spec
    return selected


# (component, spec, id(obj)) -> (obj, validated form): a session loads its implementations more than
# once (at start-up, then in each fixture), and the smoke call need not run again. ``obj`` is kept in
# the value so that its id cannot be reused by another object.
_VALIDATED: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def validate(component: str, obj: Any, spec: str, *, smoke: bool = True) -> Any:
    """Run the component's validator on ``obj`` (signature, then, with ``smoke``, a smoke call on a
    tiny case); returns the object in the form the suites call."""
    key = (component, spec, id(obj))
    if key not in _VALIDATED:
        _VALIDATED[key] = (obj, pkgutil.resolve_name(_row(component).validator)(obj, spec, smoke=smoke))
    return _VALIDATED[key][1]


def _resolve_user_spec(component: str, spec: str) -> Any:
    """The object a ``package.module:attribute`` spec names (:func:`pkgutil.resolve_name`); any failure,
    of the import or of the lookup, is one :class:`ImplementationError` line."""
    module_name, _, attribute_path = spec.partition(":")  # for the messages
    try:
        return pkgutil.resolve_name(spec)
    except ModuleNotFoundError as error:
        # The module itself, or a package above it.
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise ImplementationError(
                f"--impl {component}={spec}: module {module_name!r} cannot be imported ({error}). "
                "Is the package installed in this environment, or its folder on PYTHONPATH?"
            ) from None
        raise ImplementationError(
            f"--impl {component}={spec}: importing {module_name!r} failed: it imports {error.name!r}, "
            "which is not installed in this environment"
        ) from None
    except Exception as error:  # noqa: BLE001 - a syntax error or an exception raised by the module's own code
        if isinstance(error, AttributeError) and sys.modules.get(module_name) is not None:
            # the module imported (a failed import leaves no entry): the lookup of the attribute failed
            raise ImplementationError(
                f"--impl {component}={spec}: module {module_name!r} has no attribute {attribute_path!r}"
            ) from None
        if isinstance(error, ValueError) and traceback.extract_tb(error.__traceback__)[-1].filename == pkgutil.__file__:
            # resolve_name's own check of the form, before importing anything
            raise ImplementationError(
                f"--impl {component}={spec}: not of the form 'package.module:attribute' (dotted Python names)"
            ) from None
        raise ImplementationError(
            f"--impl {component}={spec}: importing {module_name!r} failed: {describe_exception(error)}"
        ) from None


def load(component: str, spec: str = "reference", *, graph_backend: str | None = None,
         time_limit: float | None = STARTUP_SECONDS) -> Implementation:
    """Resolve ``spec`` for ``component`` to a validated :class:`Implementation`.

    ``graph_backend`` is the selected backend's name, for an adapter that runs on one backend only.
    Loading an outside implementation (its import and smoke call) runs under ``time_limit`` seconds
    (None: none); past it, an :class:`ImplementationError` says where it was stuck."""
    row = _row(component)
    if spec in row.adapters:
        # The loader imports the engine; a missing one is its one-line error, not a traceback.
        obj = pkgutil.resolve_name(row.adapters[spec])(graph_backend=graph_backend)
        # No smoke call: an engine's code may need the device the suites select, not the emulated one.
        return Implementation(component, spec, validate(component, obj, f"{component}={spec}", smoke=False), "adapter")
    if ":" not in spec or spec.startswith("mutant:"):
        registered = implementations(component)
        if spec not in registered:
            raise UsageError(
                f"--impl {component}={spec}: no registered implementation of that name and not of the form "
                f"'package.module:attribute'. Registered for {component}: {', '.join(sorted(registered))}"
                + (f"; engine adapters: {', '.join(sorted(row.adapters))}" if row.adapters else "")
            )
        impl = registered[spec]
        # No smoke call for what the harness registers: a mutant may be too broken to build at all,
        # and that is for its suites to find (the kill matrix), not a usage error.
        return dataclasses.replace(impl, obj=validate(component, impl.obj, impl.spec, smoke=False))
    def stuck(frame: Any) -> str:
        return (f"--impl {component}={spec}: loading it (the import and a smoke call on a tiny case) did not finish "
                f"within {time_limit:g} s; stuck at {timeouts.where(frame)}")

    try:
        with timeouts.time_limit(time_limit, stuck):
            return _load_external(component, spec)
    except timeouts.TimeLimitExceeded as error:
        raise ImplementationError(str(error)) from None


def _load_external(component: str, spec: str) -> Implementation:
    obj = _resolve_user_spec(component, spec)
    return Implementation(component, spec, validate(component, obj, f"{component}={spec}"), "external")


# Start-up checks of a candidate, shared by every component's validator.

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
