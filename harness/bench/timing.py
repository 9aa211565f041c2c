"""How benchmarks time a call: warm-up, then repeats, each timed by CUDA events and the host clock.

Each repeat is one sample; reports give the median and spread, never a mean over a loop, so a noisy
machine shows as a wide spread instead of a shifted number."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.bench.report import Stat

__all__ = ["Timing", "synchronize", "time_call", "spin_up"]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per call: ``gpu`` from CUDA events on the current stream, ``wall`` from the host clock."""

    gpu: Stat
    wall: Stat


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spin_up(device: torch.device, *, seconds: float = 0.5) -> None:
    """Keep the GPU busy for ``seconds`` so that the first measurement does not see idle clocks."""
    if device.type != "cuda":
        return
    a = torch.randn(2048, 2048, device=device)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            a = torch.tanh(a @ a) * 0.5
        synchronize(device)


def time_call(fn: Callable[[], Any], *, device: torch.device, repeat: int, warmup: int = 3,
              inner: int = 1) -> Timing:
    """Run ``fn`` ``warmup`` times, then ``repeat`` samples of ``inner`` back-to-back calls.

    CUDA only: on the CPU the benchmarks report counts, not times (see :mod:`harness.bench.report`).
    """
    if device.type != "cuda":
        raise ValueError("time_call measures GPU work; the CPU emulation reports counts only")
    for _ in range(warmup):
        fn()
    synchronize(device)
    gpu, wall = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeat):
        host_start = time.perf_counter()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        wall.append((time.perf_counter() - host_start) * 1e3 / inner)
        gpu.append(start.elapsed_time(end) / inner)
    return Timing(Stat.of(gpu), Stat.of(wall))
