"""Fixtures of the gather suites: every call into the implementation under test goes through one checker.

``gather_function`` (root conftest, from the component table) is the implementation selected with
``--impl gather=SPEC`` (the compiled reference by default). ``check_gather`` runs it beside the eager
oracle (:func:`~harness.gather.eager_gather`) on the same arguments through :class:`harness.oracle.Checker`,
which compares everything a caller can observe: values bit for bit, each output's dtype, shape, strides,
``requires_grad``, ``is_inference`` and autograd attachment, which inputs an output shares memory with, the
sources and indices left as eager leaves them, the process state and random state left behind, and that the
results of the previous call of the same test survive this one. Tests choose the calls (cases, orders, the
caller's autograd mode), never what is compared.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.gather import BUFFER_NAMES, OUTPUT_NAMES, GatherCase, GatherOutputs, eager_gather, open_recompile_limit
from harness.graphs import GraphCapturer
from harness.oracle import Checker

_ARGUMENT_NAMES = ("indices", *BUFFER_NAMES)
# The checker names outputs by position and inputs by name; the failure message says which output is which.
_KEPT_CALLS = 4
_OUTPUTS = ", ".join(f"[{position}] {name}" for position, name in enumerate(OUTPUT_NAMES))


@pytest.fixture(autouse=True)
def _lifted_recompile_limit() -> Any:
    """Every dtype/layout combination is a new graph for a compiled candidate; under dynamo's
    default limit (8) the ninth would silently run eagerly and the suites would check eager code.
    The stream a real engine sees is checked under the default limit in ``test_compile.py``."""
    with open_recompile_limit():
        yield


@dataclasses.dataclass
class GatherCalls:
    """Calls of the implementation under test, each checked against the eager oracle on the same arguments.

    ``check_gather(case, mode=..., **details)`` builds ``case`` and checks one call; ``.args(*args, ...)`` checks
    a call on tensors the test holds (refilled in place, reused across steps); ``.as_gather(...)`` is a gather
    that checks every call made through it (a relay's); ``.capture(backend, *args)`` captures a call in a graph
    and ``.replay(graph, *args)`` checks a replay of it; ``.anew()`` forgets the kept results (a hypothesis
    example starts from nothing). ``mode`` is the caller's autograd mode (:data:`harness.oracle.CALLING_MODES`;
    None keeps the current one)."""

    gather: Callable[..., GatherOutputs]
    device: torch.device
    context: Callable[..., Any]
    checker: Checker = dataclasses.field(init=False)
    replays: Checker = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # The results of the last few calls are kept and checked at each call, not only the previous one's:
        # output buffers used in turn (double buffering) keep one call's results and overwrite them a call later.
        self.checker = Checker("gather", context=self.context, keep=_KEPT_CALLS)
        self.replays = Checker("graphs", context=self.context)

    def __call__(self, case: GatherCase, *, mode: str | None = None, **details: Any) -> GatherOutputs:
        __tracebackhide__ = True
        return self.args(*case.build(self.device).args, case=case, mode=mode, **details)

    def args(self, *args: Any, case: GatherCase | None = None, mode: str | None = None,
             **details: Any) -> GatherOutputs:
        """Check ``gather(*args)`` against ``eager_gather(*args)`` and return the candidate's result; ``case``, the
        case the arguments were built from, describes them in a failure (and a hang's message)."""
        __tracebackhide__ = True
        described = case.describe() if case is not None else {}
        return self._check(self.checker, lambda: self.gather(*args), args, mode=mode, **described, **details)

    def as_gather(self, *, mode: str | None = None, **details: Any) -> Callable[..., GatherOutputs]:
        """A gather with the candidate's signature whose every call is checked (with ``details``)."""

        def checked(*args: Any) -> GatherOutputs:
            __tracebackhide__ = True
            return self.args(*args, mode=mode, **details)

        return checked

    def capture(self, backend: Any, *args: Any, **details: Any) -> Any:
        """Capture ``gather(*args)`` in a graph of ``backend``, checked as a construction: it leaves the process
        as it found it (modes, default dtype, random state, ...)."""
        __tracebackhide__ = True
        return self.replays.construct(lambda: GraphCapturer(backend).capture(lambda: self.gather(*args)),
                                      modules=(), **details)

    def replay(self, graph: Any, *args: Any, **details: Any) -> GatherOutputs:
        """Replay ``graph``, a captured ``gather(*args)``, and check its outputs against ``eager_gather(*args)``
        on the tensors as they are now. A replay is a graph's call: its outputs are the capture's static tensors,
        rewritten by the next replay, as the ``graphs`` rows of :data:`harness.oracle.ALLOWED` say; those rows
        apply, through a checker of the ``graphs`` component, to these calls only."""
        __tracebackhide__ = True

        def replayed() -> GatherOutputs:
            graph.replay()
            return tuple(graph.output)  # type: ignore[return-value]

        return self._check(self.replays, replayed, args, call="graph replay", **details)

    def anew(self, *, in_turns: Callable[[], contextlib.AbstractContextManager] | None = None) -> GatherCalls:
        """The same calls with no kept results: what one hypothesis example returned is no business of the next
        (a failure must replay from its own example). With ``in_turns``, each call of the implementation (not its
        eager twin, not the checks) runs inside ``in_turns()``: a thread's turns at a
        :class:`~harness.oracle.concurrency.Lockstep`, so that the calls of several threads, each with its own
        ``GatherCalls``, run interleaved op by op."""
        gather = self.gather
        if in_turns is not None:
            def gather(*args: Any, _gather: Callable[..., GatherOutputs] = self.gather) -> GatherOutputs:
                with in_turns():
                    return _gather(*args)

        return GatherCalls(gather, self.device, self.context)

    def _check(self, checker: Checker, candidate: Callable[[], Any], args: tuple[Any, ...], *,
               mode: str | None = None, **details: Any) -> GatherOutputs:
        __tracebackhide__ = True
        named = dict(zip(_ARGUMENT_NAMES, args))
        return checker.call(candidate, lambda: eager_gather(*args), inputs=named, exact=True, mode=mode,
                            **details, outputs=_OUTPUTS)


@pytest.fixture
def check_gather(gather_function, device, failure_context) -> GatherCalls:
    """The one way the gather suites call the implementation under test (see :class:`GatherCalls`)."""
    return GatherCalls(gather_function, device, failure_context)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the kernel-launch counts the launch suite recorded (they travel through xdist)."""
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == "gather_launches" and getattr(report, "when", "call") == "call":
                    lines.append(f"{report.nodeid}: {value}")
    if lines:
        terminalreporter.write_sep("-", "gather kernel launches")
        for line in sorted(set(lines)):
            terminalreporter.write_line(line)
