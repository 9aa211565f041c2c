"""Widen races: every side stream starts its work late, so a reader not ordered after it reads too early.

Work queued on a side stream and never joined (a break that returns before its stream is done, a dropped
``wait_stream``) gives right values whenever the side stream happens to finish first, which on an idle GPU with
small kernels is nearly always. Inside :func:`widened_races`, each switch of a thread to a stream other than its
device's default stream (``torch.cuda.stream(...)``, ``torch.cuda.set_stream``) first queues a spin kernel
(``torch.cuda._sleep``) there: the side stream's next work runs after it, and a reader on the caller's stream
that does not wait for it reads before it, unless the host stalls longer than the spin between queuing the two.
Ordered code only waits a little longer. A side stream
forked into a capture records the spin into the graph, so replays are widened too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harness.hazards._config import amplifiers_enabled

__all__ = ["SPIN_CYCLES", "widened_races"]

#: The spin queued on a side stream, in GPU clock cycles: far longer than the suites' kernels, and than the host's
#: usual stalls between queuing the side stream's work and its reader (the CHANGELOG has why it is this long).
SPIN_CYCLES = 20_000_000


@contextlib.contextmanager
def widened_races(*, cycles: int = SPIN_CYCLES, force: bool = False) -> Iterator[None]:
    """Within the block, queue ``cycles`` of spin on every stream a thread switches to that is not its device's
    default stream. A no-op without CUDA, or where the amplifiers are off or paused when it is entered
    (``force`` acts anyway: the positive controls); blocks do not nest (an inner one changes nothing)."""
    if not (force or amplifiers_enabled()) or not torch.cuda.is_available() or _patched():
        yield
        return
    original = torch.cuda.set_stream

    def set_stream(stream: Any) -> None:
        original(stream)
        if ((force or amplifiers_enabled()) and stream is not None
                and stream != torch.cuda.default_stream(stream.device)):
            torch.cuda._sleep(cycles)

    set_stream.__wrapped__ = original  # type: ignore[attr-defined]
    torch.cuda.set_stream = set_stream
    try:
        yield
    finally:
        torch.cuda.set_stream = original


def _patched() -> bool:
    return hasattr(torch.cuda.set_stream, "__wrapped__")
