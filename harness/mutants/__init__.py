"""Known-bad implementations: :class:`MutantSet`, the one way every component declares its mutants.

A mutant reproduces one real bug class and is built only from the reference's documented seams;
``backends={"cuda"}`` restricts it to the backends that can show its bug. The README's Mutants section
has the idiom."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["Mutant", "MutantSet", "GRAPH_BACKENDS"]

#: The graph backends a kill matrix runs on (``auto`` resolves to one of them).
GRAPH_BACKENDS = ("cuda", "emulated")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A known-bad implementation: its name, the bug in one line, the object, and the graph backends
    whose kill matrix judges it (empty: every backend)."""

    name: str
    bug: str
    obj: Any
    backends: frozenset[str] = frozenset()

    @property
    def spec_name(self) -> str:
        """The name ``--impl`` selects it by: ``mutant:<name>``."""
        return f"mutant:{self.name}"


class MutantSet:
    """The mutants of one component, in declaration order; a module declares it as ``MUTANTS``."""

    def __init__(self, component: str) -> None:
        self.component = component
        self._mutants: dict[str, Mutant] = {}

    def add(self, name: str, *, bug: str, backends: Iterable[str] = ()) -> Callable[[T], T]:
        """Decorator registering a class or function as mutant ``name``, reproducing ``bug``, judged on
        the graph ``backends`` named (every backend where none is)."""
        if not bug.strip():
            raise ValueError(f"mutant {name!r} of {self.component}: say in one line which bug it reproduces")
        if isinstance(backends, str):
            raise ValueError(f"mutant {name!r} of {self.component}: backends is a set of names, like {{'cuda'}}")
        unknown = sorted(set(backends) - set(GRAPH_BACKENDS))
        if unknown:
            raise ValueError(f"mutant {name!r} of {self.component}: unknown graph backends {unknown}; "
                             f"choose from {list(GRAPH_BACKENDS)}")

        def register(obj: T) -> T:
            if name in self._mutants:
                raise ValueError(f"mutant {name!r} of {self.component} is declared twice")
            self._mutants[name] = Mutant(name, bug, obj, frozenset(backends))
            return obj

        return register

    def include(self, other: MutantSet) -> None:
        """Add the mutants of ``other`` (another module's set of the same component), in its order."""
        if other.component != self.component:
            raise ValueError(f"cannot include {other.component} mutants in the {self.component} set")
        for mutant in other:
            self.add(mutant.name, bug=mutant.bug, backends=mutant.backends)(mutant.obj)

    def __iter__(self) -> Iterator[Mutant]:
        return iter(self._mutants.values())

    def __len__(self) -> int:
        return len(self._mutants)
