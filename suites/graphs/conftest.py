"""Fixtures shared by the graph suites."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def exact(exact_comparison) -> bool:
    """Whether the suites' float32 programs are held bitwise to eager here: the one rule of
    :func:`harness.compare.bitwise_expected` (bitwise on the emulated backend, the table on CUDA)."""
    return exact_comparison(torch.float32)


@pytest.fixture
def make_tensor(device):
    """``make_tensor(*shape, seed=...)``: normal values from a seeded generator, on the test device."""

    def make(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    return make
