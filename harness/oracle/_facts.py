"""What a caller can see of a call's results and inputs: each tensor's metadata, and which tensors share memory.

A structure (tensors nested in tuples, lists, dicts, dataclasses) is flattened to ``{path: tensor}``;
facts are compared path by path between the candidate's call and its eager twin's."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = ["TensorFacts", "tensors_in", "facts_of", "aliases"]


@dataclasses.dataclass(frozen=True)
class TensorFacts:
    """The metadata of one tensor a caller can rely on. Strides count only along dimensions longer than one, and
    not at all in an empty tensor: elsewhere any stride addresses the same elements, and eager picks them freely."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int | None, ...]
    contiguous: bool
    device_type: str
    requires_grad: bool
    is_inference: bool
    attached_to_autograd: bool  # has a grad_fn: a caller's backward() reaches it


def facts_of(tensor: torch.Tensor) -> TensorFacts:
    empty = tensor.numel() == 0  # an empty tensor's strides address no element at all
    strides = tuple(stride if size > 1 and not empty else None for size, stride in zip(tensor.shape, tensor.stride()))
    return TensorFacts(dtype=tensor.dtype, shape=tuple(tensor.shape), strides=strides,
                       contiguous=tensor.is_contiguous(), device_type=tensor.device.type,
                       requires_grad=tensor.requires_grad, is_inference=tensor.is_inference(),
                       attached_to_autograd=tensor.grad_fn is not None)


def tensors_in(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``value`` with its path (``[0]``, ``['logits']``, ``.hidden``), in a stable order."""
    if isinstance(value, torch.Tensor):
        yield path or "result", value
    elif isinstance(value, Mapping):
        for key in value:
            yield from tensors_in(value[key], f"{path}[{key!r}]")
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from tensors_in(item, f"{path}[{index}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from tensors_in(getattr(value, field.name), f"{path}.{field.name}")


def _storage(tensor: torch.Tensor) -> tuple[str, int] | None:
    if tensor.numel() == 0 or tensor.is_meta:
        return None  # an empty tensor shows a caller no memory, shared or not
    return tensor.device.type, tensor.untyped_storage().data_ptr()


def aliases(outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> dict[str, frozenset[str]]:
    """For each output path, the input paths (``input...``) and other output paths it shares memory with."""
    owners: dict[tuple[str, int], set[str]] = {}
    for path, tensor in [*(("input" + p, t) for p, t in inputs.items()), *outputs.items()]:
        key = _storage(tensor)
        if key is not None:
            owners.setdefault(key, set()).add(path)
    shared: dict[str, frozenset[str]] = {}
    for path, tensor in outputs.items():
        key = _storage(tensor)
        shared[path] = frozenset(owners.get(key, set()) - {path}) if key is not None else frozenset()
    return shared
