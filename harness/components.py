"""The component table: every optimisation the harness verifies, one :class:`Component` row each.

Rows name their parts as ``module:attribute`` strings imported only when needed, so this module imports
nothing of the harness. Adding a component is one row plus new files: ``docs/adding-a-component.md``
explains each field; ``tests/test_components.py`` checks every row."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from types import ModuleType

__all__ = ["Component", "COMPONENTS", "component_names", "get_component"]


@dataclasses.dataclass(frozen=True)
class Component:
    """One row of the component table; ``docs/adding-a-component.md`` (The table row) explains each field."""

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

    def adapter_module(self, spec: str) -> ModuleType | None:
        """The module of the engine adapter ``spec`` names (where its engine's version, documented-away clauses and
        measured modules are declared); None for anything but an adapter."""
        target = self.adapters.get(spec)
        return None if target is None else importlib.import_module(target.partition(":")[0])


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
        adapters={"sglang": "harness.adapters.sglang:load_capturer", "vllm": "harness.adapters.vllm:load_capturer",
                  "trtllm": "harness.adapters.trtllm:load_capturer", "bcg": "harness.adapters.bcg:load_capturer",
                  "pcg": "harness.adapters.pcg:load_capturer"},
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
        adapters={"sglang": "harness.adapters.sglang:load_runner"},
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
