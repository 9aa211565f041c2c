"""TensorRT-LLM's breakable CUDA graph under the graphs suites: ``--impl graphs=trtllm``.

Bridges TensorRT-LLM's ``BreakableCUDAGraph`` and ``BreakableCUDAGraphCapture``
(``tensorrt_llm/_torch/pyexecutor/breakable_cuda_graph/``, adapted from SGLang's) to the capturer interface: breaks
reach TensorRT-LLM's ``eager_on_graph`` (``eager_on_graph(True)`` at :data:`TRTLLM_COMMIT`, a plain decorator at
later commits: :func:`break_marker`) through :func:`harness.graphs.receive_breaks`, and capture and replay
are set up as TensorRT-LLM's ``BreakableCUDAGraphRunner`` (``breakable_cuda_graph_runner.py``) sets them up: a
capture stream of its own that waits for the caller's, the warm-ups on it, one pool handle for every segment, the
capture inside ``enable_breakable_cuda_graph()``, the graph reset when a capture fails, and replay inside
``enable_breakable_cuda_graph()``. The runner itself is not driven: it captures a model body for a token bucket
from inside the model engine's forward.

TensorRT-LLM's module documents no narrower contract than the harness's (no sentence to quote), so nothing is
documented away: every clause is judged as it stands.

TensorRT-LLM publishes this code in its repository, not as a release on the package index, so the adapter targets
one commit, :data:`TRTLLM_COMMIT`; it is imported only when selected, from an installed TensorRT-LLM or a folder
made by ``.ci/gpu/extract-trtllm`` (``.trtllm``) on ``PYTHONPATH``. ``docs/graphs.md`` describes the bridges,
``docs/conformance/README.md`` how the report is recorded."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.conformance.clauses import DocumentedAway
from harness.errors import ImplementationError, UsageError
from harness.graphs import EngineBreaks, EngineCapturer, EngineGraph, GraphBackend

__all__ = ["TRTLLM_COMMIT", "LATER_COMMIT", "TRTLLMCapturer", "TRTLLMGraph", "DOCUMENTED_AWAY", "break_marker",
           "load_capturer", "engine_version"]

TRTLLM_COMMIT = "8989d7312b12aafed8d60270e4b02a772a5bb833"
BREAKABLE_MODULE = "tensorrt_llm._torch.pyexecutor.breakable_cuda_graph"
# Where .ci/gpu/extract-trtllm writes by default, and the variable .ci/gpu/engine-conformance reads it from.
DEFAULT_FOLDER = ".trtllm"
FOLDER_VARIABLE = "TRTLLM_MODULES"

DOCUMENTED_AWAY: dict[str, tuple[DocumentedAway, ...]] = {}
# A later commit read in the public code index, whose eager_on_graph is a plain decorator (docs/conformance/README.md
# says what else changed); not the target: its extraction is checked only from files stored at other commits.
LATER_COMMIT = "28e9e0716823d36750c153dd2e5bcebf6331032f"


def _missing_line(spec: str, error: ModuleNotFoundError) -> str:
    """What to do when TensorRT-LLM's modules cannot be imported: the folder to extract or to put on PYTHONPATH."""
    folder = os.environ.get(FOLDER_VARIABLE) or DEFAULT_FOLDER
    if (Path(folder) / "tensorrt_llm").is_dir():
        return (f"--impl {spec} needs TensorRT-LLM's modules, which are not importable here ({error}): the folder "
                f"{folder} holds them but is not on PYTHONPATH; run with PYTHONPATH={folder}")
    return (f"--impl {spec} needs TensorRT-LLM's modules, which are not importable here ({error}), and there is no "
            f"folder {folder}: .ci/gpu/extract-trtllm SOURCE {TRTLLM_COMMIT} {folder} makes it from a clone of "
            f"https://github.com/NVIDIA/TensorRT-LLM, then put it on PYTHONPATH")


def _import(spec: str, module: str) -> Any:
    """Import one of TensorRT-LLM's modules by its repository path; any failure is one line saying what to do."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (error.name == "tensorrt_llm" or module.startswith(error.name + ".")):
            raise ImplementationError(_missing_line(spec, error)) from None
        # The breakable graph asks the CUDA runtime through cuda-python, which a CUDA build of torch need not bring.
        cuda_python = (error.name or "").partition(".")[0] == "cuda"
        hint = " (cuda-python: pip install cuda-bindings, or carry its wheel in .whl/)" if cuda_python else ""
        raise ImplementationError(f"--impl {spec}: importing TensorRT-LLM's {module} failed: it imports "
                                  f"{error.name!r}, which is not installed{hint}") from None
    except Exception as error:  # noqa: BLE001 - whatever the engine's import raises, in one line
        from harness.impls import describe_exception

        raise ImplementationError(f"--impl {spec}: importing TensorRT-LLM's {module} failed: "
                                  f"{describe_exception(error)}") from None


def engine_version() -> str:
    """The TensorRT-LLM importable here: the installed distribution's version, else the commit the folder's files
    were extracted at (``commit 8989d7312b12``)."""
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        commit = getattr(importlib.import_module("tensorrt_llm"), "__commit__", None)
        return f"commit {commit[:12]}" if commit else "unknown"


def break_marker(breakable: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator that makes a break in the imported module: ``eager_on_graph(True)`` where ``eager_on_graph`` is
    a factory taking the flag (at :data:`TRTLLM_COMMIT`), ``eager_on_graph`` itself where it takes the function (at
    :data:`LATER_COMMIT`). Told apart by the one parameter's name and annotation; any other signature is refused in
    one line rather than guessed at."""
    mark = breakable.eager_on_graph
    try:
        parameters = list(inspect.signature(mark).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    if len(parameters) == 1:
        parameter = parameters[0]
        annotation = parameter.annotation
        if parameter.name == "enable" or annotation in (bool, "bool"):
            return mark(True)
        if parameter.name == "inner" or annotation is not inspect.Parameter.empty and "Callable" in str(annotation):
            return mark
    raise ImplementationError(f"--impl graphs=trtllm: TensorRT-LLM's eager_on_graph{_signature(mark)} is neither "
                              f"the factory eager_on_graph(enable) of commit {TRTLLM_COMMIT[:12]} nor the decorator "
                              f"eager_on_graph(inner) of commit {LATER_COMMIT[:12]}")


def _signature(function: Any) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(?)"


class _CountedBreaks(EngineBreaks):
    """Breaks go to TensorRT-LLM's ``eager_on_graph`` (:func:`break_marker`), which holds the arguments through
    make_weak_ref and copies the result into the capture-time one at replay; a name is recorded only when
    TensorRT-LLM counted the call as a break."""

    def __init__(self, mark: Callable[[Callable[..., Any]], Callable[..., Any]], graph: Any) -> None:
        super().__init__(mark)
        self._graph = graph

    def engine_breaks(self) -> int:
        return int(self._graph.num_breaks)


class TRTLLMGraph(EngineGraph):
    """A captured TensorRT-LLM ``BreakableCUDAGraph`` with the harness's graph interface; the counts are
    TensorRT-LLM's own, the empty segments included."""

    def __init__(self, graph: Any, output: Any, break_names: list[str], breakable: Any) -> None:
        super().__init__(graph, output, break_names)
        self._breakable = breakable

    @property
    def segment_count(self) -> int:
        return int(self._graph.num_segments)

    @property
    def break_count(self) -> int:
        return int(self._graph.num_breaks)

    def replay_engine(self) -> None:
        # Bridge: BreakableCUDAGraphRunner.execute replays inside enable_breakable_cuda_graph() and returns the
        # output it kept from the capture.
        with self._breakable.enable_breakable_cuda_graph():
            self._graph.replay()


_NEEDS_CUDA = ("--impl graphs=trtllm captures real CUDA graphs with TensorRT-LLM's BreakableCUDAGraph, which the "
               "emulated backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")


class TRTLLMCapturer(EngineCapturer):
    """The harness's capturer interface over TensorRT-LLM's ``BreakableCUDAGraphCapture``, set up as its
    ``BreakableCUDAGraphRunner`` captures: one capture stream of its own handed to every capture, one pool handle for
    every segment ("Passing None lets each CUDAGraph create its own private pool"), the warm-ups on the capture
    stream with no synchronisation, the graph reset when a capture raises. The runner leaves the collector alone;
    the adapter collects and turns it off during the capture as for the other engines (the suites drop earlier
    tests' graphs, and destroying one while a segment captures ends that capture)."""

    needs_cuda = _NEEDS_CUDA

    def __init__(self, backend: GraphBackend) -> None:
        super().__init__(backend)
        self._breakable = _import("graphs=trtllm", BREAKABLE_MODULE)

    def begin(self, pool: Any) -> tuple[Any, EngineBreaks]:
        graph = self._breakable.BreakableCUDAGraph()
        return graph, _CountedBreaks(break_marker(self._breakable), graph)

    @contextlib.contextmanager
    def capturing(self, state: Any, pool: Any) -> Iterator[None]:
        # Bridge (names): the runner's capture_context opens the capture this way.
        with self._breakable.enable_breakable_cuda_graph(), \
                self._breakable.BreakableCUDAGraphCapture(state, pool=pool, stream=self._stream):
            yield

    def failed(self, state: Any) -> None:
        state.reset()

    def finish(self, state: Any, output: Any, names: list[str]) -> TRTLLMGraph:
        return TRTLLMGraph(state, output, names, self._breakable)


def load_capturer(*, graph_backend: str | None = None) -> type[TRTLLMCapturer]:
    """The ``graphs`` adapter (``--impl graphs=trtllm``): checks TensorRT-LLM's modules import, and that the
    selected graph backend is CUDA, then returns the capturer class (called with the backend)."""
    _import("graphs=trtllm", BREAKABLE_MODULE)
    if graph_backend is not None and graph_backend != "cuda":
        raise UsageError(_NEEDS_CUDA)
    return TRTLLMCapturer


# The engine's modules whose reach its conformance reports measure (harness.conformance.reach), by component.
REACHED = {"graphs": (BREAKABLE_MODULE,)}
