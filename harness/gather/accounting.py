"""Counting what a gather costs: :func:`compile_accounting` (dynamo graphs, fallbacks, breaks) and
:func:`count_launches` (profiler: device kernels on CUDA; top-level ATen ops on the CPU, where
inductor's kernels are invisible to the profiler)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._dynamo.utils import counters

__all__ = [
    "COMPILED_GRAPH_BUDGET",
    "CompileTally",
    "compile_accounting",
    "open_recompile_limit",
    "LaunchCount",
    "count_launches",
]

# The compiled reference specialises index counts 0 and 1 (dynamo never makes 0/1-sized dims
# symbolic) and compiles one dynamic graph for every other count: three graphs per hidden-state
# mode (hidden buffer given or None), for fixed buffer dtypes, layouts and index dtype.
COMPILED_GRAPH_BUDGET = 6


def _config_name(*names: str) -> str:
    for name in names:
        if hasattr(torch._dynamo.config, name):
            return name
    raise AttributeError(f"torch {torch.__version__} has none of torch._dynamo.config.{names}")


@dataclasses.dataclass
class CompileTally:
    """What dynamo did inside a :func:`compile_accounting` block."""

    graphs: int = 0
    failed_frames: int = 0
    graph_breaks: int = 0

    @property
    def fell_back(self) -> bool:
        return self.failed_frames > 0 or self.graph_breaks > 0


def _snapshot() -> tuple[int, int, int]:
    frames = counters["frames"]
    return (counters["stats"]["unique_graphs"], frames["total"] - frames["ok"],
            sum(counters["graph_break"].values()))


@contextlib.contextmanager
def compile_accounting(*, fail_on_recompile_limit: bool = True,
                       recompile_limit: int | None = None) -> Iterator[CompileTally]:
    """Count graphs, failed frames and graph breaks in the block.

    ``fail_on_recompile_limit`` turns dynamo's silent fallback to eager, when a function exceeds
    its recompile limit, into an exception, so a test sees it instead of measuring eager code.
    ``recompile_limit``, when given, is the per-function limit in force inside the block.
    """
    tally = CompileTally()
    before = _snapshot()
    patch: dict[str, Any] = {
        _config_name("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"): fail_on_recompile_limit}
    if recompile_limit is not None:
        patch[_config_name("recompile_limit", "cache_size_limit")] = recompile_limit
    try:
        with torch._dynamo.config.patch(**patch):
            yield tally
    finally:
        after = _snapshot()
        tally.graphs, tally.failed_frames, tally.graph_breaks = (a - b for a, b in zip(after, before))


@contextlib.contextmanager
def open_recompile_limit(limit: int = 1024) -> Iterator[None]:
    """Raise dynamo's recompile limits for a block that compiles many graphs on purpose.

    Property tests vary dtypes and layouts, and each combination is a new graph; under the default
    limit (8) a compiled candidate would silently run eagerly after the eighth and the tests would
    check eager code. The stream a real engine sees is checked under the default limit instead.
    """
    patch: dict[str, Any] = {
        _config_name("recompile_limit", "cache_size_limit"): limit,
        _config_name("accumulated_recompile_limit", "accumulated_cache_size_limit"): limit,
        _config_name("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"): True,
    }
    with torch._dynamo.config.patch(**patch):
        yield


@dataclasses.dataclass(frozen=True)
class LaunchCount:
    """Per-call counts from :func:`count_launches`; ``kernels`` is None where it cannot be measured."""

    device: str
    kernels: float | None
    memory_ops: float | None
    aten_ops: float
    compiled_regions: float
    kernel_names: tuple[tuple[str, int], ...]
    # CUDA runtime calls that launch work from the host (kernel launches and CUDA-graph launches):
    # a graph replay is one launch however many kernels it holds. None off CUDA.
    host_launches: float | None = None

    def summary(self) -> str:
        if self.kernels is not None:
            return f"{self.kernels:g} kernels/call ({self.memory_ops:g} memcpy/memset)"
        return (f"kernels not measurable on {self.device}; {self.aten_ops:g} top-level ATen ops/call, "
                f"{self.compiled_regions:g} compiled regions/call")


# Kineto, the profiler's C++ side, logs "USDT: ... profiler_start" and "... profiler_stop" to stderr for
# every profile (48 lines per `bench gather` on the CPU; CUDA too), at its most severe level, above ERROR:
# only a level past every one silences them, so kineto's errors go with them. It reads this variable
# once, when the process's first profile starts.
_KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
_KINETO_SILENT = "6"


@contextlib.contextmanager
def _quiet_profiler() -> Iterator[None]:
    """Set ``KINETO_LOG_LEVEL`` past kineto's levels for the profile it wraps, then restore the environment;
    a level the user set (to see kineto's logs) is kept. Where an earlier profile of the process has
    started kineto already, its level stays what it was then."""
    if _KINETO_LOG_LEVEL in os.environ:
        yield
        return
    os.environ[_KINETO_LOG_LEVEL] = _KINETO_SILENT
    try:
        yield
    finally:
        os.environ.pop(_KINETO_LOG_LEVEL, None)


_MEMORY_OP_PREFIXES = ("Memcpy", "Memset", "memcpy", "memset")
_HOST_LAUNCH_MARKERS = ("LaunchKernel", "GraphLaunch")  # cudaLaunchKernel(ExC), cuLaunchKernel(Ex), cudaGraphLaunch


def count_launches(fn: Callable[[], Any], *, device: torch.device | str, calls: int = 3) -> LaunchCount:
    """Run ``fn`` ``calls`` times under the profiler and return the counts per call.

    Call ``fn`` once before (compiles, lazy initialisation and autotuning are not launches of a
    steady-state call).
    """
    device = torch.device(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with _quiet_profiler(), torch.profiler.profile(activities=activities) as profile:
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    kernels: collections.Counter[str] = collections.Counter()
    memory_ops = aten_ops = regions = host_launches = 0
    for event in profile.events():
        if event.device_type != torch.autograd.DeviceType.CUDA and any(m in event.name for m in _HOST_LAUNCH_MARKERS):
            host_launches += 1
        elif event.device_type == torch.autograd.DeviceType.CUDA:
            if event.name.startswith(_MEMORY_OP_PREFIXES):
                memory_ops += 1
            else:
                kernels[event.name] += 1
        elif event.cpu_parent is None and event.name.startswith("aten::"):
            aten_ops += 1
        elif event.name.startswith("Torch-Compiled Region"):
            regions += 1
    on_cuda = device.type == "cuda"
    return LaunchCount(
        device=str(device),
        kernels=sum(kernels.values()) / calls if on_cuda else None,
        memory_ops=memory_ops / calls if on_cuda else None,
        aten_ops=aten_ops / calls,
        compiled_regions=regions / calls,
        kernel_names=tuple(sorted(kernels.items())),
        host_launches=host_launches / calls if on_cuda else None,
    )
