"""Where the harness runs: :func:`resolve`, the one resolver of ``--device`` and ``--graph-backend``.

Every entry point (pytest plugin, ``selfcheck``, ``conformance``, ``bench``) asks it, and it says how
processes share a machine's cores. Importing this module imports no torch."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from harness.errors import UsageError

if TYPE_CHECKING:
    import torch

__all__ = ["BACKEND_CHOICES", "COMPILE_THREADS_VARIABLE", "DEVICE_CHOICES", "EXPERTS_IMPLEMENTATIONS",
           "EXPERTS_VARIABLE", "Placement", "resolve", "experts_implementation",
           "use_one_compile_worker"]

COMPILE_THREADS_VARIABLE = "TORCHINDUCTOR_COMPILE_THREADS"

# How MoE and hybrid stacks run their experts (transformers' ``config._experts_implementation``).
# ``batched_mm`` first: it is what an engine runs under CUDA graphs. transformers 5.x defaults to
# ``grouped_mm``, whose fp32 path on CUDA falls back to a host loop that capture refuses (most of the
# zoo's MoE and hybrid stacks), while the CPU has a kernel for it; ``eager`` is the
# modules' own per-expert loop.
EXPERTS_IMPLEMENTATIONS = ("batched_mm", "grouped_mm", "eager")
# The run's choice, in the environment so that child processes (kill matrix, subprocess cases) share it;
# the pytest option --experts-implementation sets it.
EXPERTS_VARIABLE = "HARNESS_EXPERTS_IMPLEMENTATION"

DEVICE_CHOICES = ("auto", "cpu", "cuda")
BACKEND_CHOICES = ("auto", "cuda", "emulated")


@dataclasses.dataclass(frozen=True)
class Placement:
    """A resolved request: the device type (``cpu`` or ``cuda``) and the graph backend (``cuda`` or ``emulated``);
    :func:`harness.graphs.backend_for` makes its backend object."""

    device_type: str
    graph_backend: str

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device(self.device_type)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(*, device: str = "auto", graph_backend: str = "auto", cuda_available: bool | None = None) -> Placement:
    """The one rule: ``auto`` device is ``cuda`` when torch sees a GPU, else ``cpu``; ``auto`` backend is ``cuda``
    on a CUDA device, else ``emulated``. A CUDA request that cannot be met is a :class:`UsageError`, never a
    silent move to another device. ``cuda_available`` overrides torch's answer (tests)."""
    if device not in DEVICE_CHOICES:
        raise UsageError(f"unknown device {device!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if graph_backend not in BACKEND_CHOICES:
        raise UsageError(f"unknown graph backend {graph_backend!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    has_cuda = _cuda_available() if cuda_available is None else cuda_available
    if device == "cuda" and not has_cuda:
        raise UsageError(f"--device cuda was requested but torch {_torch_version()} sees no CUDA device; "
                         "run on a GPU runner or use --device cpu")
    device_type = ("cuda" if has_cuda else "cpu") if device == "auto" else device
    if graph_backend == "cuda" and device_type != "cuda":
        if device == "auto":
            raise UsageError("--graph-backend cuda was requested but torch sees no CUDA device; "
                             "use --graph-backend emulated")
        raise UsageError("--graph-backend cuda needs --device cuda (or --device auto on a machine with a GPU)")
    backend = ("cuda" if device_type == "cuda" else "emulated") if graph_backend == "auto" else graph_backend
    return Placement(device_type, backend)


def _torch_version() -> str:
    import torch

    return torch.__version__


def use_one_compile_worker(environment: MutableMapping[str, str]) -> None:
    """Inductor compiles in the process itself, unless ``environment`` already says how.

    Inductor's default with Triton is a pool of one subprocess per core, each importing torch, in every xdist
    worker, rank and child process of a run. Given ``os.environ`` after Inductor's config was read, the config
    is set too."""
    if COMPILE_THREADS_VARIABLE in environment:
        return
    environment[COMPILE_THREADS_VARIABLE] = "1"
    config: Any = sys.modules.get("torch._inductor.config")
    if config is not None and environment is os.environ:
        config.compile_threads = 1


def experts_implementation(requested: str | None = None) -> str:
    """The experts implementation of this run: ``requested``, else the environment's
    (:data:`EXPERTS_VARIABLE`), else ``batched_mm``; an unknown name is a :class:`UsageError`."""
    name = requested or os.environ.get(EXPERTS_VARIABLE) or EXPERTS_IMPLEMENTATIONS[0]
    if name not in EXPERTS_IMPLEMENTATIONS:
        raise UsageError(f"unknown experts implementation {name!r} (from "
                         f"{'the argument' if requested else EXPERTS_VARIABLE}); "
                         f"choose one of {', '.join(EXPERTS_IMPLEMENTATIONS)}")
    return name
