"""What a ``graphs`` implementation must look like, checked when it is loaded (``--impl graphs=...``).

A candidate is a class or factory ``factory(backend)`` returning a capturer: an object with
``capture(fn, *, pool=None, warmup_runs=1)`` (returning a graph with ``replay()``, ``output``,
``segment_count``, ``break_count`` and ``break_names``) and ``new_pool()``.
"""

from __future__ import annotations

from typing import Any

from harness.errors import ImplementationError

__all__ = ["validate_capturer_factory"]


def validate_capturer_factory(candidate: Any, spec: str) -> Any:
    """Return ``candidate`` if it can be a capturer factory, else raise :class:`ImplementationError`."""
    if not callable(candidate):
        raise ImplementationError(
            f"--impl {spec}: expected a class or factory taking a graph backend and returning an object with "
            f"capture(fn, *, pool=None) and new_pool(); got {type(candidate).__name__}"
        )
    return candidate
