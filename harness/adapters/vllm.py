"""vLLM's shipped breakable capture under the graphs suites: ``--impl graphs=vllm``.

Bridges vLLM's ``BreakableCUDAGraphCapture`` (``vllm/compilation/breakable_cudagraph.py``) to the capturer
interface: breaks reach vLLM's ``eager_break_during_capture`` through :func:`harness.graphs.receive_breaks`,
and capture is set up as vLLM's model runner sets it up around ``BreakableCUDAGraphWrapper`` (a dedicated
capture stream, the collector off, warm-ups first). The wrapper itself is not driven: its dispatch needs a
configured engine and a forward context.

vLLM documents a narrower contract than the harness's: breaks write an output buffer in place (what a break
returns is not propagated at replay), and a second capture in one thread raises ``RuntimeError``. The
adapter does not make up for either; :data:`DOCUMENTED_AWAY` declares the clauses this narrows away, with
vLLM's own sentences, and ``python -m harness conformance`` reports them as ``documented away``.

Written against the releases of :data:`VLLM_VERSIONS` (0.33.0 and 0.34.0); the imported release decides the
set-up (:data:`BRIDGES`): 0.33.0's capture is preceded by its late-capture guard, as BreakableCUDAGraphWrapper
calls it, and 0.34.0 has no such guard. Their capture context and break decorator are the same code, so the
same clauses are documented away with the same sentences (the unit tests check them in each release's module).
vLLM is imported only when selected, from an installed vLLM or a folder made by ``.ci/gpu/extract-vllm``
(``.vllm``) on ``PYTHONPATH``; another release is refused in one line. ``docs/graphs.md`` describes the
bridges, ``docs/conformance/README.md`` how the report is recorded."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.conformance.clauses import DocumentedAway, outside_contract
from harness.errors import ImplementationError, UsageError
from harness.graphs import EngineBreaks, EngineCapturer, EngineGraph, GraphBackend

__all__ = ["VLLM_VERSION", "VLLM_VERSIONS", "BRIDGES", "VLLMCapturer", "VLLMGraph", "DOCUMENTED_AWAY", "load_capturer",
           "engine_version"]

VLLM_VERSION = "0.33.0"  # the release the scheduled GPU job extracts and records (gpu.yml), and messages name
VLLM_VERSIONS = ("0.33.0", "0.34.0")  # the releases the adapter bridges
BREAKABLE_MODULE = "vllm.compilation.breakable_cudagraph"
MONITOR_MODULE = "vllm.compilation.monitor"
# Where .ci/gpu/extract-vllm writes by default, and the variable .ci/gpu/run reads it from.
DEFAULT_FOLDER = ".vllm"
FOLDER_VARIABLE = "VLLM_MODULES"

_SOURCE = "vllm/compilation/breakable_cudagraph.py"

# The same sentences in 0.33.0 and 0.34.0 (their capture context and break decorator did not change); where a release
# words them differently, declare its own tuple and choose it by engine_version().
DOCUMENTED_AWAY: dict[str, tuple[DocumentedAway, ...]] = {
    "graphs": (
        DocumentedAway(
            "write-back",
            quote="Replay does not return values; callers should propagate any downstream dependencies via "
                  "static output buffers.",
            where=f"{_SOURCE}, BreakableCUDAGraphCapture.add_eager",
            note="What a break returns reaches its caller at capture only; at replay it is dropped, so the "
                 "objects the break returned at capture keep their capture-time contents unless the break wrote "
                 "into them itself."),
        DocumentedAway(
            "changes-raise",
            quote="Decorated ops must write into a caller-provided output tensor; a fresh tensor returned by "
                  "``fn`` would change address each replay and break downstream graph segments.",
            where=f"{_SOURCE}, eager_break_during_capture",
            note="A break's return value is not looked at during replay, so a changed shape, dtype or structure "
                 "of it raises nothing; returning a new object is outside vLLM's contract."),
        DocumentedAway(
            "immutable-values-refused",
            quote="Replay does not return values; callers should propagate any downstream dependencies via "
                  "static output buffers.",
            where=f"{_SOURCE}, BreakableCUDAGraphCapture.add_eager",
            note="A bare Python value a break returns is handed back at capture and never again; vLLM does not "
                 "refuse it at capture."),
        DocumentedAway(
            "not-reentrant",
            quote="Thread-local: only one capture may be active per thread.",
            where=f"{_SOURCE}, BreakableCUDAGraphCapture",
            note="A second capture in the thread, also from a break body, raises RuntimeError(\"Nested "
                 "BreakableCUDAGraphCapture is not supported.\"), not the harness's CaptureError; the adapter "
                 "passes it on unchanged."),
    ),
}


def _missing_line(spec: str, error: ModuleNotFoundError) -> str:
    """What to do when vLLM's modules cannot be imported: the folder to extract or to put on PYTHONPATH."""
    folder = os.environ.get(FOLDER_VARIABLE) or DEFAULT_FOLDER
    extract = (f".ci/gpu/extract-vllm WHEEL {folder} makes it from the release wheel "
               f"(pip download vllm=={VLLM_VERSION} --no-deps -d DIR)")
    if (Path(folder) / "vllm").is_dir():
        return (f"--impl {spec} needs vLLM's modules, which are not importable here ({error}): the folder {folder} "
                f"holds them but is not on PYTHONPATH; run with PYTHONPATH={folder} (or pip install "
                f"vllm=={VLLM_VERSION})")
    return (f"--impl {spec} needs vLLM's modules, which are not importable here ({error}), and there is no folder "
            f"{folder}: {extract}, then put it on PYTHONPATH (or pip install vllm=={VLLM_VERSION})")


def _import(spec: str, module: str) -> Any:
    """Import one of vLLM's modules by its public path; any failure is one line saying what to do."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (error.name == "vllm" or module.startswith(error.name + ".")):
            raise ImplementationError(_missing_line(spec, error)) from None
        raise ImplementationError(f"--impl {spec}: importing vLLM's {module} failed: it imports {error.name!r}, "
                                  f"which is not installed (a folder made by .ci/gpu/extract-vllm lists what its "
                                  f"modules import in STANDINS.md)") from None
    except Exception as error:  # noqa: BLE001 - whatever the engine's import raises, in one line
        from harness.impls import describe_exception

        raise ImplementationError(f"--impl {spec}: importing vLLM's {module} failed: "
                                  f"{describe_exception(error)}") from None


def engine_version() -> str:
    """The vLLM version importable here: the imported package's own (``vllm.__version__``, what runs, also from a
    folder made by .ci/gpu/extract-vllm), else the installed distribution's, else ``unknown``."""
    try:
        version = getattr(importlib.import_module("vllm"), "__version__", None)
    except Exception:  # noqa: BLE001 - whatever the engine's import raises: the distribution's metadata then
        version = None
    if version:
        return str(version)
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Bridges:
    """What the adapter sets up differently for one vLLM release (names and set-up only; vLLM computes the same).

    ``late_capture_guard``: the name of the guard in ``vllm.compilation.monitor`` that BreakableCUDAGraphWrapper
    calls before each capture (0.33.0: ``validate_cudagraph_capturing_enabled``, which raises once the model runner
    has turned capturing off after start-up), or None where the release has none (0.34.0: the wrapper captures an
    unseen batch descriptor whenever it meets one)."""

    def __init__(self, *, late_capture_guard: str | None) -> None:
        self.late_capture_guard = late_capture_guard


BRIDGES = {
    "0.33.0": Bridges(late_capture_guard="validate_cudagraph_capturing_enabled"),
    "0.34.0": Bridges(late_capture_guard=None),
}


def bridges_for(spec: str, version: str) -> Bridges:
    """The set-up for the imported release ``version`` (a local suffix, ``+cu130``, ignored); another release is
    refused in one line."""
    found = BRIDGES.get(version.split("+")[0])
    if found is None:
        raise ImplementationError(
            f"--impl {spec}: the vLLM imported here is {version}; the adapter bridges vLLM "
            f"{' and '.join(VLLM_VERSIONS)} only (harness/adapters/vllm.py, BRIDGES): extract one of those with "
            f".ci/gpu/extract-vllm, or pip install vllm=={VLLM_VERSIONS[-1]}")
    return found


class _ContractBreaks(EngineBreaks):
    """Breaks go to vLLM's ``eager_break_during_capture``, which holds tensor arguments through weak_ref_tensor and
    returns the result at capture, dropping it at replay; a name is recorded only when vLLM counted the call as a
    break (a call from inside a break body runs inline there)."""

    def __init__(self, mark: Callable[[Callable[..., Any]], Callable[..., Any]], capture: Any) -> None:
        super().__init__(mark)
        self._capture = capture

    def engine_breaks(self) -> int:
        return int(self._capture.num_eager_breaks)

    def counted(self, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not _within_contract(result, (*args, *kwargs.values())):
            # vLLM's contract: a break writes a caller-provided buffer and its result is dropped at replay
            # (DOCUMENTED_AWAY, write-back): a test whose break hands back a new object is outside it.
            outside_contract("write-back")


def _within_contract(result: Any, arguments: tuple[Any, ...]) -> bool:
    """Whether a break's result keeps to vLLM's documented contract: nothing, or one of its own arguments, or a
    view of an argument tensor's memory (a buffer it wrote in place), found among the arguments and the lists,
    tuples and dicts they hold."""
    if result is None:
        return True
    memory = result.untyped_storage().data_ptr() if isinstance(result, torch.Tensor) else None
    pending = list(arguments)
    while pending:
        argument = pending.pop()
        if argument is result or (memory is not None and isinstance(argument, torch.Tensor)
                                  and argument.untyped_storage().data_ptr() == memory):
            return True
        if isinstance(argument, (list, tuple)):
            pending.extend(argument)
        elif isinstance(argument, dict):
            pending.extend(argument.values())
    return False


class VLLMGraph(EngineGraph):
    """A finished vLLM ``BreakableCUDAGraphCapture`` with the harness's graph interface. Bridge (names): vLLM's
    replay() runs the segments and the breaks in order and returns None; its usage reads the outputs where the
    capture left them ("Output tensors live at the same addresses as during capture"), so ``replay()`` returns
    ``graph.output``, that same object, not refreshed here. The counts are vLLM's own, the empty segments
    included."""

    @property
    def segment_count(self) -> int:
        return int(self._graph.num_graphs)

    @property
    def break_count(self) -> int:
        return int(self._graph.num_eager_breaks)


_NEEDS_CUDA = ("--impl graphs=vllm captures real CUDA graphs with vLLM's BreakableCUDAGraphCapture, which the "
               "emulated backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")


class VLLMCapturer(EngineCapturer):
    """The harness's capturer interface over vLLM's ``BreakableCUDAGraphCapture``, set up as vLLM's runner captures
    around ``BreakableCUDAGraphWrapper``: inside graph_capture() on a stream of its own that first waits for the
    caller's (one stream for every capture of the capturer, as graph_capture() keeps one for a runner's captures;
    0.34.0 also captures a model's inner replay graphs on it), every segment of a capture in its graph pool (the
    CUDA platform's graph_pool_handle()), under freeze_gc_for_cudagraph_capture (collected, then the collector off;
    its freezing of the heap, a speed-up for bulk capture, is left out). Where the release has a late-capture guard
    (0.33.0), it is called before each capture, as the wrapper calls it."""

    needs_cuda = _NEEDS_CUDA

    def __init__(self, backend: GraphBackend) -> None:
        super().__init__(backend)
        self._breakable = _import("graphs=vllm", BREAKABLE_MODULE)
        self.version = engine_version()
        self.bridges = bridges_for("graphs=vllm", self.version)
        self._guard: Callable[[], None] | None = None
        if self.bridges.late_capture_guard is not None:
            self._guard = getattr(_import("graphs=vllm", MONITOR_MODULE), self.bridges.late_capture_guard)

    def begin(self, pool: Any) -> tuple[Any, EngineBreaks]:
        capture = self._breakable.BreakableCUDAGraphCapture(pool=pool)
        return capture, _ContractBreaks(self._breakable.eager_break_during_capture, capture)

    def warm_up(self, fn: Callable[[], Any], runs: int) -> None:
        # Bridge (warm-up): the runner's _warmup_and_capture runs the forward eagerly (no graph) the configured
        # number of times and synchronises before capturing.
        super().warm_up(fn, runs)
        if runs:
            torch.cuda.synchronize(self.device)

    def capturing(self, state: Any, pool: Any) -> Any:
        if self._guard is not None:
            self._guard()  # 0.33.0: BreakableCUDAGraphWrapper._capture's guard, before its capture context
        return state

    def finish(self, state: Any, output: Any, names: list[str]) -> VLLMGraph:
        return VLLMGraph(state, output, names)


def load_capturer(*, graph_backend: str | None = None) -> type[VLLMCapturer]:
    """The ``graphs`` adapter (``--impl graphs=vllm``): checks vLLM's modules import, and that the selected
    graph backend is CUDA, then returns the capturer class (called with the backend)."""
    _import("graphs=vllm", BREAKABLE_MODULE)
    bridges_for("graphs=vllm", engine_version())
    if graph_backend is not None and graph_backend != "cuda":
        raise UsageError(_NEEDS_CUDA)
    return VLLMCapturer


# The engine's modules whose reach its conformance reports measure (harness.conformance.reach), by component.
REACHED = {"graphs": (BREAKABLE_MODULE,)}
