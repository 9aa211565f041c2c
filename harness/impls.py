"""Registry of implementations under test: references, mutants and external ones.

Suites never import an implementation directly; they ask for the one selected for their
component (``--impl COMPONENT=SPEC`` on the command line, the reference otherwise). A SPEC is
either a registered name (``reference``, ``mutant:<name>``) or ``package.module:attribute``.

What an implementation object must be depends on its component; each component registers a
``validator`` that turns a loaded object into the form its suites call, or raises
:class:`~harness.errors.ImplementationError` saying what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from harness.errors import ImplementationError, UsageError

__all__ = [
    "Implementation",
    "register",
    "register_component",
    "components",
    "implementations",
    "mutants",
    "load",
    "parse_impl_option",
]


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One candidate for a component.

    ``obj`` is what the component's suites call; ``kind`` is ``reference``, ``mutant`` or
    ``external``; ``bug`` says, for a mutant, which real bug class it reproduces.
    """

    component: str
    name: str
    obj: Any
    kind: str = "reference"
    bug: str = ""

    @property
    def spec(self) -> str:
        return f"{self.component}={self.name}"


_VALIDATORS: dict[str, Callable[[Any, str], Any]] = {}
_REGISTRY: dict[str, dict[str, Implementation]] = {}
# Modules that register implementations; imported lazily so that `import harness` stays cheap.
_PROVIDERS: dict[str, list[str]] = {}


def register_component(component: str, *, validator: Callable[[Any, str], Any], providers: list[str]) -> None:
    """Declare a component, how to check a candidate object, and which modules register entries."""
    _VALIDATORS[component] = validator
    _PROVIDERS[component] = list(providers)
    _REGISTRY.setdefault(component, {})


def register(component: str, name: str, obj: Any, *, kind: str = "reference", bug: str = "") -> Any:
    """Register ``obj`` as implementation ``name`` of ``component``; returns ``obj`` (usable as a decorator helper)."""
    if kind == "mutant" and not name.startswith("mutant:"):
        name = f"mutant:{name}"
    _REGISTRY.setdefault(component, {})[name] = Implementation(component, name, obj, kind, bug)
    return obj


def _ensure_loaded(component: str) -> None:
    for module in _PROVIDERS.get(component, ()):
        importlib.import_module(module)


def components() -> tuple[str, ...]:
    _ensure_components_declared()
    return tuple(_VALIDATORS)


def implementations(component: str) -> dict[str, Implementation]:
    _check_component(component)
    _ensure_loaded(component)
    return dict(_REGISTRY.get(component, {}))


def mutants(component: str) -> list[Implementation]:
    return [impl for impl in implementations(component).values() if impl.kind == "mutant"]


def _ensure_components_declared() -> None:
    # Components declare themselves when their package is imported.
    importlib.import_module("harness.graphs")
    for module in ("harness.runner", "harness.gather"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:  # a component not built yet is simply absent
            if error.name != module:
                raise


def _check_component(component: str) -> None:
    _ensure_components_declared()
    if component not in _VALIDATORS:
        known = ", ".join(sorted(_VALIDATORS)) or "none"
        raise UsageError(f"unknown component {component!r} in --impl; known components: {known}")


def parse_impl_option(option: str) -> tuple[str, str]:
    """Split ``COMPONENT=SPEC``; raises :class:`UsageError` naming what is malformed."""
    component, sep, spec = option.partition("=")
    if not sep or not component.strip() or not spec.strip():
        raise UsageError(
            f"bad --impl {option!r}: expected COMPONENT=SPEC, for example "
            "'gather=mypkg.kernels:gather_spec_extras' or 'graphs=mutant:skip-break'"
        )
    return component.strip(), spec.strip()


def load(component: str, spec: str = "reference") -> Implementation:
    """Resolve ``spec`` for ``component`` to a validated :class:`Implementation`."""
    _check_component(component)
    _ensure_loaded(component)
    registered = _REGISTRY.get(component, {})
    if spec in registered:
        impl = registered[spec]
        return dataclasses.replace(impl, obj=_VALIDATORS[component](impl.obj, impl.spec))
    if ":" not in spec or spec.startswith("mutant:"):
        known = ", ".join(sorted(registered))
        raise UsageError(
            f"--impl {component}={spec}: no registered implementation of that name and not of the form "
            f"'package.module:attribute'. Registered for {component}: {known}"
        )
    module_name, _, attribute_path = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ImplementationError(
            f"--impl {component}={spec}: module {module_name!r} cannot be imported ({error}). "
            "Is the package installed in this environment, or its folder on PYTHONPATH?"
        ) from None
    obj: Any = module
    for part in attribute_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImplementationError(
                f"--impl {component}={spec}: module {module_name!r} has no attribute {attribute_path!r}"
            ) from None
    return Implementation(component, spec, _VALIDATORS[component](obj, f"{component}={spec}"), "external")
