"""What the engine-adapter tests share: an engine's release wheel (or, for an engine without releases on the
package index, its source), found here or not, and its extraction script loaded as a module (the scripts in .ci/gpu
have no .py suffix)."""

from __future__ import annotations

import importlib.machinery
import os
import types
from pathlib import Path

import pytest


def release_wheel(engine: str, version: str, *, distribution: str | None = None) -> Path | None:
    """The wheel of ``version`` that ``HARNESS_<ENGINE>_WHEEL`` names (one path, or several joined by the path
    separator, for an engine whose tests run on several releases: the one named ``<name>-<version>-*``), else the
    first ``/tmp/<engine>-wheel/<name>-<version>-*.whl``; ``<name>`` is the wheel's file-name form of
    ``distribution`` (default: the engine's name)."""
    name = (distribution or engine).replace("-", "_")
    given = os.environ.get(f"HARNESS_{engine.upper()}_WHEEL")
    if given:
        named = [Path(path) for path in given.split(os.pathsep) if Path(path).name.startswith(f"{name}-{version}-")]
        return next((path for path in named if path.is_file()), None)
    found = sorted(Path(f"/tmp/{engine}-wheel").glob(f"{name}-{version}-*.whl"))
    return found[0] if found else None


def needs_release_wheel(wheel: Path | None, *, engine: str, name: str, version: str,
                        distribution: str | None = None) -> pytest.MarkDecorator:
    """Skip, saying where to put the wheel, where :func:`release_wheel` found none."""
    return pytest.mark.skipif(
        wheel is None,
        reason=f"no {name} {version} wheel here: set HARNESS_{engine.upper()}_WHEEL to one, or put it in "
               f"/tmp/{engine}-wheel (pip download {distribution or engine}=={version} --no-deps -d "
               f"/tmp/{engine}-wheel)")


def engine_source(engine: str) -> Path | None:
    """The source ``HARNESS_<ENGINE>_SOURCE`` names (a git directory of the engine's repository, or a folder of its
    files), else ``/tmp/<engine>-src`` where it exists."""
    given = os.environ.get(f"HARNESS_{engine.upper()}_SOURCE")
    found = Path(given) if given else Path(f"/tmp/{engine}-src")
    return found if found.is_dir() else None


def needs_engine_source(source: Path | None, *, engine: str, name: str, repository: str) -> pytest.MarkDecorator:
    """Skip, saying where to put the source, where :func:`engine_source` found none."""
    return pytest.mark.skipif(
        source is None,
        reason=f"no {name} source here: set HARNESS_{engine.upper()}_SOURCE to a clone of {repository} (or a folder "
               f"of its files), or put one at /tmp/{engine}-src")


def extraction_script(script: Path) -> types.ModuleType:
    """The extraction script ``script`` as a module, for its tables and checks."""
    loader = importlib.machinery.SourceFileLoader(script.name.replace("-", "_"), str(script))
    module = types.ModuleType(loader.name)
    module.__file__ = str(script)  # as when it runs: a script finds the files beside it from its own path
    loader.exec_module(module)
    return module


# The CUDA an engine's capture adapter meets, stood in on the CPU, for a test's script (indented as its own lines):
# after the script has defined its ``Stream`` and ``Graph`` classes and a ``log`` list, this puts them in torch.cuda,
# logs synchronisations, hands out numbered pool handles, and defines ``CudaBackend`` (what an adapter reads of a
# backend).
STAND_IN_CUDA_PATCHES = """
    pools = itertools.count()
    torch.cuda.Stream, torch.cuda.CUDAGraph = Stream, Graph
    torch.cuda.current_stream = lambda device=None: Stream()
    torch.cuda.device = torch.cuda.stream = lambda _: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: log.append("sync")
    torch.cuda.graph_pool_handle = lambda: (0, next(pools))
    class CudaBackend:  # the adapter reads the name, the device and the error bridge
        name, device = "cuda", None
        def translate_errors(self, error): return error
"""
