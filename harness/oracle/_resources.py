"""What a call holds on to: the memory behind each output, the objects it keeps alive, and what a long run grows.

Each is compared with eager's (:class:`harness.oracle.Checker` applies them): an output that is a narrow view of
a larger buffer keeps the whole buffer alive; an implementation that keeps a strong reference to its inputs,
models or outputs holds them after the caller let them go; a per-call cache grows with the number of calls."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from harness.oracle import _facts

__all__ = ["storage_bytes", "survivors", "Footprint", "footprint", "growth"]


def storage_bytes(tensor: torch.Tensor) -> int:
    """The bytes of memory ``tensor`` keeps alive: its whole untyped storage, not only the elements it views."""
    if tensor.is_meta or tensor.layout != torch.strided:
        return 0
    return tensor.untyped_storage().nbytes()


def _referents(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """The objects of ``value`` a weak reference can follow: the value itself, else the tensors inside it."""
    try:
        weakref.ref(value)
    except TypeError:  # a tuple, a dict, an int: follow the tensors it holds
        yield from ((f"{name}{path}", tensor) for path, tensor in _facts.tensors_in(value, ""))
        return
    yield name, value
    if not isinstance(value, torch.Tensor):  # a dataclass of outputs: its tensors too
        yield from ((f"{name}{path}", tensor) for path, tensor in _facts.tensors_in(value, "") if path)


def survivors(session: Callable[[], Mapping[str, Any]]) -> list[str]:
    """Run ``session``, which builds what a caller holds (inputs, models, outputs, graphs), calls, and returns it as
    ``{name: object}``; drop all of it, collect, and return the names of the objects still alive."""
    held = session()
    refs = {path: weakref.ref(obj) for name, value in held.items() for path, obj in _referents(name, value)}
    del held
    gc.collect()
    return [path for path, ref in refs.items() if ref() is not None]


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What the process holds now: live tensors (gc-tracked), the bytes of their distinct storages, and the
    bytes each accelerator's allocator has handed out."""

    tensors: int
    tensor_bytes: int
    device_bytes: int

    def __sub__(self, other: Footprint) -> Footprint:
        return Footprint(self.tensors - other.tensors, self.tensor_bytes - other.tensor_bytes,
                         self.device_bytes - other.device_bytes)


def footprint() -> Footprint:
    gc.collect()
    # type(), not isinstance(): isinstance reads __class__, which some of the objects walked answer with a warning
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
    from torch._subclasses.fake_tensor import FakeTensor

    storages: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        # A compiler's fake tensor (in its caches) holds no memory, and torch warns that reading its address is
        # deprecated.
        if tensor.is_meta or tensor.layout != torch.strided or issubclass(type(tensor), FakeTensor):
            continue
        try:
            storage = tensor.untyped_storage()
            storages[(tensor.device.type, storage.data_ptr())] = storage.nbytes()
        except RuntimeError:  # a tensor subclass without a storage of its own: it holds none
            continue
    device_bytes = torch.cuda.memory_allocated() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
    return Footprint(len(tensors), sum(storages.values()), device_bytes)


def growth(call: Callable[[], Any], *, calls: int) -> Footprint:
    """What ``calls`` more calls add to the footprint after ``calls`` calls have warmed it: a steady implementation
    adds nothing that outlives a call (its results are dropped by ``call``)."""
    for _ in range(calls):
        call()
    settled = footprint()
    for _ in range(calls):
        call()
    return footprint() - settled
