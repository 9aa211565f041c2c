"""The forward context: which requests the tokens being computed belong to.

Engines hand attention its per-request metadata out of band, not through the layer stack's
arguments, because a captured graph freezes arguments but an eager break runs again at every
replay. :func:`forward_context` publishes the live batch for the duration of a forward;
:func:`current_batch` is what attention reads. Runners set it around replays.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

from harness.errors import UsageError

__all__ = ["forward_context", "current_batch"]

# Per thread and per asyncio task, like the capture state of harness.graphs.
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("harness_forward_batch", default=None)


@contextlib.contextmanager
def forward_context(batch: Any) -> Iterator[Any]:
    """Make ``batch`` the live batch until the block ends (nesting restores the outer one)."""
    token = _CURRENT.set(batch)
    try:
        yield batch
    finally:
        _CURRENT.reset(token)


def current_batch() -> Any:
    """The live batch; raises :class:`UsageError` outside :func:`forward_context`."""
    batch = _CURRENT.get()
    if batch is None:
        raise UsageError(
            "attention ran outside a forward context: call the model's top-level forward, or wrap the "
            "call in harness.models.forward_context(batch)"
        )
    return batch
