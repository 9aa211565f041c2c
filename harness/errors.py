"""Every exception the harness raises on purpose; catch :class:`HarnessError` to catch them all.

Each names the problem in words a user can act on, never as a traceback from deep inside torch."""

__all__ = [
    "HarnessError",
    "UsageError",
    "ImplementationError",
    "CaptureError",
    "ReplayError",
    "GraphHazardError",
    "StreamHazardError",
    "DiscoveryError",
    "BatchError",
    "BucketError",
    "GatherContractError",
    "MismatchError",
    "GoldenError",
    "IllegalIndexError",
]


class HarnessError(Exception):
    """Base class of every error the harness raises deliberately."""


class UsageError(HarnessError, ValueError):
    """A bad option or argument: unknown backend, a GPU asked for where there is none, ..."""


class ImplementationError(HarnessError):
    """An implementation under test could not be loaded or has the wrong shape (``--impl``)."""


class CaptureError(HarnessError, RuntimeError):
    """A graph capture failed: an op that cannot be captured, a nested capture, a backend error."""


class ReplayError(HarnessError, RuntimeError):
    """A replay could not run as captured (a break changed its output's shape, a nested replay)."""


class GraphHazardError(ReplayError):
    """A replay would read memory whose owner released it; on CUDA that memory may hold other data."""


class StreamHazardError(HarnessError, RuntimeError):
    """Work on two streams that CUDA could run in the wrong order, or memory it could hand out while a stream
    still uses it (the emulated stream model, :func:`harness.graphs.emulated_streams`)."""


class DiscoveryError(HarnessError, LookupError):
    """The transformer layer stack could not be found (strict discovery)."""


class BatchError(HarnessError, ValueError):
    """A batch description is invalid: no request, a length of zero or less, ..."""


class BucketError(HarnessError, LookupError):
    """No captured bucket fits the batch, or a bucket that was asked for does not exist."""


class GatherContractError(HarnessError, ValueError):
    """Gather inputs outside the documented contract (index dtype, rank, out-of-range values)."""


class MismatchError(HarnessError, AssertionError):
    """Actual and expected values differ beyond the allowed tolerance."""


class GoldenError(HarnessError):
    """A golden file (snapshot or kill matrix) that cannot be read: corrupted, truncated, hand-broken."""


class IllegalIndexError(HarnessError, IndexError):
    """An index-checked kernel of the model zoo was handed metadata it would index memory out of bounds with (a
    position, a request-pool index, a padding row that is not the padding fill): on CUDA an illegal memory access."""
