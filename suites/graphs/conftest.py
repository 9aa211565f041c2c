"""Fixtures shared by the graph suites."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def exact(graph_backend) -> bool:
    """Bitwise on the emulated backend (it replays the eager kernels); the tolerance table on CUDA,
    where a captured GEMM may use another cuBLAS workspace and algorithm than the eager call."""
    return graph_backend.name == "emulated"


@pytest.fixture
def make_tensor(device):
    """``make_tensor(*shape, seed=...)``: normal values from a seeded generator, on the test device."""

    def make(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    return make
