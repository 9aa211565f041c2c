"""Mutants as the triage files name them, and their classification by those files.

A mutant is keyed by ``(function, mutation, occurrence)``: the function's qualified name, the mutated line(s)
before and after (``"<before> => <after>"``, whitespace-normalised, no line numbers) and, where one function has
the same mutation twice, which one (1, 2, ...). The key survives unrelated edits of the module."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.errors import HarnessError

__all__ = ["Mutant", "VERDICTS", "KILLED_STATUSES", "SURVIVING_STATUSES", "TriageEntry", "function_of",
           "mutation_of", "with_occurrences", "load_triage", "classify"]

#: What a survivor may be judged: no caller can observe it, only an error message changes, or a real miss.
VERDICTS = ("equivalent", "message-only", "missed")
#: mutmut's statuses that count as killed: a test failed, hung past its limit or crashed the process.
KILLED_STATUSES = frozenset({"killed", "timeout", "segfault", "suspicious", "caught by type check"})
#: mutmut's statuses of survivors: every test that reaches the function passed, or no test reaches it.
SURVIVING_STATUSES = frozenset({"survived", "no tests"})

_CLASS_SEPARATOR = "ǁ"  # mutmut's mangling of methods: module.xǁClassǁmethod__mutmut_N


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One mutant of a run: its area, mutmut's name for it, its key, its diff and mutmut's status."""

    area: str
    name: str
    function: str
    mutation: str
    diff: str
    status: str
    occurrence: int = 1

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.function, self.mutation, self.occurrence)

    @property
    def survived(self) -> bool:
        return self.status in SURVIVING_STATUSES


@dataclasses.dataclass(frozen=True)
class TriageEntry:
    function: str
    mutation: str
    verdict: str
    why: str
    occurrence: int = 1

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.function, self.mutation, self.occurrence)


def function_of(mutant_name: str) -> str:
    """The qualified name of the function mutmut's ``mutant_name`` mutates:
    ``harness.gather.relay.SpecExtrasRelay.stash`` for ``harness.gather.relay.xǁSpecExtrasRelayǁstash__mutmut_3``."""
    mangled = mutant_name.partition("__mutmut_")[0]
    module, _, function = mangled.rpartition(".")
    if function.startswith("x" + _CLASS_SEPARATOR):
        _, cls, method = function.split(_CLASS_SEPARATOR)
        return f"{module}.{cls}.{method}"
    return f"{module}.{function.removeprefix('x_')}"


def _normalised(lines: Iterable[str]) -> str:
    return " ".join(" ".join(line.split()) for line in lines if line.strip())


def mutation_of(diff: str) -> str:
    """``"<before> => <after>"`` from a unified diff of one function: its removed and added lines, each side
    whitespace-normalised and joined into one line."""
    body = [line for line in diff.splitlines() if not line.startswith(("---", "+++", "@@"))]
    before = _normalised(line[1:] for line in body if line.startswith("-"))
    after = _normalised(line[1:] for line in body if line.startswith("+"))
    return f"{before} => {after}"


def with_occurrences(mutants: Iterable[Mutant]) -> list[Mutant]:
    """The mutants, in order, with ``occurrence`` counting repeats of one ``(function, mutation)``."""
    seen: dict[tuple[str, str], int] = {}
    numbered = []
    for mutant in mutants:
        count = seen[mutant.function, mutant.mutation] = seen.get((mutant.function, mutant.mutation), 0) + 1
        numbered.append(dataclasses.replace(mutant, occurrence=count))
    return numbered


def load_triage(path: Path, *, area: str) -> dict[tuple[str, str, int], TriageEntry]:
    """The triage file of ``area`` by key; a missing file is an empty triage. Refuses a malformed entry, naming it."""
    if not path.exists():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("area") != area:
        raise HarnessError(f"{path}: its area is {data.get('area')!r}, not {area!r}")
    entries: dict[tuple[str, str, int], TriageEntry] = {}
    for number, raw in enumerate(data.get("survivors", []), start=1):
        missing = [field for field in ("function", "mutation", "verdict", "why") if not raw.get(field)]
        if missing:
            raise HarnessError(f"{path}: survivor {number} has no {', '.join(missing)}: {raw}")
        if raw["verdict"] not in VERDICTS:
            raise HarnessError(f"{path}: survivor {number} ({raw['function']}: {raw['mutation']}) has verdict "
                               f"{raw['verdict']!r}; choose from {', '.join(VERDICTS)}")
        entry = TriageEntry(raw["function"], " ".join(raw["mutation"].split()), raw["verdict"], raw["why"],
                            int(raw.get("occurrence", 1)))
        if entry.key in entries:
            raise HarnessError(f"{path}: survivor {number} ({entry.function}: {entry.mutation}, occurrence "
                               f"{entry.occurrence}) is listed twice; number repeats with \"occurrence\"")
        entries[entry.key] = entry
    return entries


def classify(mutant: Mutant, triage: dict[tuple[str, str, int], TriageEntry]) -> str:
    """``"killed"``, the survivor's verdict in ``triage``, or ``"untriaged"``."""
    if mutant.status in KILLED_STATUSES:
        return "killed"
    if mutant.status not in SURVIVING_STATUSES:
        raise HarnessError(f"mutant {mutant.name} was not run to a verdict (mutmut says {mutant.status!r})")
    entry = triage.get(mutant.key)
    return entry.verdict if entry is not None else "untriaged"
