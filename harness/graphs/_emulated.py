"""The emulated graph backend: CUDA-graph semantics without a GPU (record ATen ops, replay them).

What it reproduces of CUDA graphs, and where it knowingly differs, is in ``docs/graphs.md`` (Graph
backends); :attr:`EmulatedBackend.warm_up_difference` says why the warm-up tests skip here."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from harness.errors import CaptureError, GraphHazardError
from harness.graphs._backend import GraphBackend
from harness.graphs._capture_rules import check_capturable

__all__ = ["EmulatedBackend"]


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, nested, meta without storage
        return None


class _EmulatedPool:
    """Stands for a CUDA graph pool: remembers which storages captures in it allocated."""

    def __init__(self) -> None:
        self.owned_storages: set[int] = set()


@dataclasses.dataclass
class _ExternalTensor:
    """A tensor the capture did not allocate, held weakly as CUDA holds only its address."""

    storage: StorageWeakRef
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int | torch.SymInt
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _ExternalTensor:
        return cls(
            StorageWeakRef(tensor.untyped_storage()), tuple(tensor.shape), tuple(tensor.stride()),
            tensor.storage_offset(), tensor.dtype, tensor.device,
        )

    def materialize(self, op_name: str) -> torch.Tensor:
        storage = None if self.storage.expired() else torch.UntypedStorage._new_with_weak_ptr(self.storage.cdata)
        if storage is None:
            raise GraphHazardError(
                f"replay reads a tensor of shape {self.size} and dtype {self.dtype} (input of {op_name}) that was "
                "passed into the capture and has since been released by its owner; on CUDA that memory may "
                "already hold other data. Keep static inputs alive as long as the graph."
            )
        with torch.no_grad():
            return torch.empty((0,), dtype=self.dtype, device=self.device).set_(storage, self.offset, self.size,
                                                                                 self.stride)


@dataclasses.dataclass
class _RecordedOp:
    func: Any
    spec: Any
    leaves: list[Any]  # flattened (args, kwargs); external tensors as _ExternalTensor
    refresh: list[tuple[int, torch.Tensor]]  # (position in the flat result, captured tensor to refresh)
    waits: list[int] = dataclasses.field(default_factory=list)  # positions of collectives' work handles

    def replay(self) -> None:
        name = str(self.func)
        leaves = [leaf.materialize(name) if isinstance(leaf, _ExternalTensor) else leaf for leaf in self.leaves]
        args, kwargs = tree_unflatten(leaves, self.spec)
        result = self.func(*args, **kwargs)
        if self.refresh or self.waits:
            flat, _ = tree_flatten(result)
            for position in self.waits:
                flat[position].wait()  # torch.distributed waited outside dispatch at capture; here it is ours
            for position, captured in self.refresh:
                captured.copy_(flat[position])


def _is_work(value: Any) -> bool:
    """A collective's work handle (c10d ops return one beside their tensors)."""
    return isinstance(value, torch.ScriptObject) and hasattr(value, "wait")


class _EmulatedSegment:
    def __init__(self, ops: list[_RecordedOp]) -> None:
        self.ops = ops

    def replay(self) -> None:
        with torch.no_grad():
            for op in self.ops:
                op.replay()

    def __repr__(self) -> str:
        return f"<emulated segment of {len(self.ops)} ops>"


def _call_site() -> str:
    """The innermost frame outside torch and the harness's graph layer: the line that made the op."""
    import traceback

    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or "/harness/graphs/" in path or path.startswith("<"):
            continue
        path = path.split("site-packages/")[-1]  # transformers/models/...: the same on every machine
        return f"{path}:{frame.lineno} ({frame.name}: {(frame.line or '').strip()[:80]})"
    return "an unknown call site"


class _Recorder(TorchDispatchMode):
    def __init__(self, pool: _EmulatedPool, device_type: str) -> None:
        super().__init__()
        self.pool = pool
        self.device_type = device_type  # the device the graph stands for
        self.ops: list[_RecordedOp] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        check_capturable(func, args, kwargs)
        result = func(*args, **kwargs)
        flat_result, _ = tree_flatten(result)
        if func.overloadpacket.__name__ == "lift_fresh":
            # torch.tensor(...) data is copied from Python outside dispatch and only lifted here. On the
            # graph's device that is a host-to-device copy of pageable memory, which CUDA refuses; a
            # host-side tensor (another device) is CPU work, outside any graph, and stays a constant.
            if any(isinstance(out, torch.Tensor) and out.device.type == self.device_type for out in flat_result):
                raise CaptureError(
                    "aten.lift_fresh (a tensor made from Python data, torch.tensor/as_tensor) cannot be captured "
                    f"in a graph: on a GPU it is a copy from pageable host memory, which capture refuses. Made at "
                    f"{_call_site()}. Build it before the capture (a static tensor), or with torch.full/"
                    "torch.zeros on the device, which launch a fill kernel instead of a copy."
                )
            self._own(flat_result)
            return result
        leaves, spec = tree_flatten((args, kwargs))
        input_storages = {_storage_key(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor)}
        recorded_leaves = [
            _ExternalTensor.of(leaf) if isinstance(leaf, torch.Tensor) and self._is_external(leaf) else leaf
            for leaf in leaves
        ]
        # Views and in-place results share an input's storage: replaying the op updates them already.
        fresh = [(position, out) for position, out in enumerate(flat_result)
                 if isinstance(out, torch.Tensor) and _storage_key(out) not in input_storages]
        self._own(out for _, out in fresh)
        waits = [position for position, out in enumerate(flat_result) if _is_work(out)]
        self.ops.append(_RecordedOp(func, spec, recorded_leaves, fresh, waits))
        return result

    def _own(self, tensors: Any) -> None:
        for tensor in tensors:
            key = _storage_key(tensor) if isinstance(tensor, torch.Tensor) else None
            if key is not None:
                self.pool.owned_storages.add(key)

    def _is_external(self, tensor: torch.Tensor) -> bool:
        key = _storage_key(tensor)
        return key is not None and key not in self.pool.owned_storages


class _EmulatedRecording:
    def __init__(self, pool: _EmulatedPool, device_type: str) -> None:
        self.recorder = _Recorder(pool, device_type)
        self.recorder.__enter__()

    def end(self) -> _EmulatedSegment:
        self.recorder.__exit__(None, None, None)
        return _EmulatedSegment(self.recorder.ops)

    def abort(self) -> None:
        self.recorder.__exit__(None, None, None)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Ops run inside are not recorded (nor checked): they run once, now."""
        with _disable_current_modes():
            yield


@contextlib.contextmanager
def _refuse_tolist() -> Iterator[None]:
    """``Tensor.tolist()`` reads CPU tensors without dispatching an op, so the recorder never sees it;
    on CUDA it is a host sync (``aten._local_scalar_dense``) that capture refuses. Refuse it here too
    (transformers' JetMoE routes with ``expert_size.tolist()``: the emulation would otherwise freeze
    the capture-time split and replay wrong results silently)."""
    original = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        raise CaptureError(
            "aten._local_scalar_dense (Tensor.tolist) cannot be captured in a graph: it synchronises with the "
            "host. Move it out of the captured region (compute it before capture, or run it in an eager break)."
        )

    # A patch of a method (mypy's method-assign), typed on TensorBase in torch's stubs (hence assignment).
    torch.Tensor.tolist = tolist  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.tolist = original  # type: ignore[method-assign]


class EmulatedBackend(GraphBackend):
    """CPU (or any device) stand-in for CUDA graphs; ``docs/graphs.md`` (Graph backends) states its limits."""

    name = "emulated"
    warms_up_outside_the_graph = False
    warm_up_difference = (
        "the emulated backend does not model warm-up: its recording run stands in for it, so state created "
        "lazily on the first call is created inside the graph (see docs/graphs.md, Graph backends)"
    )

    def __init__(self, device: torch.device | str | None = None) -> None:
        #: The device the emulated graph stands for: tensors made from Python data on it are refused.
        self.device_type = torch.device(device if device is not None else "cpu").type

    def new_pool(self) -> _EmulatedPool:
        return _EmulatedPool()

    def warm_up(self, fn: Callable[[], Any]) -> None:
        # The recording run executes ``fn`` for real and is the warm-up: running it once more would
        # apply in-place updates one time more than CUDA, where the capture itself executes nothing.
        return None

    @contextlib.contextmanager
    def capture_context(self) -> Iterator[None]:
        # Dynamo skips a frame that runs under a dispatch mode and remembers the skip, so without
        # this a compiled function captured here would run eagerly for the rest of the process.
        with torch.compiler.set_stance("force_eager"), _refuse_tolist():
            yield

    def begin_segment(self, pool: _EmulatedPool) -> _EmulatedRecording:
        return _EmulatedRecording(pool, self.device_type)
