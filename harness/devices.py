"""Turning a ``--device`` option into a ``torch.device``, with the one error for a missing GPU; how the
harness's processes share a machine's cores."""

from __future__ import annotations

import os
import sys
from typing import MutableMapping

import torch

from harness.errors import UsageError

__all__ = ["COMPILE_THREADS_VARIABLE", "DEVICE_CHOICES", "resolve_device", "use_one_compile_worker"]

COMPILE_THREADS_VARIABLE = "TORCHINDUCTOR_COMPILE_THREADS"

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(option: str) -> torch.device:
    """``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without a GPU is a :class:`UsageError`."""
    if option not in DEVICE_CHOICES:
        raise UsageError(f"unknown device {option!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if option == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if option == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda was requested but torch {torch.__version__} sees no CUDA device; "
            "run on a GPU runner or use --device cpu"
        )
    return torch.device(option)


def use_one_compile_worker(environment: MutableMapping[str, str]) -> None:
    """Inductor compiles in the process itself, unless ``environment`` already says how.

    Its default where Triton is installed (every GPU runner) is a pool of one subprocess per core, up to 32,
    started at the first compile; each of them imports torch. A suite run spreads over xdist workers, rank
    processes and child processes, and each would start its own pool for kernels of a few lines: on a
    16-core runner that is hundreds of torch imports fighting the tests for the cores. Given
    ``os.environ`` after Inductor's config was read, the config is set too."""
    if COMPILE_THREADS_VARIABLE in environment:
        return
    environment[COMPILE_THREADS_VARIABLE] = "1"
    config = sys.modules.get("torch._inductor.config")
    if config is not None and environment is os.environ:
        config.compile_threads = 1
