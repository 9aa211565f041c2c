"""Writes that bypass a tensor's version counter (:data:`BYPASSING_WRITES`), as callers and kernels make them.

In-place torch ops on a tensor or its views move its version counter; these routes reach the same memory through
an alias with a counter of its own, or none: ``.data``, the untyped storage, a DLPack view, a numpy view and raw
memory at ``data_ptr``. Eager reads whatever the memory holds, so an implementation that keys derived data on the
version counter must see these writes too. Each route writes ``values`` (same shape and dtype) into a contiguous
``tensor`` and leaves ``tensor._version`` where it was."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

__all__ = ["BYPASSING_WRITES", "HOST_ONLY_WRITES", "bypassing_writes_for"]


def _through_data(tensor: torch.Tensor, values: torch.Tensor) -> None:
    tensor.data.copy_(values)


def _through_storage(tensor: torch.Tensor, values: torch.Tensor) -> None:
    # Raw bytes into the whole storage, as a kernel handed the storage writes it.
    staged = torch.empty_like(tensor).copy_(values)
    tensor.untyped_storage().copy_(staged.untyped_storage())


def _through_dlpack(tensor: torch.Tensor, values: torch.Tensor) -> None:
    torch.from_dlpack(tensor).copy_(values)


def _numpy_bits(tensor: torch.Tensor) -> torch.Tensor:
    # numpy has no bfloat16: its bits go through an int16 view (a view shares the counter; numpy moves none).
    return tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor


def _through_numpy(tensor: torch.Tensor, values: torch.Tensor) -> None:
    _numpy_bits(tensor).numpy()[...] = _numpy_bits(values.to(tensor.device)).numpy()


def _through_data_ptr(tensor: torch.Tensor, values: torch.Tensor) -> None:
    staged = values.to(tensor.device).contiguous()
    ctypes.memmove(tensor.data_ptr(), staged.data_ptr(), staged.numel() * staged.element_size())


#: Route name -> ``write(tensor, values)``.
BYPASSING_WRITES: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    "data": _through_data,
    "untyped-storage": _through_storage,
    "dlpack": _through_dlpack,
    "numpy": _through_numpy,
    "data-ptr": _through_data_ptr,
}
#: The routes that reach host memory only (numpy views and a host memmove exist for CPU tensors alone).
HOST_ONLY_WRITES = frozenset({"numpy", "data-ptr"})


def bypassing_writes_for(device: torch.device) -> dict[str, Callable[[torch.Tensor, torch.Tensor], None]]:
    """The routes a caller can write a tensor on ``device`` through."""
    return {name: write for name, write in BYPASSING_WRITES.items()
            if device.type == "cpu" or name not in HOST_ONLY_WRITES}
