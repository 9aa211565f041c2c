"""SGLang's shipped code under the suites: ``--impl graphs=sglang``, ``--impl gather=sglang`` and ``--impl
runner=sglang``, and SGLang's module discovery as a discovery rule (:func:`sglang_0_5_23_rule`).

``graphs`` bridges SGLang's ``BreakableCUDAGraph`` to the capturer interface (breaks reach SGLang's
``eager_on_graph`` through :func:`harness.graphs.receive_breaks`); ``gather`` finds SGLang's
``gather_spec_extras`` by name; ``runner`` drives SGLang's ``PrefillCudaGraphRunner`` (its control path
unchanged, its data path on the stand-ins of the folder ``.ci/gpu/extract-sglang`` makes). Written against
:data:`SGLANG_VERSION`; SGLang is imported only when selected. ``docs/graphs.md``, ``docs/gather.md`` and
``docs/runner.md`` describe the bridges."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.batch import validate_buckets
from harness.conformance.clauses import DocumentedAway, outside_contract, rests_on_stand_in
from harness.errors import HarnessError, ImplementationError, UsageError
from harness.graphs import EngineBreaks, EngineCapturer, EngineGraph, GraphBackend, receive_breaks

if TYPE_CHECKING:
    from harness.runner.discovery import DiscoveryResult

__all__ = ["SGLANG_VERSION", "DOCUMENTED_AWAY", "SGLangCapturer", "SGLangGraph", "SGLangRunner", "load_capturer",
           "load_gather", "load_runner", "engine_version", "sglang_0_5_23_rule"]

SGLANG_VERSION = "0.5.23"
BREAKABLE_MODULE = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"
GATHER_MODULE = "sglang.kernels.ops.speculative.gather_spec_extras"
_INSTALL = (f"pip install sglang=={SGLANG_VERSION} (the release these adapters target), or put a folder of its "
            "modules on PYTHONPATH (.ci/gpu/extract-sglang makes one from the release wheel)")


def _import(spec: str, module: str) -> Any:
    """Import one of SGLang's modules by its public path; any failure is one line saying what to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (error.name == "sglang" or module.startswith(error.name + ".")):
            raise ImplementationError(f"--impl {spec} needs SGLang, which is not importable here ({error}): "
                                      f"{_INSTALL}") from None
        raise ImplementationError(f"--impl {spec}: importing SGLang's {module} failed: it imports {error.name!r}, "
                                  f"which is not installed; {_INSTALL}, with its dependencies") from None
    except Exception as error:  # noqa: BLE001 - whatever the engine's import raises, in one line
        from harness.impls import describe_exception

        raise ImplementationError(f"--impl {spec}: importing SGLang's {module} failed: "
                                  f"{describe_exception(error)}; {_INSTALL}") from None


def engine_version() -> str:
    """The SGLang version importable here (the installed distribution's, else the package's own)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(importlib.import_module("sglang"), "__version__", "unknown"))


# --- graphs ----------------------------------------------------------------------------------------


class SGLangGraph(EngineGraph):
    """A captured SGLang ``BreakableCUDAGraph`` with the harness's graph interface. Bridge (names): SGLang opens a
    segment when the capture begins and after every break, and closes one at every break and at the end; its
    container keeps the count private, so the counts are the defaults (breaks recorded, one segment more)."""

    def __init__(self, graph: Any, output: Any, break_names: list[str], breakable: Any) -> None:
        super().__init__(graph, output, break_names)
        self._breakable = breakable

    def replay_engine(self) -> None:
        # Bridge: SGLang's BreakableCudaGraphBackend replays inside enable_breakable_cuda_graph() (its
        # replay_session) and hands back the objects the capture returned.
        with self._breakable.enable_breakable_cuda_graph():
            self._graph.replay()


_NEEDS_CUDA = ("--impl graphs=sglang captures real CUDA graphs with SGLang's BreakableCUDAGraph, which the "
               "emulated backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")


class SGLangCapturer(EngineCapturer):
    """The harness's capturer interface over SGLang's ``BreakableCUDAGraphCapture``, set up as SGLang's runners capture:
    every graph on one dedicated capture stream (get_or_create_global_graph_capture_stream) that first waits for the
    caller's, one pool for the runner (get_or_create_global_graph_memory_pool: the device module's
    graph_pool_handle()), the collector collected and kept from destroying graphs during a capture (freeze_gc)."""

    needs_cuda = _NEEDS_CUDA

    def __init__(self, backend: GraphBackend) -> None:
        super().__init__(backend)
        self._breakable = _import("graphs=sglang", BREAKABLE_MODULE)

    def begin(self, pool: Any) -> tuple[Any, EngineBreaks]:
        return self._breakable.BreakableCUDAGraph(), EngineBreaks(self._breakable.eager_on_graph)

    def warm_up(self, fn: Callable[[], Any], runs: int) -> None:
        # Bridge (warm-up): BreakableCudaGraphBackend.capture_one synchronises and runs the forward eagerly before
        # capturing; the harness's interface says how many times.
        for _ in range(runs):
            torch.cuda.synchronize(self.device)
            fn()
        torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def capturing(self, state: Any, pool: Any) -> Iterator[None]:
        # Bridge (names): capture_session/replay_session wrap capture in enable_breakable_cuda_graph().
        with self._breakable.enable_breakable_cuda_graph(), \
                self._breakable.BreakableCUDAGraphCapture(cuda_graph=state, pool=pool, stream=self._stream):
            yield

    def finish(self, state: Any, output: Any, names: list[str]) -> SGLangGraph:
        return SGLangGraph(state, output, names, self._breakable)




def load_capturer(*, graph_backend: str | None = None) -> type[SGLangCapturer]:
    """The ``graphs`` adapter (``--impl graphs=sglang``): checks SGLang imports, and that the selected
    graph backend is CUDA, then returns the capturer class (called with the backend)."""
    _import("graphs=sglang", BREAKABLE_MODULE)
    if graph_backend is not None and graph_backend != "cuda":
        raise UsageError(_NEEDS_CUDA)
    return SGLangCapturer


# --- gather ----------------------------------------------------------------------------------------


def load_gather(*, graph_backend: str | None = None) -> Callable[..., Any]:
    """The ``gather`` adapter (``--impl gather=sglang``): SGLang's ``gather_spec_extras`` itself.

    Bridge (names): its signature is the harness's gather contract, so nothing is wrapped; the
    engine's function is what the suites call, on whatever device they select.
    """
    return _import("gather=sglang", GATHER_MODULE).gather_spec_extras


# --- discovery ---------------------------------------------------------------------------------------

DISCOVERY_MODULE = "sglang_discovery"  # written by .ci/gpu/extract-sglang into the folder, beside sglang/
DISCOVERY_FUNCTION = "_resolve_transformer_layer_model"
FOLDER_VARIABLE = "SGLANG_MODULES"  # the folder .ci/gpu/run and engine-conformance read (default .sglang)
DEFAULT_FOLDER = ".sglang"


def _discovery_function() -> Callable[[nn.Module], Any]:
    """SGLang 0.5.23's ``_resolve_transformer_layer_model``, as cut verbatim from the release wheel into the
    folder's ``sglang_discovery`` module; one line saying how to make that folder where it is not importable."""
    try:
        module = importlib.import_module(DISCOVERY_MODULE)
    except ModuleNotFoundError as error:
        if error.name != DISCOVERY_MODULE:
            raise
        folder = os.environ.get(FOLDER_VARIABLE) or DEFAULT_FOLDER
        if (Path(folder) / f"{DISCOVERY_MODULE}.py").is_file():
            where = f"the folder {folder} holds it but is not on PYTHONPATH"
        elif (Path(folder) / "sglang").is_dir():
            where = f"the folder {folder} lacks it (an older .ci/gpu/extract-sglang made it)"
        else:
            where = f"there is no folder {folder}"
        raise ImplementationError(
            f"sglang_0_5_23_rule runs SGLang {SGLANG_VERSION}'s own discovery code from the module "
            f"{DISCOVERY_MODULE}, which is not importable here: {where}; .ci/gpu/extract-sglang WHEEL {folder} "
            f"writes it from the release wheel (pip download sglang=={SGLANG_VERSION} --no-deps -d DIR), then put "
            f"{folder} on PYTHONPATH") from None
    version = getattr(module, "VERSION", None)
    if version != SGLANG_VERSION:
        raise ImplementationError(f"sglang_0_5_23_rule: the importable {DISCOVERY_MODULE} ({module.__file__}) was cut "
                                  f"from sglang {version}, not {SGLANG_VERSION}: extract the {SGLANG_VERSION} wheel")
    return getattr(module, DISCOVERY_FUNCTION)


def sglang_0_5_23_rule(model: nn.Module) -> DiscoveryResult:
    """SGLang 0.5.23's discovery rule, run from the release's own code: ``_resolve_transformer_layer_model`` of
    ``sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py`` (it calls ``resolve_language_model`` of
    ``sglang/srt/model_loader/utils.py``, then walks ``.model`` until a module with ``.layers``), imported from
    the folder ``.ci/gpu/extract-sglang`` makes (on PYTHONPATH).

    Bridge (result): SGLang returns the module, which becomes a :class:`harness.runner.DiscoveryResult` with
    the module's path among ``model.named_modules()`` (found by identity) and ``fell_back=False``; SGLang has
    no fallback. Where it raises ``RuntimeError`` ("could not resolve inner layer_model ..."), its prefill
    runner refuses the model ("This backend is unsupported for this model architecture"): that becomes
    :class:`harness.runner.DiscoveryRefused` with SGLang's message. Other exceptions propagate as they are.
    """
    from harness.runner.discovery import DiscoveryRefused, DiscoveryResult  # at call time: no import cost

    resolve = _discovery_function()
    try:
        found = resolve(model)
    except RuntimeError as error:
        raise DiscoveryRefused("sglang_0_5_23", type(model).__name__, str(error)) from error
    path = next((name for name, module in model.named_modules() if module is found), None)
    if path is None:
        raise DiscoveryRefused("sglang_0_5_23", type(model).__name__,
                               f"SGLang's rule returned a {type(found).__name__} that is not a module of the model")
    return DiscoveryResult(found, path, False, "sglang_0_5_23", (path or "<root>",))


# --- runner ------------------------------------------------------------------------------------------

RUNNER_MODULE = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
RUNNER_STANDINS = "sglang_runner_standins"  # written by .ci/gpu/extract-sglang into the folder, beside sglang/
_RUNNER_SOURCE = "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py"
_RUNNER_NEEDS_CUDA = ("--impl runner=sglang runs SGLang's PrefillCudaGraphRunner, whose BreakableCudaGraphBackend "
                      "captures real CUDA graphs, which the emulated backend cannot stand in for: run with --device "
                      "cuda --graph-backend cuda on a GPU")
_EAGER = ("ModelRunner's eager prefill (the harness's stand-in: the model's forward under the scheduler's no_grad, "
          "per-token outputs cut to the real tokens)")
_NO_GRAD = ("the scheduler's grad mode around a forward (the harness's stand-in: no_grad, inference_mode where "
            "built in it)")

DOCUMENTED_AWAY: dict[str, tuple[DocumentedAway, ...]] = {
    "runner": (
        DocumentedAway(
            "fell-back-graph",
            quote="This backend is unsupported for this model architecture.",
            where=f"{_RUNNER_SOURCE}, PrefillCudaGraphRunner.__init__",
            note="SGLang has no discovery fallback: where _resolve_transformer_layer_model finds no module with "
                 "layers, the runner is not built (the adapter raises DiscoveryRefused with SGLang's message), so "
                 "there is no whole-model graph to replay or refuse."),
        DocumentedAway(
            "discovery-reported",
            quote="This backend is unsupported for this model architecture.",
            where=f"{_RUNNER_SOURCE}, PrefillCudaGraphRunner.__init__",
            note="With no fallback there is no fallback warning: every layout SGLang cannot resolve is refused, "
                 "with or without strict_discovery."),
    ),
}


def _runner_standins() -> Any:
    """The folder's ``sglang_runner_standins`` (it imports SGLang's runner module); one line where either is missing."""
    _import("runner=sglang", RUNNER_MODULE)
    try:
        return importlib.import_module(RUNNER_STANDINS)
    except ModuleNotFoundError as error:
        if error.name != RUNNER_STANDINS:
            raise
        raise ImplementationError(
            f"--impl runner=sglang needs the data-path stand-ins of SGLang's prefill runner ({RUNNER_STANDINS}), "
            f"written beside sglang/ by .ci/gpu/extract-sglang WHEEL DIR (an installed SGLang has its real engine, "
            "which the adapter does not drive): make the folder and put it on PYTHONPATH") from None


class SGLangRunner:
    """The harness's runner interface (``docs/runner.md``) over SGLang 0.5.23's ``PrefillCudaGraphRunner`` with its
    breakable backend: SGLang's ``__init__`` discovers the layer stack and captures every bucket, ``can_run_graph``
    decides, ``execute`` replays. ``graphs`` only says which backend the suites selected: SGLang captures with its
    own backend. Outputs are what SGLang's ``execute`` returns, not copied."""

    def __init__(self, model: nn.Module, *, buckets: Any, graphs: Any, strict_discovery: bool = False) -> None:
        if getattr(getattr(graphs, "backend", None), "name", "cuda") != "cuda" or not torch.cuda.is_available():
            raise UsageError(_RUNNER_NEEDS_CUDA)
        standins = _runner_standins()
        self.model = model
        self.buckets = validate_buckets(buckets)
        from harness.runner.runner import RunnerStats  # at call time: the adapters package imports no runner

        self.stats = RunnerStats()
        self.built_in_inference_mode = torch.is_inference_mode_enabled()
        # Bridge (configuration): the buckets are the server's prefill token shapes (--cuda-graph-bs-prefill).
        standins.configure_prefill_buckets(self.buckets)
        breakable = _import("runner=sglang", BREAKABLE_MODULE)
        rests_on_stand_in(f"{RUNNER_STANDINS}.ModelRunner (the zoo model on one GPU, for SGLang's ModelRunner)")
        try:
            # Bridge (breaks): the zoo's attention is a harness break; inside SGLang's capture it goes to SGLang's
            # eager_on_graph, as its own attention layers are marked.
            with receive_breaks(EngineBreaks(breakable.eager_on_graph)), self._grad_mode():
                self.inner = standins.PrefillCudaGraphRunner(standins.ModelRunner(model))
        except RuntimeError as error:
            if "could not resolve inner layer_model" not in str(error):
                raise
            from harness.runner.discovery import DiscoveryRefused

            outside_contract("fell-back-graph")
            raise DiscoveryRefused("sglang_0_5_23", type(model).__name__, str(error)) from error
        self.stats.captures = len(self.inner.backend._graphs)
        from harness.runner.discovery import DiscoveryResult

        layer_model = self.inner.layer_model
        path = next(name for name, module in model.named_modules() if module is layer_model)
        self.discovery = DiscoveryResult(layer_model, path, False, "sglang_0_5_23", (path or "<root>",))
        self._batch_class = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardBatch

    def _grad_mode(self) -> Any:
        # SGLang's scheduler runs every forward without autograd (its outer models' forwards carry no_grad too);
        # the runner's execute relies on it.
        rests_on_stand_in(_NO_GRAD)
        return torch.inference_mode() if self.built_in_inference_mode else torch.no_grad()

    def bucket_for(self, num_tokens: int) -> int:
        from harness.batch import select_bucket

        return select_bucket(num_tokens, self.buckets)

    def _sglang_batch(self, batch: Any) -> Any:
        return self._batch_class.from_harness(batch)

    def can_run(self, batch: Any) -> bool:
        return bool(self.inner.can_run_graph(self._sglang_batch(batch)))

    def replay(self, batch: Any) -> Any:
        forward_batch = self._sglang_batch(batch)
        rows = len(forward_batch.input_ids)
        if not self.inner.can_run_graph(forward_batch):
            if rows > self.buckets[-1]:
                self.bucket_for(rows)  # raises BucketError naming the count
            raise HarnessError(f"SGLang's PrefillCudaGraphRunner.can_run_graph refuses {batch.describe()} "
                               f"({rows} rows; buckets {list(self.buckets)})")
        bucket = self.inner._pad_to_bucket(rows, self.inner.capture_num_tokens)
        with self._grad_mode():
            output = self.inner.execute(forward_batch)
        self.stats.replays += 1
        self.stats.replays_by_bucket[bucket] = self.stats.replays_by_bucket.get(bucket, 0) + 1
        return output

    def run(self, batch: Any) -> Any:
        if self.can_run(batch):
            return self.replay(batch)
        rests_on_stand_in(_EAGER)
        from harness.runner.runner import map_tensors

        rows = batch.input_ids.shape[0]
        with self._grad_mode():
            output = self.model(batch.input_ids, batch.positions, batch)
        self.stats.eager_fallbacks += 1
        if rows == batch.num_tokens:
            return output
        return map_tensors(output, lambda t: t[:batch.num_tokens] if t.dim() and t.shape[0] == rows else t)

    def capture_plan(self) -> dict[str, Any]:
        # Bridge (names): SGLang keeps each shape's BreakableCUDAGraph in its backend, keyed by ShapeKey; the graph
        # holds its segments and break callables privately.
        graphs = {}
        for key, graph in sorted(self.inner.backend._graphs.items(), key=lambda item: item[0].size):
            graphs[str(key.size)] = {"segments": len(graph._segments), "breaks": len(graph._break_fns)}
        return {"graphs": graphs}

    def __repr__(self) -> str:
        return f"<SGLangRunner buckets={list(self.buckets)} over {type(self.inner).__mro__[1].__qualname__}>"


def load_runner(*, graph_backend: str | None = None) -> type[SGLangRunner]:
    """The ``runner`` adapter (``--impl runner=sglang``): checks SGLang's runner module and its stand-ins import, and
    that the selected graph backend is CUDA, then returns :class:`SGLangRunner` (the factory)."""
    _runner_standins()
    if graph_backend is not None and graph_backend != "cuda":
        raise UsageError(_RUNNER_NEEDS_CUDA)
    return SGLangRunner


# The engine's modules whose reach its conformance reports measure (harness.conformance.reach), by component.
REACHED = {"graphs": (BREAKABLE_MODULE,), "gather": (GATHER_MODULE,), "runner": (RUNNER_MODULE, BREAKABLE_MODULE)}
