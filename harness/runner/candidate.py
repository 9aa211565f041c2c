"""What a ``runner`` implementation must look like, checked when it is loaded (``--impl runner=...``).

A candidate is a class or factory called as ``factory(model, *, buckets, graphs,
strict_discovery=False)`` that returns a runner; ``docs/runner.md`` gives the runner interface.
"""

from __future__ import annotations

from typing import Any

from harness.errors import ImplementationError

__all__ = ["validate_runner_factory"]


def validate_runner_factory(candidate: Any, spec: str) -> Any:
    """Return ``candidate`` if it can be a runner factory, else raise :class:`ImplementationError`."""
    if not callable(candidate):
        raise ImplementationError(
            f"--impl {spec}: expected a class or factory called as factory(model, *, buckets, graphs, "
            f"strict_discovery=False) that returns a runner (see docs/runner.md); got {type(candidate).__name__}"
        )
    return candidate
