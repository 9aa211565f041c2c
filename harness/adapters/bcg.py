"""breakable-cuda-graphs under the graphs suites: ``--impl graphs=bcg``.

Bridges the package's ``BreakableCUDAGraph``, ``breakable_graph`` and ``no_graph`` (``breakable_cuda_graphs.py``) to
the capturer interface, as :mod:`harness.adapters.no_graph` describes; its options the README marks as optional (a
``capture_stub`` per break, a ``barrier_fn`` per capture) are left out. The package documents a narrower contract
than the harness's: a break must not return CUDA tensors, and may return Python values, which replay drops.
:data:`DOCUMENTED_AWAY` declares the clauses this narrows away, quoting the package; the adapter makes up for none.

Written against :data:`BCG_VERSION` (``pip install breakable-cuda-graphs==0.1.0``); imported only when selected.
``docs/conformance/README.md`` says how its report is recorded."""

from __future__ import annotations

from harness.adapters.no_graph import NoGraphCapturer, NoGraphPackage, documented_away, load

__all__ = ["BCG_VERSION", "PACKAGE", "BCGCapturer", "DOCUMENTED_AWAY", "load_capturer", "engine_version"]

BCG_VERSION = "0.1.0"
PACKAGE = NoGraphPackage(spec="bcg", distribution="breakable-cuda-graphs", module="breakable_cuda_graphs",
                         version=BCG_VERSION, sequence="BreakableCUDAGraph", context="breakable_graph")

DOCUMENTED_AWAY = documented_away(PACKAGE)


class BCGCapturer(NoGraphCapturer):
    """The capturer interface over breakable-cuda-graphs' ``BreakableCUDAGraph`` and ``breakable_graph``."""

    package = PACKAGE
    needs_cuda = PACKAGE.needs_cuda


def load_capturer(*, graph_backend: str | None = None) -> type[NoGraphCapturer]:
    """The ``graphs`` adapter (``--impl graphs=bcg``): checks the package imports and the backend is CUDA."""
    return load(BCGCapturer, graph_backend=graph_backend)


def engine_version() -> str:
    """The breakable-cuda-graphs version importable here."""
    return PACKAGE.engine_version()


# The package's modules whose reach its conformance reports measure (harness.conformance.reach), by component.
REACHED = {"graphs": (PACKAGE.module,)}
