"""The component table: every optimisation the harness verifies, declared once.

A *component* is one thing a user can swap in with ``--impl COMPONENT=SPEC``. Its row names, as
``module:attribute`` strings that are imported only when needed (so this module imports nothing of
the harness and every other module may read it):

* ``package``: the library package of the component;
* ``reference``: the reference implementation (what ``--impl COMPONENT=reference`` selects);
* ``oracle``: what the suites compare a candidate against (eager execution or a closed form);
* ``validator``: ``validator(candidate, spec, *, smoke=True)`` returns the candidate in the form the
  suites call, or raises :class:`~harness.errors.ImplementationError` saying in one line what is
  wrong: the signature first, then (with ``smoke``, for ``--impl package.module:attribute``) a
  smoke call on a tiny case (helpers in :mod:`harness.impls`);
* ``mutants``: the module holding the component's :class:`~harness.mutants.MutantSet` as ``MUTANTS``;
* ``suite`` and ``doc``: paths relative to the project root;
* ``fixture``: the name of the pytest fixture that yields the selected implementation, and
  ``binds_backend``: whether that fixture calls the implementation with the selected graph backend
  first (a capturer factory yields a capturer);
* ``also_registered``: further names users may select (``--impl gather=eager``);
* ``adapters``: engines' shipped code behind the component's interface (``--impl graphs=sglang``):
  name -> ``loader(*, graph_backend)``, which imports the engine only when selected and returns the
  implementation, or raises one line saying what to install (:mod:`harness.adapters`).

Adding a component is one new row here plus new files; ``docs/adding-a-component.md`` is the recipe
and ``tests/test_components.py`` checks every row.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["Component", "COMPONENTS", "component_names", "get_component", "resolve"]


@dataclasses.dataclass(frozen=True)
class Component:
    """One row of the component table (see the module docstring for each field)."""

    name: str
    summary: str
    package: str
    reference: str
    oracle: str
    validator: str
    mutants: str
    suite: str
    doc: str
    fixture: str
    binds_backend: bool = False
    also_registered: Mapping[str, str] = dataclasses.field(default_factory=dict)
    adapters: Mapping[str, str] = dataclasses.field(default_factory=dict)


COMPONENTS: tuple[Component, ...] = (
    Component(
        name="graphs",
        summary="breakable graphs: captured segments with eager breaks, replayed in capture order",
        package="harness.graphs",
        reference="harness.graphs:GraphCapturer",
        oracle="harness.graphs:run_eagerly",
        validator="harness.graphs.candidate:validate_capturer_factory",
        mutants="harness.mutants.graphs",
        suite="suites/graphs",
        doc="docs/graphs.md",
        fixture="graph_capturer",
        binds_backend=True,
        adapters={"sglang": "harness.adapters.sglang:load_capturer"},
    ),
    Component(
        name="runner",
        summary="layer-stack graph runner: captures the transformer layer stack, replays it under a patched forward",
        package="harness.runner",
        reference="harness.runner:LayerStackRunner",
        oracle="harness.runner.cases:eager",
        validator="harness.runner.candidate:validate_runner_factory",
        mutants="harness.mutants.runner",
        suite="suites/runner",
        doc="docs/runner.md",
        fixture="runner_factory",
    ),
    Component(
        name="gather",
        summary="compiled gather of speculative-decoding extras sharing one index tensor",
        package="harness.gather",
        reference="harness.gather.reference:compiled_gather",
        oracle="harness.gather.reference:eager_gather",
        validator="harness.gather.candidate:validate_gather",
        mutants="harness.mutants.gather",
        suite="suites/gather",
        doc="docs/gather.md",
        fixture="gather_function",
        # The oracle is a valid implementation too: the bench compares against it, and pointing the
        # suites at it checks the suites' own plumbing without a compiler.
        also_registered={"eager": "harness.gather.reference:eager_gather"},
        adapters={"sglang": "harness.adapters.sglang:load_gather"},
    ),
)


def component_names() -> tuple[str, ...]:
    return tuple(component.name for component in COMPONENTS)


def get_component(name: str) -> Component:
    """The row called ``name``; :class:`~harness.errors.UsageError` naming the known ones otherwise."""
    for component in COMPONENTS:
        if component.name == name:
            return component
    from harness.errors import UsageError

    raise UsageError(f"unknown component {name!r}; known components: {', '.join(component_names())}")


def resolve(target: str) -> Any:
    """Import ``package.module:attribute.path`` and return the attribute."""
    module_name, _, attribute_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attribute_path.split(".") if attribute_path else ():
        obj = getattr(obj, part)
    return obj
