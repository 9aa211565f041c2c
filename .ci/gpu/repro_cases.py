"""What every engine's reproduction script (.ci/gpu/*-repros) shares: its registry of cases, ``--list``, the one-line
refusals (no CUDA, an unknown component) and the loop that runs the chosen cases and says which reproduced. It
imports the standard library and torch only, so each script still runs beside its engine alone."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Cases"]


class Cases:
    """One script's cases. ``@cases.case(clause, tier, component)`` registers a function that returns ``(found,
    detail)``; :meth:`main` runs the command line. ``components`` are those the script knows, ``default`` those it
    runs without arguments; ``label`` names the cases in the closing count."""

    def __init__(self, script: str, components: tuple[str, ...], *, default: tuple[str, ...] = (),
                 label: str = "") -> None:
        self.script, self.components, self.default = script, components, default or components
        self.label = label
        self.cases: list[tuple[str, str, str, Callable[[], tuple[bool, str]], str]] = []

    def case(self, clause: str, tier: str, component: str = "graphs") -> Callable[[Any], Any]:
        def register(function: Any) -> Any:
            self.cases.append((function.__name__, clause, tier, function, component))
            return function

        return register

    def main(self, arguments: list[str]) -> int:
        """``--list``: every case as ``COMPONENT NAME [CLAUSE, TIER]``; else the cases of the components named (the
        default ones without any), each printed as REPRODUCED, not reproduced, or could not run, then the count."""
        if arguments == ["--list"]:
            for name, clause, tier, _, component in self.cases:
                print(f"{component} {name} [{clause}, {tier}]")
            return 0
        if not torch.cuda.is_available():
            print(f"{self.script}: needs a CUDA GPU")
            return 2
        chosen = set(arguments) or set(self.default)
        unknown = chosen - set(self.components)
        if unknown:
            print(f"{self.script}: unknown component {sorted(unknown)} ({', '.join(self.components)})")
            return 2
        selected = [c for c in self.cases if c[4] in chosen]
        reproduced = 0
        for name, clause, tier, function, _ in selected:
            try:
                found, detail = function()
            except Exception as error:  # noqa: BLE001 - a case that cannot run says why and the next runs
                print(f"{name} [{clause}, {tier}]: could not run: {type(error).__name__}: {error}")
                traceback.print_exc(limit=3)
                continue
            reproduced += found
            print(f"{name} [{clause}, {tier}]: {'REPRODUCED' if found else 'not reproduced'}: {detail}")
        print(f"{reproduced} of {len(selected)} {self.label + ' ' if self.label else ''}reproduced")
        return 0
