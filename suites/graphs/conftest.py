"""Fixtures shared by the graph suites.

Every call the suites make into the implementation under test goes through :class:`GraphOracle` (the
``graph_oracle`` fixture), which hands it to one :class:`harness.oracle.Checker` beside its eager twin: a capture
must leave the process and the modules it runs as eager leaves them, and a replay must look, on everything a
caller can observe, like the program run eagerly (:func:`harness.graphs.run_eagerly`). Tests say what the program
and its eager twin are; they do not pick what to compare."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from harness.graphs import run_eagerly
from harness.oracle import Checker, calling_mode, example_caller_context

__all__ = ["GraphOracle", "observable"]


def observable(value: Any) -> Any:
    """What a caller can read of a result, in a form the checker walks: an object with attributes (``__dict__`` or
    ``__slots__``, dataclasses included) becomes the dict of its attributes named with its type, so that its members
    are compared, not its identity, at any depth (inside namedtuples too); the rest stays as it is."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, bool, str)):
        return value
    if isinstance(value, dict):
        return {key: observable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [observable(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    slots = [name for cls in type(value).__mro__ for name in _slot_names(cls)]
    if not (hasattr(value, "__dict__") or slots) or callable(value):
        return value
    members = {name: getattr(value, name) for name in slots if hasattr(value, name)}
    members |= dict(getattr(value, "__dict__", {}))
    return {f"{type(value).__name__}.{name}": observable(item) for name, item in members.items()}


def _slot_names(cls: type) -> tuple[str, ...]:
    slots = cls.__dict__.get("__slots__", ())
    names = (slots,) if isinstance(slots, str) else tuple(slots)
    return tuple(name for name in names if name not in ("__dict__", "__weakref__"))


class GraphOracle:
    """The implementation under test (``graph_capturer``) called through the one checker of the suites.

    * :meth:`capture` runs a capture under the caller's ``mode`` through :meth:`Checker.construct`: it must leave
      the process state (modes, default dtype, the collector, global hooks, ...) and ``modules`` as they were.
    * :meth:`replay` replays a graph through :meth:`Checker.call` against ``eager`` run eagerly under the same
      ``mode``. What a caller observes of a replay is what ``replay()`` returned, ``graph.output`` read again, and
      the output handle held since the capture (``docs/graphs.md``: one object, refreshed in place), so all three
      are compared with eager's one result, with their metadata, aliasing, the state left behind and the random
      state. ``inputs`` are the static tensors the program reads; ``eager_inputs`` their twin where the program
      writes its own state (each side writes its own copy and both must end alike).
    * :meth:`capture_fails` and :meth:`replay_fails` expect an error and check that the failed call left the
      process and ``modules`` as they were.
    """

    def __init__(self, capturer: Any, context: Callable[..., Any], exact: bool) -> None:
        self.capturer = capturer
        self.exact = exact
        self._context = context
        self.checker = Checker("graphs", context=context)
        self._held: dict[int, tuple[Any, Any]] = {}

    def fresh(self) -> GraphOracle:
        """A new oracle for one hypothesis example: no results or handles kept from earlier examples."""
        return GraphOracle(self.capturer, self._context, self.exact)

    def new_pool(self) -> Any:
        return self.capturer.new_pool()

    def capture(self, fn: Callable[[], Any], /, *, modules: Sequence[torch.nn.Module] = (), mode: str | None = None,
                pool: Any = None, warmup_runs: int = 1, **details: Any) -> Any:
        __tracebackhide__ = True
        # The example's caller's context is entered outside the calling mode: leaving torch.inference_mode restores
        # the thread's dispatch keys as they were at its entry, so autocast set inside it would end with it.
        example_caller_context(self.checker.component)
        with calling_mode(mode):
            graph = self.checker.construct(lambda: self.capturer.capture(fn, pool=pool, warmup_runs=warmup_runs),
                                           modules=modules, mode=mode, step="capture", **details)
        self._held[id(graph)] = (graph, graph.output)
        return graph

    def replay(self, graph: Any, eager: Callable[[], Any], /, *, inputs: Any = (), eager_inputs: Any = None,
               modules: Sequence[torch.nn.Module] = (), mode: str | None = None, exact: bool | None = None,
               **details: Any) -> Any:
        """Replay ``graph`` beside ``eager`` (the program as the graph must see it) and return what ``replay()``
        returned, after the checker has compared everything a caller observes."""
        __tracebackhide__ = True
        held = self._held.get(id(graph), (graph, graph.output))[1]
        returned: list[Any] = []

        def candidate() -> dict[str, Any]:
            returned.append(graph.replay())
            return {"replay()": observable(returned[0]), "graph.output": observable(graph.output),
                    "output held since capture": observable(held)}

        def twin() -> dict[str, Any]:
            result = observable(run_eagerly(eager))
            return {"replay()": result, "graph.output": result, "output held since capture": result}

        self.checker.call(candidate, twin, inputs=inputs, eager_inputs=eager_inputs, modules=modules,
                          exact=self.exact if exact is None else exact, mode=mode, step="replay", **details)
        return returned[0]

    def capture_fails(self, fn: Callable[[], Any], /, error: type[BaseException] | tuple[type[BaseException], ...], *,
                      match: str | None = None, modules: Sequence[torch.nn.Module] = (), mode: str | None = None,
                      pool: Any = None, warmup_runs: int = 1, **details: Any) -> BaseException:
        __tracebackhide__ = True
        return self._fails(lambda: self.capturer.capture(fn, pool=pool, warmup_runs=warmup_runs), error, match=match,
                           modules=modules, mode=mode, step="failing capture", **details)

    def replay_fails(self, graph: Any, error: type[BaseException] | tuple[type[BaseException], ...], *,
                     match: str | None = None, modules: Sequence[torch.nn.Module] = (), mode: str | None = None,
                     **details: Any) -> BaseException:
        __tracebackhide__ = True
        return self._fails(graph.replay, error, match=match, modules=modules, mode=mode, step="failing replay",
                           **details)

    def _fails(self, call: Callable[[], Any], error: Any, *, match: str | None, modules: Sequence[torch.nn.Module],
               mode: str | None, **details: Any) -> BaseException:
        __tracebackhide__ = True

        def attempt() -> BaseException:
            with pytest.raises(error, match=match) as raised:
                call()
            return raised.value

        example_caller_context(self.checker.component)  # outside the calling mode, as in capture
        with calling_mode(mode):
            return self.checker.construct(attempt, modules=modules, mode=mode, **details)


@pytest.fixture
def exact(exact_comparison) -> bool:
    """Whether the suites' float32 programs are held bitwise to eager here: the one rule of
    :func:`harness.compare.bitwise_expected` (bitwise on the emulated backend, the table on CUDA)."""
    return exact_comparison(torch.float32)


@pytest.fixture
def graph_oracle(graph_capturer, failure_context, exact) -> GraphOracle:
    """The implementation under test, every capture and replay checked against eager (:class:`GraphOracle`)."""
    return GraphOracle(graph_capturer, failure_context, exact)


@pytest.fixture
def make_tensor(device):
    """``make_tensor(*shape, seed=...)``: normal values from a seeded generator, on the test device."""

    def make(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    return make
