"""Streams as the harness's code uses them, on every device (:func:`streams_for`), and a CPU model of CUDA's.

On CUDA they are torch's streams and events. A CPU has one stream and runs each op at once, so there is nothing
to order and nothing the caching allocator could hand out early; inside :func:`emulated_streams` a model stands in
for CUDA's rules instead. Ops still run at once, but each is stamped with the stream it was issued on, and the
model keeps, per storage, the stream that allocated it, its last write and its reads since, and for each stream
how far its next op is ordered after the others' (waits on streams and events, and host syncs: a sync on a stream
orders everything issued after it behind that stream's work). Where CUDA could give wrong data the model raises
:class:`~harness.errors.StreamHazardError`, at the op that shows it: a stream touching memory another stream
writes or reads with nothing ordering the two, or a tensor released while a stream other than the one that
allocated it may still be using it, neither recorded on that stream (``record_stream``) nor waited for by the
allocating one (CUDA's caching allocator hands a freed block to the allocating stream's next tensor at once).
The model holds for one thread."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.errors import StreamHazardError
from harness.graphs._capture_rules import HOST_SYNC_OPS
from harness.graphs._emulated import _storage_key

__all__ = ["Streams", "CudaStreams", "EmulatedStreams", "streams_for", "emulated_streams"]


class Streams:
    """The streams of one device, as the harness's code orders and protects its work across them.

    This base is a device with one stream (a CPU outside :func:`emulated_streams`): every stream is that one and
    every call is a no-op, which is exact there."""

    def current(self) -> Any:
        """The stream the calling code issues its ops on."""
        return None

    def new_stream(self) -> Any:
        return None

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        """Make ``stream`` current inside the block."""
        yield

    def wait_stream(self, producer: Any) -> None:
        """The current stream's later work waits for the work issued on ``producer`` so far."""

    def record(self, *tensors: torch.Tensor | None) -> None:
        """Tell the allocator that the current stream uses ``tensors`` (``record_stream``): memory released by its
        owner is not handed out again before the current stream's work issued so far is done."""

    def mark(self) -> Any:
        """An event standing for the current stream's work issued so far (for :meth:`wait`)."""
        return None

    def wait(self, event: Any) -> None:
        """The current stream's later work waits for ``event`` (``None``: nothing to wait for)."""


class CudaStreams(Streams):
    """torch's CUDA streams and events of one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.device)

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        with torch.cuda.stream(stream):
            yield

    def wait_stream(self, producer: Any) -> None:
        self.current().wait_stream(producer)

    def record(self, *tensors: torch.Tensor | None) -> None:
        stream = self.current()
        for tensor in tensors:
            if tensor is not None:
                tensor.record_stream(stream)

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self.current())
        return event

    def wait(self, event: Any) -> None:
        if event is not None:
            self.current().wait_event(event)


Clock = dict[int, int]  # stream id -> the last op of that stream an op is ordered after


def _join(into: Clock, other: Clock) -> None:
    for stream, seen in other.items():
        if into.get(stream, 0) < seen:
            into[stream] = seen


@dataclasses.dataclass(eq=False)
class _Stream:
    id: int
    name: str
    issued: int = 0
    clock: Clock = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<emulated stream {self.name!r}>"


@dataclasses.dataclass(frozen=True)
class _Access:
    stream: _Stream
    op: int  # the stream's count of issued ops at this access
    what: str  # the op, for messages


@dataclasses.dataclass(frozen=True)
class _Event:
    clock: Clock


@dataclasses.dataclass
class _Storage:
    """What the model knows of one storage; ``ref`` tells a dead one from a new storage at the same address."""

    ref: StorageWeakRef
    described: str
    allocated_on: _Stream
    last_write: _Access | None = None
    reads: dict[int, _Access] = dataclasses.field(default_factory=dict)  # stream id -> its last read since
    recorded: set[int] = dataclasses.field(default_factory=set)  # streams record_stream named

    def accesses(self) -> list[_Access]:
        return [*([self.last_write] if self.last_write else []), *self.reads.values()]


# Ops that read their tensor arguments' metadata only (views are found by their schema): no kernel reads the memory.
_METADATA_ONLY = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
                            "randint_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
                            "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"})


def _describe(tensor: torch.Tensor) -> str:
    return f"a tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype}"


def _written_arguments(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors ``func``'s schema says it writes (in-place and ``out=`` arguments)."""
    written: list[torch.Tensor] = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written.extend(leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor))
    return written


class EmulatedStreams(Streams):
    """The CPU model of CUDA streams (see the module's docstring); made and made current by
    :func:`emulated_streams`."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self.default = self._stream("the default stream")
        self._current = self.default
        self._host: Clock = {}  # what every op issued from now on is ordered after (host syncs)
        self._storages: dict[int, _Storage] = {}
        self._mode = _Tracker(self)

    def _stream(self, name: str | None = None) -> _Stream:
        number = next(self._ids)
        return _Stream(number, name or f"side stream {number}")

    def current(self) -> _Stream:
        return self._current

    def new_stream(self) -> _Stream:
        return self._stream()

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        if not isinstance(stream, _Stream):
            raise TypeError(f"emulated streams run on their own streams (new_stream()), got {stream!r}")
        self.released()
        previous, self._current = self._current, stream
        try:
            yield
        finally:
            self.released()
            self._current = previous

    def wait_stream(self, producer: Any) -> None:
        self.released()
        _join(self._clock(self._current), self._clock(producer))

    def record(self, *tensors: torch.Tensor | None) -> None:
        self.released()
        for tensor in tensors:
            if tensor is not None:
                self._storage(tensor).recorded.add(self._current.id)

    def mark(self) -> _Event:
        self.released()
        return _Event(dict(self._clock(self._current)))

    def wait(self, event: Any) -> None:
        self.released()
        if event is not None:
            _join(self._clock(self._current), event.clock)

    # The model.

    def _clock(self, stream: _Stream) -> Clock:
        """What ``stream``'s next op is ordered after: its own ops, what it waited for, and the host's syncs."""
        _join(stream.clock, self._host)
        stream.clock[stream.id] = stream.issued
        return stream.clock

    def _ordered(self, access: _Access | None, stream: _Stream) -> bool:
        return access is None or self._clock(stream).get(access.stream.id, 0) >= access.op

    def _storage(self, tensor: torch.Tensor) -> _Storage:
        key = _storage_key(tensor)
        known = self._storages.get(key) if key is not None else None
        if known is None or known.ref.expired():
            # First seen here (made before the model, or from Python data): allocated on the current stream.
            known = _Storage(StorageWeakRef(tensor.untyped_storage()), _describe(tensor), self._current)
            if key is not None:
                self._storages[key] = known
        return known

    def released(self) -> None:
        """Forget the storages released since the last op; raise if CUDA could have handed one out too early."""
        for key, storage in list(self._storages.items()):
            if not storage.ref.expired():
                continue
            del self._storages[key]
            for access in storage.accesses():
                if (access.stream is not storage.allocated_on and access.stream.id not in storage.recorded
                        and not self._ordered(access, storage.allocated_on)):
                    raise StreamHazardError(
                        f"{storage.described}, allocated on {storage.allocated_on.name}, was released while "
                        f"{access.stream.name}'s {access.what} of it may still be pending: it was neither recorded on "
                        f"{access.stream.name} (record_stream) nor waited for by {storage.allocated_on.name}, so "
                        f"CUDA's caching allocator may hand its memory to {storage.allocated_on.name}'s next tensor "
                        "before that access runs")

    def issue(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one op on the current stream, checking it against every access it is not ordered after."""
        self.released()
        stream, what = self._current, str(func)
        written = {id(tensor) for tensor in _written_arguments(func, args, kwargs)}
        arguments = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Tensor)]
        reads_data = not func.is_view and func.overloadpacket.__name__ not in _METADATA_ONLY
        touched = arguments if reads_data or written else []
        for tensor in touched:
            storage = self._storage(tensor)
            others = storage.accesses() if id(tensor) in written else [storage.last_write]
            for access in others:
                if access is not None and access.stream is not stream and not self._ordered(access, stream):
                    verb = "writes" if id(tensor) in written else "reads"
                    theirs = "write" if access is storage.last_write else "read"
                    raise StreamHazardError(
                        f"{stream.name} {verb} {_describe(tensor)} (in {what}) that {access.stream.name}'s "
                        f"{access.what} {theirs}s with nothing ordering the two: on CUDA either may run first. The "
                        f"later stream must wait for the earlier one (wait_stream, or an event it recorded)")
        result = func(*args, **kwargs)
        stream.issued += 1
        access = _Access(stream, stream.issued, what)
        for tensor in touched:
            storage = self._storage(tensor)
            if id(tensor) in written:
                storage.last_write, storage.reads = access, {}
            else:
                storage.reads[stream.id] = access
        known = {_storage_key(tensor) for tensor in arguments}
        for out in tree_flatten(result)[0]:
            if isinstance(out, torch.Tensor) and _storage_key(out) not in known:
                self._storage(out).last_write = access  # a new tensor: allocated and written on this stream
        if func.overloadpacket.__name__ in HOST_SYNC_OPS:
            _join(self._host, self._clock(stream))  # the host waited for this stream's work so far
        return result


class _Tracker(TorchDispatchMode):
    def __init__(self, model: EmulatedStreams) -> None:
        super().__init__()
        self.model = model

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.model.issue(func, args, kwargs or {})


_ACTIVE: contextvars.ContextVar[EmulatedStreams | None] = contextvars.ContextVar("emulated_streams", default=None)


@contextlib.contextmanager
def emulated_streams() -> Iterator[EmulatedStreams]:
    """Inside, a CPU's :func:`streams_for` is a new :class:`EmulatedStreams` and every op is checked by it.

    Compiled functions run eagerly inside (Dynamo skips a frame under a dispatch mode and remembers the skip)."""
    model = EmulatedStreams()
    token = _ACTIVE.set(model)
    try:
        with torch.compiler.set_stance("force_eager"), model._mode:
            yield model
            model.released()
    finally:
        _ACTIVE.reset(token)


@functools.cache
def _cuda_streams(device: torch.device) -> CudaStreams:
    return CudaStreams(device)


_ONE_STREAM = Streams()


def streams_for(device: torch.device | str) -> Streams:
    """The streams of ``device``: CUDA's, the model inside :func:`emulated_streams`, else one stream."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_streams(torch.device("cuda", device.index if device.index is not None
                                          else torch.cuda.current_device()))
    active = _ACTIVE.get()
    return _ONE_STREAM if active is None else active
