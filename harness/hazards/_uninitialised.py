"""Uninitialised memory reads NaN: a row nobody wrote is loud wherever it flows."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from harness.hazards._config import amplifiers_enabled

__all__ = ["uninitialised_memory_poisoned"]


@contextlib.contextmanager
def uninitialised_memory_poisoned() -> Iterator[None]:
    """Inside the block every ``torch.empty`` (``empty_like``, ``new_empty``, ...) on any device comes back filled:
    floats with NaN, integers with their largest value. Done with torch's own deterministic fill, which needs
    deterministic algorithms on; they are set with ``warn_only`` so an op without a deterministic kernel still runs.
    Both settings are put back on leaving. A no-op where the amplifiers are off.

    Unlike :func:`poison_free_memory`, which covers the caching allocator's free blocks on CUDA only, this also
    covers fresh segments and the CPU, so a runner that pads a hidden input with rows it allocated but never wrote
    gives NaN pad rows on every backend."""
    if not amplifiers_enabled():
        yield
        return
    algorithms = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
