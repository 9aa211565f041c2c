"""piecewise-cuda-graphs under the graphs suites: ``--impl graphs=pcg``.

Bridges the package's ``CUDAGraphSequence``, ``piecewise_graph`` and ``no_graph`` (``piecewise_cuda_graphs.py``) to
the capturer interface, as :mod:`harness.adapters.no_graph` describes (the same design as breakable-cuda-graphs,
without its ``capture_stub`` and ``barrier_fn`` options). The package documents a narrower contract than the
harness's: a break must not return CUDA tensors, and may return Python values, which replay drops.
:data:`DOCUMENTED_AWAY` declares the clauses this narrows away, quoting the package; the adapter makes up for none.

Written against :data:`PCG_VERSION` (``pip install piecewise-cuda-graphs==0.1.0``); imported only when selected.
``docs/conformance/README.md`` says how its report is recorded."""

from __future__ import annotations

from harness.adapters.no_graph import NoGraphCapturer, NoGraphPackage, documented_away, load

__all__ = ["PCG_VERSION", "PACKAGE", "PCGCapturer", "DOCUMENTED_AWAY", "load_capturer", "engine_version"]

PCG_VERSION = "0.1.0"
PACKAGE = NoGraphPackage(spec="pcg", distribution="piecewise-cuda-graphs", module="piecewise_cuda_graphs",
                         version=PCG_VERSION, sequence="CUDAGraphSequence", context="piecewise_graph")

DOCUMENTED_AWAY = documented_away(PACKAGE)


class PCGCapturer(NoGraphCapturer):
    """The capturer interface over piecewise-cuda-graphs' ``CUDAGraphSequence`` and ``piecewise_graph``."""

    package = PACKAGE
    needs_cuda = PACKAGE.needs_cuda


def load_capturer(*, graph_backend: str | None = None) -> type[NoGraphCapturer]:
    """The ``graphs`` adapter (``--impl graphs=pcg``): checks the package imports and the backend is CUDA."""
    return load(PCGCapturer, graph_backend=graph_backend)


def engine_version() -> str:
    """The piecewise-cuda-graphs version importable here."""
    return PACKAGE.engine_version()


# The package's modules whose reach its conformance reports measure (harness.conformance.reach), by component.
REACHED = {"graphs": (PACKAGE.module,)}
