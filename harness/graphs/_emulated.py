"""The emulated graph backend: CUDA-graph semantics without a GPU (record ATen ops, replay them).

What it reproduces of CUDA graphs, and where it knowingly differs, is in ``docs/graphs.md`` (Graph
backends); :attr:`EmulatedBackend.warm_up_difference` says why the warm-up tests skip here."""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import dataclasses
import itertools
import weakref
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


# The capture (one ``capture_context``, all its segments) a recording belongs to: a pool hands a capture
# the blocks that earlier captures no longer hold, never its own (re-carving inside one capture is not modelled).
_CAPTURE_EPOCH: contextvars.ContextVar[int | None] = contextvars.ContextVar("emulated_capture_epoch", default=None)
_EPOCHS = itertools.count(1)


def _view_over(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    """A new tensor over ``storage`` with ``like``'s dtype and geometry (made outside any dispatch mode)."""
    with _disable_current_modes(), torch.no_grad():
        return torch.empty((0,), dtype=like.dtype, device=like.device).set_(
            storage, like.storage_offset(), like.shape, like.stride())


def _as_bytes(storage: torch.UntypedStorage, nbytes: int) -> torch.Tensor:
    """The first ``nbytes`` of ``storage`` as a uint8 tensor (call outside any dispatch mode, without grad)."""
    return torch.empty((0,), dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,), (1,))


def _copy_bytes(destination: torch.UntypedStorage, source: torch.UntypedStorage) -> None:
    nbytes = source.nbytes()
    with _disable_current_modes(), torch.no_grad():
        _as_bytes(destination, nbytes).copy_(_as_bytes(source, nbytes))


class _Block:
    """Memory a capture allocated in a pool, as a CUDA graph pool's block.

    The pool keeps the memory (``storage``, its one reference) as long as the pool lives, and the graphs
    recorded over it read and write it through tensors of their own (``aliases``). Neither is an owner:
    the block is *free* when nothing else (the program, the capturer, autograd) holds a tensor over it,
    and a later capture into the pool may then re-carve it, as CUDA's caching allocator does. The graphs
    recorded over it keep writing it at replay, whoever uses it now."""

    def __init__(self, storage: torch.UntypedStorage, epoch: int | None, sequence: int) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.epoch = epoch
        self.sequence = sequence
        self.aliases: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()

    def alias(self, like: torch.Tensor) -> torch.Tensor:
        """A tensor of the emulation's own over this block, with ``like``'s geometry; it owns nothing."""
        tensor = _view_over(self.storage, like)
        self.aliases.add(tensor)
        return tensor

    def is_free(self) -> bool:
        # The storage's references: the pool's storage object (one), the aliases, and every other holder.
        return torch._C._storage_Use_Count(self.storage._cdata) == 1 + len(self.aliases)


# Every pool alive, for poison_free_blocks (harness.hazards fills memory nobody owns on every backend).
_LIVE_POOLS: weakref.WeakSet[_EmulatedPool] = weakref.WeakSet()


class _EmulatedPool:
    """Stands for a CUDA graph pool: remembers which storages captures in it allocated (``owned_storages``),
    and keeps the memory of those it can hand out again (``blocks``, see :class:`_Block`)."""

    def __init__(self) -> None:
        self.owned_storages: set[int] = set()
        self.blocks: dict[int, _Block] = {}
        self._by_size: list[_Block] = []  # smallest first, then oldest: the order carve() tries them in
        self._sequence = itertools.count()
        _LIVE_POOLS.add(self)

    def add(self, storage: torch.UntypedStorage, epoch: int | None) -> _Block:
        block = _Block(storage, epoch, next(self._sequence))
        self.blocks[storage._cdata] = block
        self.owned_storages.add(storage._cdata)
        bisect.insort(self._by_size, block, key=lambda block: (block.nbytes, block.sequence))
        return block

    def carve(self, nbytes: int, epoch: int | None) -> _Block | None:
        """A free block an earlier capture allocated, of at least ``nbytes``: the smallest, then the oldest
        (CUDA's caching allocator takes the best fit, then the lowest address; it also splits and merges
        blocks, which this does not)."""
        if epoch is None:
            return None
        start = bisect.bisect_left(self._by_size, nbytes, key=lambda block: block.nbytes)
        for block in itertools.islice(self._by_size, start, None):
            if block.epoch is not None and block.epoch < epoch and block.is_free():
                return block
        return None


def poison_free_blocks(byte: int) -> tuple[int, int]:
    """Fill every free block of every live emulated pool with ``byte`` and return (blocks, bytes) filled; none while a
    capture is being recorded in this context. A correct graph writes such a block before it reads it at replay, as
    on CUDA; a graph, break or caller that reads one it does not own reads the poison."""
    if _CAPTURE_EPOCH.get() is not None:
        return 0, 0
    blocks = [block for pool in list(_LIVE_POOLS) for block in pool.blocks.values() if block.is_free()]
    with _disable_current_modes(), torch.no_grad():
        for block in blocks:
            _as_bytes(block.storage, block.nbytes).fill_(byte)
    return len(blocks), sum(block.nbytes for block in blocks)


@dataclasses.dataclass
class _ExternalTensor:
    """A tensor the capture did not allocate, held weakly as CUDA holds only its address."""

    storage: StorageWeakRef
    address: int  # where the storage's memory was at capture, and how long: a graph holds those, not the storage
    nbytes: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int | torch.SymInt
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _ExternalTensor:
        storage = tensor.untyped_storage()
        return cls(
            StorageWeakRef(storage), storage.data_ptr(), storage.nbytes(), tuple(tensor.shape), tuple(tensor.stride()),
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
        if (storage.data_ptr(), storage.nbytes()) != (self.address, self.nbytes):
            raise GraphHazardError(
                f"replay reads a tensor of shape {self.size} and dtype {self.dtype} (input of {op_name}) whose memory "
                f"was resized or moved since the capture ({self.nbytes} bytes then, {storage.nbytes()} now: "
                "resize_, set_ on its storage); on CUDA the graph still reads the old address, which the allocator "
                "may have handed to other data. Keep a captured tensor's storage as it was, or capture again."
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
    """The innermost frame outside torch, the harness's graph layer and a mutation tool's dispatcher (mutmut's
    trampoline, in front of every mutated function): the line that made the op."""
    import traceback

    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or "/harness/graphs/" in path or "/mutmut/" in path or path.startswith("<"):
            continue
        path = path.split("site-packages/")[-1]  # transformers/models/...: the same on every machine
        return f"{path}:{frame.lineno} ({frame.name}: {(frame.line or '').strip()[:80]})"
    return "an unknown call site"


class _Recorder(TorchDispatchMode):
    def __init__(self, pool: _EmulatedPool, device_type: str, epoch: int | None = None) -> None:
        super().__init__()
        self.pool = pool
        self.device_type = device_type  # the device the graph stands for
        self.epoch = epoch  # the capture this recording belongs to (None: outside any capture_context)
        self.ops: list[_RecordedOp] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        check_capturable(func, args, kwargs)
        result = func(*args, **kwargs)
        flat_result, result_spec = tree_flatten(result)
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
        recorded_leaves = [self._record_leaf(leaf) for leaf in leaves]
        # Views and in-place results share an input's storage: replaying the op updates them already.
        fresh: dict[int | None, list[tuple[int, torch.Tensor]]] = {}
        for position, out in enumerate(flat_result):
            if isinstance(out, torch.Tensor) and _storage_key(out) not in input_storages:
                fresh.setdefault(_storage_key(out), []).append((position, out))
        refresh: list[tuple[int, torch.Tensor]] = []
        relocated = False
        inputs = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        for key, outs in fresh.items():
            block = self.pool.blocks.get(key) if key is not None else None
            # An argument handed back (set_ onto another storage) stays the program's own object.
            if block is None and self._poolable(outs[0][1]) and not any(out is leaf for _, out in outs
                                                                          for leaf in inputs):
                storage = outs[0][1].untyped_storage()
                block = self.pool.carve(storage.nbytes(), self.epoch)
                if block is not None:
                    # Memory an earlier capture freed: the result is handed out there, as CUDA re-carves it.
                    _copy_bytes(block.storage, storage)
                    for position, out in outs:
                        flat_result[position] = _view_over(block.storage, out)
                    relocated = True
                else:
                    block = self.pool.add(storage, self.epoch)
            if block is None:
                self._own(out for _, out in outs)
                refresh.extend(outs)
            else:
                refresh.extend((position, block.alias(out)) for position, out in outs)
        waits = [position for position, out in enumerate(flat_result) if _is_work(out)]
        self.ops.append(_RecordedOp(func, spec, recorded_leaves, refresh, waits))
        return tree_unflatten(flat_result, result_spec) if relocated else result

    def _record_leaf(self, leaf: Any) -> Any:
        """What the recorded op keeps of one argument: a weak handle of an external tensor, a tensor of its
        own over a pool block (so that the graph owns nothing the program could release), else the leaf."""
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if self._is_external(leaf):
            return _ExternalTensor.of(leaf)
        block = self.pool.blocks.get(_storage_key(leaf))  # type: ignore[arg-type]
        return leaf if block is None else block.alias(leaf)

    def _poolable(self, tensor: torch.Tensor) -> bool:
        """A plain dense tensor on the graph's device with memory: what a pool block can stand for."""
        return (type(tensor) is torch.Tensor and tensor.layout == torch.strided and not tensor.is_quantized
                and tensor.device.type == self.device_type and tensor.device.type != "meta"
                and _storage_key(tensor) is not None and tensor.untyped_storage().nbytes() > 0)

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
        self.recorder = _Recorder(pool, device_type, _CAPTURE_EPOCH.get())
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
        token = _CAPTURE_EPOCH.set(next(_EPOCHS))
        try:
            with torch.compiler.set_stance("force_eager"), _refuse_tolist():
                yield
        finally:
            _CAPTURE_EPOCH.reset(token)

    def begin_segment(self, pool: _EmulatedPool) -> _EmulatedRecording:
        return _EmulatedRecording(pool, self.device_type)
