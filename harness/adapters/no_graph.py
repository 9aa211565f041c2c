"""What the adapters of the two ``@no_graph`` packages share: ``breakable-cuda-graphs`` (``--impl graphs=bcg``,
:mod:`harness.adapters.bcg`) and ``piecewise-cuda-graphs`` (``--impl graphs=pcg``, :mod:`harness.adapters.pcg`).

Both are one pure-Python module on torch with one design under two sets of names: a sequence object that holds the
captured segments and eager steps (``BreakableCUDAGraph``, ``CUDAGraphSequence``), a context that captures into it
(``breakable_graph``, ``piecewise_graph``), and the break decorator ``no_graph``. A :class:`NoGraphPackage` names one
package; :class:`NoGraphCapturer` bridges it to the capturer interface (``docs/graphs.md``): breaks reach the
package's ``no_graph`` through :func:`harness.graphs.receive_breaks`, and capture is set up as the packages' README
shows (warm-ups on a side stream, then the capture context), with the adapter's capture stream handed to the
context's ``stream`` argument. The package is imported only when its adapter is selected."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch

from harness.conformance.clauses import DocumentedAway, outside_contract
from harness.errors import ImplementationError, UsageError
from harness.graphs import EngineBreaks, EngineCapturer, EngineGraph, GraphBackend

__all__ = ["NoGraphPackage", "NoGraphBreaks", "NoGraphCapturer", "NoGraphSequence", "documented_away",
           "holds_cuda_tensor", "load"]


@dataclasses.dataclass(frozen=True)
class NoGraphPackage:
    """One ``@no_graph`` package: the ``--impl graphs=`` name, its distribution and module, the version the adapter
    was written against, and the names of its sequence class and capture context."""

    spec: str
    distribution: str
    module: str
    version: str
    sequence: str
    context: str

    @property
    def needs_cuda(self) -> str:
        return (f"--impl graphs={self.spec} captures real CUDA graphs with {self.sequence} of {self.distribution}, "
                f"which the emulated backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")

    def load(self) -> Any:
        """The package's module; any failure to import it is one :class:`ImplementationError` line."""
        try:
            return importlib.import_module(self.module)
        except ModuleNotFoundError as error:
            if error.name == self.module:
                raise ImplementationError(
                    f"--impl graphs={self.spec} needs the package {self.distribution}, which is not importable here "
                    f"({error}): pip install {self.distribution}=={self.version} (for .ci/gpu/run on a machine "
                    f"without a package index, carry its wheel in .whl/)") from None
            raise ImplementationError(f"--impl graphs={self.spec}: importing {self.module} failed: it imports "
                                      f"{error.name!r}, which is not installed") from None
        except Exception as error:  # noqa: BLE001 - whatever the package's import raises, in one line
            from harness.impls import describe_exception

            raise ImplementationError(f"--impl graphs={self.spec}: importing {self.module} failed: "
                                      f"{describe_exception(error)}") from None

    def engine_version(self) -> str:
        """The version importable here: the installed distribution's, else the module's ``__version__``."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return str(getattr(importlib.import_module(self.module), "__version__", "unknown"))


def documented_away(package: NoGraphPackage) -> dict[str, tuple[DocumentedAway, ...]]:
    """The clauses both packages' ``no_graph`` docstring narrows, quoted from it (the same sentences in both)."""
    where = f"{package.module}.py, no_graph"
    refused = "Decorated functions must not return CUDA tensors."
    return {
        "graphs": (
            DocumentedAway(
                "write-back", quote=refused, where=where,
                note="A break hands its CUDA results on through buffers it is given; returning one (in a tuple, "
                     "list or dict) is refused at capture with RuntimeError. What a break does return reaches its "
                     "caller at capture only: replay runs the eager step and drops its result. The sentence covers "
                     "CUDA tensors; the Python values and CPU tensors the package allows a break to return are "
                     "dropped at replay too, which it does not say, so a test of another clause whose break hands "
                     "such values on is counted, not listed apart."),
            DocumentedAway(
                "changes-raise", quote=refused, where=where,
                note="A break's result is not looked at during replay, so a changed shape, dtype or structure of "
                     "it raises nothing; a CUDA tensor in it is refused at capture only."),
            DocumentedAway(
                "immutable-values-refused", quote="Scalars and CPU tensors are allowed.", where=where,
                note="A bare Python value a break returns is accepted at capture and handed back then, never "
                     "again: the package does not refuse it."),
        ),
    }


def holds_cuda_tensor(value: Any) -> bool:
    """Whether ``value`` is or holds a CUDA tensor: in lists, tuples, sets, dicts and objects' attributes
    (``__dict__`` or ``__slots__``), nested to any depth, cycles included."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.is_cuda:
                return True
        elif isinstance(item, (list, tuple, set, frozenset)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif not isinstance(item, (type, str, bytes, int, float, complex, bool)) and item is not None:
            pending.extend(getattr(item, "__dict__", {}).values())
            for cls in type(item).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if hasattr(item, name):
                        pending.append(getattr(item, name))
    return False


def _watched(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, telling the conformance report when it returns a CUDA tensor: the package's docstring says a break
    must not (``DOCUMENTED_AWAY``, write-back), so that test uses the package outside its contract. Its result is
    handed on unchanged; whether the package refuses it is the package's to decide."""

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if holds_cuda_tensor(result):
            outside_contract("write-back")
        return result

    return watched


def _eager_steps(module: Any, sequence: Any) -> int:
    # The packages keep no public count: their sequence's segment list holds one entry per captured graph and per
    # eager step, which is read here, never changed.
    return sum(isinstance(step, module._EagerSegment) for step in sequence._segments)


class NoGraphBreaks(EngineBreaks):
    """Breaks go to the package's ``no_graph``, which ends the segment, runs the body, refuses a CUDA tensor in
    its result, keeps its arguments (CUDA tensors as aliases that own nothing) and begins the next segment; a
    name is recorded only when the package recorded the eager step."""

    def __init__(self, module: Any, sequence: Any) -> None:
        super().__init__(module.no_graph)
        self._module = module
        self._sequence = sequence

    def engine_breaks(self) -> int:
        return _eager_steps(self._module, self._sequence)

    def run_break(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return super().run_break(_watched(fn), args, kwargs)


class NoGraphSequence(EngineGraph):
    """A captured sequence with the harness's graph interface. The package's replay runs the segments and the eager
    steps in order and returns None; ``replay()`` returns ``graph.output``, the object the capture returned. The
    counts are the package's own, the empty segments included."""

    def __init__(self, graph: Any, output: Any, break_names: list[str], module: Any) -> None:
        super().__init__(graph, output, break_names)
        self._module = module

    @property
    def break_count(self) -> int:
        return _eager_steps(self._module, self._graph)

    @property
    def segment_count(self) -> int:
        return len(self._graph._segments) - self.break_count


class NoGraphCapturer(EngineCapturer):
    """The harness's capturer interface over one ``@no_graph`` package (``package``, set by the subclass): a sequence
    per capture made with the capture's pool (every segment captures into it), the warm-ups on the adapter's capture
    stream, then the package's capture context given that stream. The packages ship no runner: a failed capture's
    sequence is dropped as it is (their README resets nothing)."""

    package: ClassVar[NoGraphPackage]

    def __init__(self, backend: GraphBackend) -> None:
        super().__init__(backend)
        self._module = self.package.load()

    def begin(self, pool: Any) -> tuple[Any, EngineBreaks]:
        sequence = getattr(self._module, self.package.sequence)(pool=pool)
        return sequence, NoGraphBreaks(self._module, sequence)

    @contextlib.contextmanager
    def capturing(self, state: Any, pool: Any) -> Iterator[None]:
        # Bridge (set-up): the context's stream argument, "analogous to torch.cuda.graph", so that segments and
        # breaks run on the stream the warm-ups ran on (left out, each segment would capture on torch's one
        # process-wide default capture stream).
        with getattr(self._module, self.package.context)(state, stream=self._stream):
            yield

    def finish(self, state: Any, output: Any, names: list[str]) -> NoGraphSequence:
        return NoGraphSequence(state, output, names, self._module)


def load(capturer: type[NoGraphCapturer], *, graph_backend: str | None) -> type[NoGraphCapturer]:
    """The ``graphs`` adapter's loader: checks the package imports and the graph backend is CUDA, then returns the
    capturer class (called with the backend)."""
    capturer.package.load()
    if graph_backend is not None and graph_backend != "cuda":
        raise UsageError(capturer.package.needs_cuda)
    return capturer
