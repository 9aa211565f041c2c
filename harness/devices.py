"""Turning a ``--device`` option into a ``torch.device``, with the one error for a missing GPU."""

from __future__ import annotations

import torch

from harness.errors import UsageError

__all__ = ["DEVICE_CHOICES", "resolve_device"]

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
