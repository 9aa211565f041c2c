"""Whether the hazard amplifiers act: the run's choice (in the environment, for child processes) and a pause."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["AMPLIFIERS_VARIABLE", "amplifiers_enabled", "amplifiers_paused"]

#: ``off`` turns every amplifier off in this process and its children (the pytest option
#: ``--hazard-amplifiers`` sets it); anything else, or unset, leaves them on.
AMPLIFIERS_VARIABLE = "HARNESS_HAZARD_AMPLIFIERS"

_lock = threading.Lock()
_pauses = 0


def amplifiers_enabled() -> bool:
    """Whether the amplifiers act now: on for the run, and no :func:`amplifiers_paused` block open."""
    return os.environ.get(AMPLIFIERS_VARIABLE, "on") != "off" and _pauses == 0


@contextlib.contextmanager
def amplifiers_paused() -> Iterator[None]:
    """Hold every amplifier off inside the block, in every thread (the blocks nest): while calls overlap in
    threads, one thread's capture allocates and writes blocks that another's poisoning would see free."""
    global _pauses
    with _lock:
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
