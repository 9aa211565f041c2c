"""The areas a mutation run covers: each a reference's modules and the suites that check them.

An area is judged by its own triage file, ``docs/mutation/<area>.json`` (:mod:`harness.mutation.triage`)."""

from __future__ import annotations

import dataclasses

__all__ = ["Area", "AREAS", "area_of_file", "get_area"]


@dataclasses.dataclass(frozen=True)
class Area:
    """A reference's modules (``files``, relative to the checkout) and the suite folders (or test files) whose tests
    may kill their mutants (mutmut runs, of those, only the tests that reach the mutated function)."""

    name: str
    files: tuple[str, ...]
    suites: tuple[str, ...]

    @property
    def triage_path(self) -> str:
        return f"docs/mutation/{self.name}.json"


AREAS: dict[str, Area] = {area.name: area for area in (
    Area("gather", ("harness/gather/reference.py",), ("suites/gather",)),
    Area("relay", ("harness/gather/relay.py",), ("suites/gather",)),
    # _seam.py holds the capture session's seam the breakable graph relies on.
    Area("graphs", ("harness/graphs/_breakable.py", "harness/graphs/_seam.py"), ("suites/graphs",)),
    # The CPU backend that stands in for CUDA graphs: an area of its own, so that its score is not mixed with the
    # reference's (the GPU check judges it too, by the emulated-against-CUDA goldens).
    # Its pool is exercised by the positive controls of tests/test_emulated_pool.py: the reference capturer keeps
    # everything alive, so the suites alone never make a capture re-carve a freed block.
    Area("emulated", ("harness/graphs/_emulated.py",), ("suites/graphs", "tests/test_emulated_pool.py")),
    Area("runner", ("harness/runner/runner.py", "harness/runner/discovery.py"), ("suites/runner",)),
)}


def get_area(name: str) -> Area:
    try:
        return AREAS[name]
    except KeyError:
        raise KeyError(f"unknown mutation area {name!r}; known: {', '.join(AREAS)}") from None


def area_of_file(path: str) -> Area:
    """The area whose modules include ``path`` (a mutated file, relative to the checkout)."""
    for area in AREAS.values():
        if path in area.files:
            return area
    raise KeyError(f"{path} belongs to no mutation area")
