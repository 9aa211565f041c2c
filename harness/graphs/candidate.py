"""What a ``graphs`` implementation must look like, checked when it is loaded (``--impl graphs=...``).

The signature, then a smoke capture and replay of a two-segment program on the emulated backend; only
the interface is checked, never the values (mutants must load). ``docs/graphs.md`` gives the interface."""

from __future__ import annotations

from typing import Any

import torch

from harness.graphs._seam import eager_on_graph
from harness.impls import check_signature, describe, require_callable, require_members, smoke_step

__all__ = ["validate_capturer_factory"]

_FACTORY = "factory(backend)"
_CAPTURE = "capture(fn, *, pool=None, warmup_runs=1)"
GRAPH_MEMBERS = ("output", "segment_count", "break_count", "break_names")


@eager_on_graph
def _smoke_break(hidden: torch.Tensor) -> torch.Tensor:
    return hidden + 1


def validate_capturer_factory(candidate: Any, spec: str, *, smoke: bool = True) -> Any:
    """Return ``candidate`` if it behaves as a capturer factory, else raise
    :class:`~harness.errors.ImplementationError` saying, in one line, what is wrong."""
    from harness.graphs import get_backend  # the package imports this module's siblings first

    require_callable(candidate, spec, f"a class or factory {_FACTORY} returning an object with "
                                      f"{_CAPTURE} and new_pool()")
    backend = get_backend("emulated")
    check_signature(candidate, spec, _FACTORY, backend)
    if not smoke:
        return candidate
    from harness.oracle import process_state_kept

    name = describe(candidate)
    static = torch.arange(4, dtype=torch.float32)

    def program() -> torch.Tensor:
        return _smoke_break(static * 2) * 3

    # What the smoke capture leaves in the process (gc switched off, a grad mode) is put back: left there, it would
    # hide the same change made by the captures and replays the suites check (harness.oracle).
    with process_state_kept():
        capturer = smoke_step(spec, f"{name}(backend)", lambda: candidate(backend))
        require_members(capturer, spec, f"{name}(backend)", (), callables=("capture", "new_pool"))
        check_signature(capturer.capture, spec, _CAPTURE, lambda: None, pool=None, warmup_runs=1)
        pool = smoke_step(spec, f"{name}(backend).new_pool()", capturer.new_pool)
        graph = smoke_step(spec, f"{name}(backend).capture(fn, pool=pool, warmup_runs=1)",
                           lambda: capturer.capture(program, pool=pool, warmup_runs=1))
        require_members(graph, spec, "the graph capture() returned", GRAPH_MEMBERS, callables=("replay",))
        smoke_step(spec, "graph.replay()", graph.replay)
    return candidate
