"""The reference layer-stack breakable-graph runner (:class:`LayerStackRunner`).

How it captures and replays is in ``docs/runner.md``; the methods a subclass may override, one behaviour
each, are listed there (The reference runner's seams) and in each method's docstring."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from harness import distributed, observations
from harness.batch import ForwardBatch, HiddenMode, forward_context, select_bucket, validate_buckets
from harness.errors import BucketError, CaptureError, ReplayError
from harness.graphs import BreakableGraph
from harness.runner.discovery import (
    DEFAULT_RULES,
    DiscoveryResult,
    DiscoveryRule,
    discover_layer_model,
    layer_list,
)

__all__ = ["RunnerStats", "StaticInputs", "LayerStackRunner", "map_tensors"]

_ABSENT = object()


@dataclasses.dataclass
class RunnerStats:
    """Counters: graphs captured, batches replayed (in total and per bucket), batches run eagerly."""

    captures: int = 0
    replays: int = 0
    eager_fallbacks: int = 0
    replays_by_bucket: dict[int, int] = dataclasses.field(default_factory=dict)


class _ProbeDone(Exception):
    """Stops the probe forward once the layer stack has been called."""


@dataclasses.dataclass
class StaticInputs:
    """One bucket's captured graph and the static arguments it reads."""

    bucket: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batch: ForwardBatch | None
    graph: BreakableGraph | None = None
    # Each decoder layer's output as the graph computed it (tensors the graph owns, so every replay
    # refreshes them): what divergence localisation compares with eager, layer by layer.
    layer_outputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    # The arguments the layer stack writes in place (as ``load`` names them): a replay writes the static copies,
    # which ``store`` hands back to the live arguments, as an eager forward would have written them.
    written: frozenset[str] = frozenset()

    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        """Copy the live arguments of a layer-stack call into the static ones.

        Tensors are copied in place (the graph reads only the captured tensors); a batch's device
        metadata is copied only when ``copy_batch`` (a fallback capture reads it inside the graph).
        """
        if len(args) != len(self.args) or set(kwargs) != set(self.kwargs):
            raise ReplayError(
                f"the layer stack was called with {len(args)} positional arguments and keywords {sorted(kwargs)} "
                f"at replay but with {len(self.args)} and {sorted(self.kwargs)} at capture"
            )
        pairs = [(f"argument {i}", s, a) for i, (s, a) in enumerate(zip(self.args, args))]
        pairs += [(f"keyword {k!r}", self.kwargs[k], v) for k, v in kwargs.items()]
        for name, static, live in pairs:
            _copy_into(name, static, live, copy_batch=copy_batch)

    def store(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """After a replay: copy each static argument the stack writes in place (:attr:`written`) into the live
        argument it stood for, and return those live tensors."""
        stored: list[torch.Tensor] = []
        if not self.written:  # most stacks: nothing to walk at every replay
            return stored
        for name, static, live in _argument_tensors(self.args, self.kwargs, args, kwargs):
            if name in self.written:
                live.copy_(static)
                stored.append(live)
        return stored


def _argument_tensors(args: tuple[Any, ...], kwargs: dict[str, Any], other_args: tuple[Any, ...],
                      other_kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor, Any]]:
    """``(name, tensor, counterpart)`` for every tensor of a layer-stack call's arguments (inside lists, tuples and
    dicts too), named as :meth:`StaticInputs.load` names them, beside what stands at the same place in the other
    call's arguments."""

    def walk(name: str, value: Any, other: Any) -> Iterator[tuple[str, torch.Tensor, Any]]:
        if isinstance(value, torch.Tensor):
            yield name, value, other
        elif isinstance(value, dict) and isinstance(other, dict):
            for key in value.keys() & other.keys():
                yield from walk(f"{name}[{key!r}]", value[key], other[key])
        elif isinstance(value, (tuple, list)) and isinstance(other, (tuple, list)):
            for index, (item, counterpart) in enumerate(zip(value, other)):
                yield from walk(f"{name}[{index}]", item, counterpart)

    for index, (value, other) in enumerate(zip(args, other_args)):
        yield from walk(f"argument {index}", value, other)
    for key in kwargs.keys() & other_kwargs.keys():
        yield from walk(f"keyword {key!r}", kwargs[key], other_kwargs[key])


class _WriteRecorder(TorchDispatchMode):
    """Records the storages that ops write in place (their schema marks the argument written: ``add_``,
    ``copy_``, ``out=``)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
                    self.storages.add(tensor.untyped_storage().data_ptr())
        return func(*args, **kwargs)


def _own_copy(values: Any, batch: Any) -> Any:
    """A layer-stack call's positional (a tuple) or keyword (a dict) arguments with their tensors copied, inside
    lists, tuples, dicts and dataclasses too; ``batch`` itself kept."""

    def own(value: Any) -> Any:
        if value is batch:
            return batch
        return map_tensors(value, torch.Tensor.clone) if isinstance(value, (torch.Tensor, dict, list, tuple)) \
            else value

    if isinstance(values, dict):
        return {key: own(value) for key, value in values.items()}
    return tuple(own(value) for value in values)


# What a captured graph read a parameter or buffer at: its memory and geometry. Read by C-level maps over all the
# model's tensors before every replay (a Python loop over them showed in the H200 benchmark's host time of the large
# models). No device: under CUDA's unified virtual addressing no two devices' allocations share an address.
_WHERE: tuple[Callable[[Any], Any], ...] = (torch.Tensor.data_ptr, torch.Tensor.size, torch.Tensor.stride,
                                            operator.attrgetter("dtype"))


def _copy_into(name: str, static: Any, live: Any, *, copy_batch: bool) -> None:
    # Containers are walked: transformers VLMs hand their stack a dict of masks (one per attention type).
    if isinstance(static, dict) and isinstance(live, dict) and set(static) == set(live):
        for key in static:
            _copy_into(f"{name}[{key!r}]", static[key], live[key], copy_batch=copy_batch)
        return
    if isinstance(static, (tuple, list)) and isinstance(live, (tuple, list)) and len(static) == len(live):
        for index, (s, v) in enumerate(zip(static, live)):
            _copy_into(f"{name}[{index}]", s, v, copy_batch=copy_batch)
        return
    if isinstance(static, torch.Tensor):
        if not isinstance(live, torch.Tensor) or live.shape != static.shape:
            shape = tuple(live.shape) if isinstance(live, torch.Tensor) else type(live).__name__
            raise ReplayError(f"layer-stack {name} is {shape} at replay but {tuple(static.shape)} at capture")
        static.copy_(live)
    elif isinstance(static, ForwardBatch):
        if copy_batch:
            if live.num_requests != static.num_requests:
                raise ReplayError(
                    f"the captured region reads a batch of {static.num_requests} request(s); cannot replay "
                    f"{live.num_requests}"
                )
            static.last_indices.copy_(live.last_indices)
    elif (static is None) != (live is None):
        raise ReplayError(f"layer-stack {name} was {static!r} at capture but is {type(live).__name__} at replay")
    elif isinstance(static, _SCALARS) and not _same_scalar(static, live):
        # The graph froze the capture's value (Python control flow and arithmetic on it); replaying with
        # another value would silently compute with the old one.
        raise ReplayError(f"layer-stack {name} was {static!r} at capture but is {live!r} at replay: the graph froze "
                          "the capture's value; pass it as a tensor, or capture per value")


# Python values a graph freezes and that compare by value (other objects compare by identity, and a
# fresh one at every call says nothing about what the graph froze).
_SCALARS = (bool, int, float, complex, str, bytes, enum.Enum)


def _same_scalar(static: Any, live: Any) -> bool:
    if type(static) is not type(live):
        return False
    if isinstance(static, (float, complex)):
        # By the value's text, which round-trips a float exactly: NaN is the same NaN, and -0.0 is not 0.0 (equal by
        # ==, yet 1 / -0.0 is -inf where the graph froze +inf).
        return repr(static) == repr(live)
    return static == live


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it: in dataclasses (their init fields), tuples, lists
    and dicts, at any depth; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: map_tensors(getattr(value, f.name), fn)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(item, fn) for item in value)
    if isinstance(value, dict):
        return {key: map_tensors(item, fn) for key, item in value.items()}
    return value


class LayerStackRunner:
    """Reference implementation of the ``runner`` component.

    ``LayerStackRunner(model, buckets=(4, 8, 16), graphs=GraphCapturer(backend))`` discovers the
    layer stack and captures every bucket. ``run(batch)`` replays when :meth:`can_run` and runs
    eagerly otherwise; ``replay(batch)`` replays or raises. Outputs are fresh tensors.
    ``static_inputs_class`` is the seam for how live arguments reach the static buffers.
    """

    static_inputs_class = StaticInputs

    def __init__(self, model: nn.Module, *, buckets: Iterable[int], graphs: Any,
                 strict_discovery: bool = False, rules: Sequence[DiscoveryRule] = DEFAULT_RULES,
                 warmup_runs: int = 1) -> None:
        self.model = model
        self.buckets = validate_buckets(buckets)
        self.graphs = graphs
        self.strict_discovery = strict_discovery
        self.rules = tuple(rules)
        self.warmup_runs = warmup_runs
        self.stats = RunnerStats()
        # The tensor-parallel group the ranks agree over (None: one rank, no agreement needed).
        self.process_group = getattr(model, "process_group", None)
        # Built under torch.inference_mode(): the static buffers are inference tensors (see autograd_off).
        self.built_in_inference_mode = torch.is_inference_mode_enabled()
        self.discovery = self.discover(model)
        self.layer_model = self.discovery.module
        self._captured: dict[int, StaticInputs] = {}
        self._in_replay = False
        self._state_at_capture: list[list[Any]] | None = []
        # The model's parameter and buffer tables and each tensor's key in them, listed at capture.
        self._state_tables: list[dict[str, Any]] = []
        self._state_keys: list[str] = []
        self.capture()

    # -- seams -------------------------------------------------------------------------------

    def discover(self, model: nn.Module) -> DiscoveryResult:
        return discover_layer_model(model, rules=self.rules, strict=self.strict_discovery)

    def bucket_for(self, num_tokens: int) -> int:
        """The smallest bucket holding ``num_tokens``; :class:`BucketError` when none does."""
        return select_bucket(num_tokens, self.buckets)

    def publish(self, batch: ForwardBatch) -> contextlib.AbstractContextManager:
        """Publish ``batch`` as the forward context for the block (what attention reads); the previous
        context, usually none, comes back when the block ends."""
        return forward_context(batch)

    def autograd_off(self) -> contextlib.AbstractContextManager:
        # Calling layer_model.forward directly skips the outer model's own no_grad, and compiled
        # MoE kernels with out= reductions refuse to run under autograd. A runner built under
        # inference mode keeps to it: its static buffers are inference tensors, which only inference
        # mode may update in place ("Inplace update to inference tensor outside InferenceMode").
        return torch.inference_mode() if self.built_in_inference_mode else torch.no_grad()

    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        """Replace ``layer_model.forward`` for the block; the original comes back whatever happens."""
        layer = self.layer_model
        original = layer.__dict__.get("forward", _ABSENT)
        layer.forward = replacement
        try:
            yield
        finally:  # also on BaseException: a KeyboardInterrupt must not leave the model patched
            if original is _ABSENT:
                del layer.forward
            else:
                layer.forward = original

    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        return batch.padded_to(bucket)

    def group_rows(self, batch: ForwardBatch) -> int:
        """The rows every rank of the process group runs ``batch`` at: the largest of the ranks'
        :meth:`rows` (one all-reduce, made by every rank); this rank's rows without a group."""
        return self._group_max([self.rows(batch)])[0]

    def all_ranks_agree(self, verdict: bool) -> bool:
        """Whether ``verdict`` holds on every rank of the process group (one all-reduce)."""
        return self._group_max([int(not verdict)])[0] == 0

    def _group_max(self, values: list[int]) -> list[int]:
        # The model's device (a parameters() walk) is looked up only where there is a group to all-reduce on:
        # both callers run on every replayed batch.
        if self.process_group is None:
            return values
        return distributed.agree(values, self.process_group, device=self._device())

    def collectives(self) -> contextlib.AbstractContextManager:
        """Held around every capture and replay: the communicator the model's collectives use
        (:func:`harness.distributed.use_communicator`). Engines switch to a graph-capturable
        all-reduce here; the reference keeps torch.distributed's, which the backends capture as is."""
        return contextlib.nullcontext()

    def slice_output(self, output: Any, *, bucket: int, num_tokens: int) -> Any:
        """Cut per-token outputs (leading dimension ``bucket``) back to the real ``num_tokens``."""
        if num_tokens == bucket:
            return output
        return map_tensors(output, lambda t: t[:num_tokens] if t.dim() and t.shape[0] == bucket else t)

    def return_writes(self, batch: ForwardBatch, padded: ForwardBatch, written: Sequence[torch.Tensor]) -> None:
        """After a replay: where the layer stack wrote the padded batch's own copy of one of ``batch``'s tensors
        (``written``: the live arguments :meth:`StaticInputs.store` wrote), copy its rows into ``batch``'s tensor,
        which an eager forward would have written."""
        if not written:  # most stacks write no argument: nothing to look up at every replay
            return
        storages = {tensor.untyped_storage().data_ptr() for tensor in written}
        pairs = [(batch.input_ids, padded.input_ids), (batch.positions, padded.positions),
                 *((batch.side_inputs[name], padded.side_inputs[name]) for name in batch.side_inputs)]
        for own, copy in pairs:
            if copy is not own and copy.untyped_storage().data_ptr() in storages:
                own.copy_(copy[:own.shape[0]])

    def state_moved(self) -> bool:
        """Whether a parameter or buffer of the model now lives in other memory (or has another geometry) than
        when the graphs were captured: re-allocated, as an engine's memory release and resume may do. A graph
        reads and writes the memory it was captured on."""
        return self._state_addresses() != self._state_at_capture

    def _state_addresses(self) -> list[list[Any]] | None:
        # Read through the modules' own tables, listed once per capture: walking named_parameters() on every
        # replay would cost the host path a recursive generator per call.
        tensors = list(map(dict.get, self._state_tables, self._state_keys))
        try:
            return [list(map(read, tensors)) for read in _WHERE]
        except (TypeError, AttributeError):  # a slot emptied or holding something else since capture: moved
            return None

    def _state_slots(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every parameter and buffer of the model as its module's table and its key there, two parallel lists."""
        slots = [(table, key) for module in self.model.modules() for table in (module._parameters, module._buffers)
                 for key in table if table[key] is not None]
        return [table for table, _ in slots], [key for _, key in slots]

    def hand_out(self, output: Any) -> Any:
        # Copies: outputs may alias the graph's static buffers, which the next replay overwrites.
        return map_tensors(output, lambda t: t.detach().clone())

    @contextlib.contextmanager
    def record_layers(self, static: StaticInputs) -> Iterator[None]:
        """While capturing: keep each decoder layer's output (its first tensor) in ``static.layer_outputs``
        as an in-graph clone, so replays carry per-layer results too. No-op without a layer list."""
        found = layer_list(self.layer_model)
        if found is None:
            yield
            return

        def hook_for(index: int) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any, output: Any) -> None:
                first = output if isinstance(output, torch.Tensor) else next(
                    (item for item in (output if isinstance(output, (tuple, list)) else ())
                     if isinstance(item, torch.Tensor)),
                    None)
                if first is not None:
                    # The last call wins: on CUDA the warm-up runs first, the capture last.
                    static.layer_outputs[index:index + 1] = [first.detach().clone()]
            return hook

        static.layer_outputs = [torch.empty(0)] * len(found[1])
        handles = [layer.register_forward_hook(hook_for(index)) for index, layer in enumerate(found[1])]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def layer_outputs(self, batch: ForwardBatch) -> list[torch.Tensor]:
        """Copies of each decoder layer's output from the latest replay of ``batch``'s bucket
        (padded shapes); empty when the stack has no layer list."""
        static = self._captured.get(self.bucket_for(batch.num_tokens))
        if static is None:
            raise BucketError(f"no captured bucket holds {batch.num_tokens} tokens")
        return [tensor.clone() for tensor in static.layer_outputs]

    # -- capture -----------------------------------------------------------------------------

    def capture(self) -> None:
        """Capture every bucket, largest first, into one pool."""
        pool = self.graphs.new_pool()
        for bucket in sorted(self.buckets, reverse=True):
            static = self._probe(bucket)
            forward = self.layer_model.forward

            def step(static: StaticInputs = static, forward: Callable[..., Any] = forward) -> Any:
                return forward(*static.args, **static.kwargs)

            batch = cast(ForwardBatch, static.batch)  # _probe's dummy batch
            with self.autograd_off(), self.publish(batch), self.collectives():
                static.written = self._arguments_written(forward, static)
            with self.autograd_off(), self.publish(batch), self.collectives(), self.record_layers(static):
                static.graph = self.graphs.capture(step, pool=pool, warmup_runs=self.warmup_runs)
            self._captured[bucket] = static
            self.stats.captures += 1
        self._state_tables, self._state_keys = self._state_slots()
        self._state_at_capture = self._state_addresses()

    def _arguments_written(self, forward: Callable[..., Any], static: StaticInputs) -> frozenset[str]:
        """The arguments of ``static`` that ``forward`` writes in place: it runs once, eagerly, on copies of them."""
        args, kwargs = _own_copy(static.args, static.batch), _own_copy(static.kwargs, static.batch)
        recorder = _WriteRecorder()
        # Dynamo skips, for the rest of the process, a compiled frame first run under a dispatch mode.
        with torch.compiler.set_stance("force_eager"), recorder:
            forward(*args, **kwargs)
        return frozenset(name for name, tensor, _ in _argument_tensors(args, kwargs, args, kwargs)
                         if tensor.untyped_storage().nbytes()
                         and tensor.untyped_storage().data_ptr() in recorder.storages)

    def _probe(self, bucket: int) -> StaticInputs:
        """Run the model on a dummy batch until it calls the layer stack; keep those arguments."""
        dummy = ForwardBatch.dummy(bucket, device=self._device())
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

        def record(*args: Any, **kwargs: Any) -> Any:
            calls.append((args, kwargs))
            raise _ProbeDone

        with self.autograd_off(), self.patched_forward(record), contextlib.suppress(_ProbeDone):
            self.model(dummy.input_ids, dummy.positions, dummy)
        if not calls:
            raise CaptureError(
                f"{type(self.model).__name__}.forward never called the discovered layer stack "
                f"({self.discovery.path or '<root>'}, {type(self.layer_model).__name__})"
            )
        args, kwargs = calls[0]
        return self.static_inputs_class(bucket, _own_copy(args, dummy), _own_copy(kwargs, dummy), dummy)

    def _device(self) -> torch.device:
        for tensor in self.model.parameters():
            return tensor.device
        return torch.device("cpu")

    # -- running -----------------------------------------------------------------------------

    def captured_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._captured))

    @property
    def in_replay(self) -> bool:
        """Whether a replay is under way (its forward is patched and its static buffers are in use)."""
        return self._in_replay

    @staticmethod
    def rows(batch: ForwardBatch) -> int:
        """The token rows ``batch`` carries: its real tokens plus any padding it arrived with."""
        return batch.num_tokens + batch.num_padding

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether :meth:`replay` can run ``batch``: a captured bucket holds its rows (padding it
        arrived with included), and, when discovery fell back (the graph then holds the batch's
        Python-level choices), the batch matches the dummy: one request, no hidden states,
        last-token logits only. Under tensor parallelism the rows are the group's and the verdict
        holds on every rank or on none."""
        return self.all_ranks_agree(self._can_run_here(batch, self.group_rows(batch)))

    def _can_run_here(self, batch: ForwardBatch, rows: int) -> bool:
        try:
            bucket = self.bucket_for(rows)
        except BucketError:
            return False
        if bucket not in self._captured:
            return False
        if self.discovery.fell_back:
            return batch.num_requests == 1 and batch.hidden_mode == HiddenMode.NONE and not batch.all_logits
        return True

    def run(self, batch: ForwardBatch) -> Any:
        """Replay when :meth:`can_run`, else run the model eagerly (counted as a fallback)."""
        self._refuse_nested()
        if self.can_run(batch):
            return self.replay(batch)
        self.stats.eager_fallbacks += 1
        observations.count("runner.eager_fallbacks")
        return self.run_eagerly(batch)

    def run_eagerly(self, batch: ForwardBatch) -> Any:
        """The eager fallback: the model's own forward without autograd, per-token outputs cut to the
        real tokens (as a replay's are). Under tensor parallelism every rank runs at the group's
        rows, so the model's collectives meet equal shapes."""
        rows = self.group_rows(batch)
        if rows != self.rows(batch):
            batch = batch.padded_to(rows)
        with self.autograd_off():
            output = self.model(batch.input_ids, batch.positions, batch)
        output = self.slice_output(output, bucket=rows, num_tokens=batch.num_tokens)
        if self.built_in_inference_mode and not torch.is_inference_mode_enabled():
            # Made in inference mode: a caller outside it could not update them in place (samplers do).
            output = self.hand_out(output)
        return output

    def replay(self, batch: ForwardBatch) -> Any:
        """Replay ``batch`` through its bucket's graph; raises rather than running eagerly. Captures every bucket
        again first when the model's parameters or buffers moved (:meth:`state_moved`, on any rank). A call into
        the runner from inside (a hook or a break, during the replay or that capture) raises :class:`ReplayError`."""
        self._refuse_nested()
        self._in_replay = True
        try:
            if not self.all_ranks_agree(not self.state_moved()):
                # In the mode the runner was built in: a caller's inference mode would make the new static buffers
                # inference tensors, which a later call outside it could not refresh.
                with torch.inference_mode(self.built_in_inference_mode):
                    self.capture()
            bucket, output = self._replay_in(batch)
        finally:
            self._in_replay = False
        self.stats.replays += 1
        observations.count("runner.replays")
        self.stats.replays_by_bucket[bucket] = self.stats.replays_by_bucket.get(bucket, 0) + 1
        return self.hand_out(self.slice_output(output, bucket=bucket, num_tokens=batch.num_tokens))

    def _replay_in(self, batch: ForwardBatch) -> tuple[int, Any]:
        """The bucket ``batch`` replays in, and the model's output of that replay (padded rows included)."""
        bucket = self.bucket_for(self.group_rows(batch))
        static = self._captured.get(bucket)
        if static is None:
            raise BucketError(f"bucket {bucket} was not captured; captured buckets: {list(self.captured_buckets())}")
        if self.discovery.fell_back and not self.can_run(batch):
            raise ReplayError(
                f"discovery fell back to {type(self.layer_model).__name__}, whose graph holds batch-size dependent "
                f"code; it replays single-request batches without hidden states only, not {batch.describe()}"
            )
        padded = self.pad(batch, bucket)
        copy_batch = self.discovery.fell_back
        written: list[torch.Tensor] = []

        def replay_layer_forward(*args: Any, **kwargs: Any) -> Any:
            static.load(args, kwargs, copy_batch=copy_batch)
            output = cast(BreakableGraph, static.graph).replay()  # captured
            written.extend(static.store(args, kwargs))
            return output

        with self.autograd_off(), self.publish(padded), self.collectives(), \
                self.patched_forward(replay_layer_forward):
            output = self.model(padded.input_ids, padded.positions, padded)
            self.return_writes(batch, padded, written)
        return bucket, output

    def _refuse_nested(self) -> None:
        if self._in_replay:
            raise ReplayError(
                "replay inside a replay: the layer stack is patched and its static buffers are in use; "
                "run the inner batch after the outer one returns"
            )

    def capture_plan(self) -> dict[str, Any]:
        """Plain data describing what was captured: discovery, buckets, and each bucket's graph
        segment and break counts (``{"graphs": {"8": {"segments": 3, "breaks": 2}, ...}}``)."""
        return {
            "discovery": self.discovery.summary(),
            "buckets": list(self.buckets),
            "graphs": {
                str(bucket): {"segments": graph.segment_count, "breaks": graph.break_count}
                for bucket, s in sorted(self._captured.items())
                for graph in [cast(BreakableGraph, s.graph)]  # captured
            },
        }

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} layer stack {self.discovery.path or '<root>'} "
                f"({type(self.layer_model).__name__}), buckets {list(self.buckets)}>")
