"""TensorRT-LLM's breakable CUDA graph under the graphs suites: ``--impl graphs=trtllm``.

Bridges TensorRT-LLM's ``BreakableCUDAGraph`` and ``BreakableCUDAGraphCapture``
(``tensorrt_llm/_torch/pyexecutor/breakable_cuda_graph/``, adapted from SGLang's) to the capturer interface: breaks
reach TensorRT-LLM's ``eager_on_graph(True)`` through :func:`harness.graphs.receive_breaks`, and capture and replay
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

import gc
import importlib
import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.conformance.clauses import DocumentedAway
from harness.errors import ImplementationError, UsageError
from harness.graphs import EngineBreakBody, GraphBackend, receive_breaks

__all__ = ["TRTLLM_COMMIT", "TRTLLMCapturer", "TRTLLMGraph", "DOCUMENTED_AWAY", "load_capturer", "engine_version"]

TRTLLM_COMMIT = "8989d7312b12aafed8d60270e4b02a772a5bb833"
BREAKABLE_MODULE = "tensorrt_llm._torch.pyexecutor.breakable_cuda_graph"
# Where .ci/gpu/extract-trtllm writes by default, and the variable .ci/gpu/engine-conformance reads it from.
DEFAULT_FOLDER = ".trtllm"
FOLDER_VARIABLE = "TRTLLM_MODULES"

DOCUMENTED_AWAY: dict[str, tuple[DocumentedAway, ...]] = {}


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


class _ForwardBreaks:
    """The break receiver of one capture: each harness break call goes to TensorRT-LLM's ``eager_on_graph(True)``.

    Bridge (names): TensorRT-LLM marks breaks with its own decorator, which reads its active capture when called;
    decorating the harness's break body at call time is the same as decorating it where it is defined. What the
    decorator does with the arguments and the result (held through make_weak_ref, the result copied into the
    capture-time one at replay), nested breaks and re-entrant captures are TensorRT-LLM's. A name is recorded only
    when TensorRT-LLM counted the call as a break.
    """

    def __init__(self, mark: Callable[[Callable[..., Any]], Callable[..., Any]], graph: Any) -> None:
        self._mark = mark
        self._graph = graph
        self.names: list[str] = []

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        before = self._graph.num_breaks
        result = self._mark(EngineBreakBody(self._mark).wrap(fn))(*args, **kwargs)
        if self._graph.num_breaks > before:
            self.names.append(getattr(fn, "__qualname__", repr(fn)))
        return result


class TRTLLMGraph:
    """A captured TensorRT-LLM ``BreakableCUDAGraph`` with the harness's graph interface."""

    def __init__(self, graph: Any, output: Any, break_names: list[str], breakable: Any) -> None:
        self._graph = graph
        self._breakable = breakable
        self.output = output
        self.break_names = list(break_names)

    @property
    def segment_count(self) -> int:
        return int(self._graph.num_segments)  # TensorRT-LLM's own count, the empty segments included

    @property
    def break_count(self) -> int:
        return int(self._graph.num_breaks)

    def replay(self) -> Any:
        # Bridge: BreakableCUDAGraphRunner.execute replays inside enable_breakable_cuda_graph() and returns the
        # output it kept from the capture; BreakableCUDAGraph.replay() itself returns None.
        with self._breakable.enable_breakable_cuda_graph():
            self._graph.replay()
        return self.output

    def __repr__(self) -> str:
        return f"<TRTLLMGraph {self.segment_count} segments, {self.break_count} breaks>"


class TRTLLMCapturer:
    """The harness's capturer interface over TensorRT-LLM's ``BreakableCUDAGraphCapture``."""

    def __init__(self, backend: GraphBackend) -> None:
        if backend.name != "cuda":
            raise UsageError(_NEEDS_CUDA)
        self._breakable = _import("graphs=trtllm", BREAKABLE_MODULE)
        self.backend = backend
        self.device = torch.device(getattr(backend, "device", None) or "cuda")
        # Bridge (stream): BreakableCUDAGraphRunner makes one capture stream and hands it to every capture.
        self._stream = torch.cuda.Stream(device=self.device)

    def new_pool(self) -> Any:
        # Bridge (pool): the runner makes its pool with torch.cuda.graph_pool_handle() and passes that one handle to
        # every segment ("Passing None lets each CUDAGraph create its own private pool").
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> TRTLLMGraph:
        breakable = self._breakable
        pool = self.new_pool() if pool is None else pool
        graph = breakable.BreakableCUDAGraph()
        receiver = _ForwardBreaks(breakable.eager_on_graph(True), graph)
        caller = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(caller)
        # Bridge (capture set-up): the runner leaves the collector alone; the suites drop graphs and tensors of
        # earlier tests, and a collection that destroys a graph while a segment captures ends that capture, so it
        # is collected first and off while the capture runs, as the SGLang and vLLM adapters have it.
        gc.collect()
        collector_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
                # Bridge (warm-up): the runner's capture runs the forward eagerly on the capture stream first (two
                # steps, no synchronisation); the interface says how many.
                for _ in range(warmup_runs):
                    fn()
                # Bridge (names): the runner's capture_context opens the capture this way.
                with breakable.enable_breakable_cuda_graph(), receive_breaks(receiver), \
                        breakable.BreakableCUDAGraphCapture(graph, pool=pool, stream=self._stream):
                    output = fn()
        except BaseException as error:
            # Bridge (failure): the runner resets the graph of a capture that raised, then re-raises.
            graph.reset()
            # Bridge (error types): a CUDA capture failure (a host sync, a copy to the host) becomes the harness's
            # CaptureError, as the harness's own CUDA backend reports it; TensorRT-LLM's own exceptions and the
            # breaks' propagate unchanged.
            translated = self.backend.translate_errors(error)
            if translated is not error:
                raise translated from error
            raise
        finally:
            caller.wait_stream(self._stream)
            if collector_was_enabled:
                gc.enable()
        return TRTLLMGraph(graph, output, receiver.names, breakable)


_NEEDS_CUDA = ("--impl graphs=trtllm captures real CUDA graphs with TensorRT-LLM's BreakableCUDAGraph, which the "
               "emulated backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")


def load_capturer(*, graph_backend: str | None = None) -> type[TRTLLMCapturer]:
    """The ``graphs`` adapter (``--impl graphs=trtllm``): checks TensorRT-LLM's modules import, and that the
    selected graph backend is CUDA, then returns the capturer class (called with the backend)."""
    _import("graphs=trtllm", BREAKABLE_MODULE)
    if graph_backend is not None and graph_backend != "cuda":
        raise UsageError(_NEEDS_CUDA)
    return TRTLLMCapturer
