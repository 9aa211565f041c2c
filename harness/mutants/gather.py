"""Mutants of the ``gather`` component: bug classes hand-written or compiled gather kernels have had.

``suites/gather`` must kill every one."""

from __future__ import annotations

import math
import threading
import weakref

import torch

from harness.gather.reference import GatherOutputs, compiled_gather, eager_gather
from harness.graphs import Streams, is_capturing, streams_for
from harness.mutants import MutantSet

__all__ = ["MUTANTS"]  # the mutants are reached through the registry, never imported by name

MUTANTS = MutantSet("gather")


def _each(indices: torch.Tensor, buffers: tuple[torch.Tensor | None, ...], take) -> GatherOutputs:
    return tuple(None if buf is None else take(indices, buf) for buf in buffers)  # type: ignore[return-value]


@MUTANTS.add("drops-hidden", bug="returns hidden_states=None even when a hidden-states buffer is given")
def drops_hidden(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf) -> GatherOutputs:
    topk_p, topk_index, bonus, _ = compiled_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, None)
    return topk_p, topk_index, bonus, None


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


@MUTANTS.add("assumes-contiguous", bug="reads raw storage with contiguous strides, ignoring the sources' layout")
def assumes_contiguous(indices, *buffers) -> GatherOutputs:
    # A kernel that takes the data pointer and computes offsets from the shape alone.
    def take(index, buf):
        raw = buf.as_strided(buf.shape, _contiguous_strides(tuple(buf.shape)), buf.storage_offset())
        return raw[index]

    return _each(indices, buffers, take)


@MUTANTS.add("no-negative-wrap", bug="negative indices are rejected instead of wrapping (index_select)")
def no_negative_wrap(indices, *buffers) -> GatherOutputs:
    # index_select looks like a drop-in for buf[indices] but rejects negative indices.
    return _each(indices, buffers, lambda index, buf: torch.index_select(buf, 0, index))


@MUTANTS.add("int32-offsets", bug="casts indices to int32, so large offsets overflow and int64 indices truncate")
def int32_offsets(indices, *buffers) -> GatherOutputs:
    # Flat element offsets computed in 32 bits: index * row_width wraps around past 2**31, and an
    # int64 index beyond 2**32 is truncated to a small, valid-looking one.
    index32 = indices.to(torch.int32)

    def take(index, buf):
        width = math.prod(buf.shape[1:])
        rows = buf.reshape(buf.shape[0], width).reshape(-1)
        offsets = index32.unsqueeze(1) * width + torch.arange(width, dtype=torch.int32, device=buf.device)
        return rows[offsets.reshape(-1).long()].reshape(index.shape[0], *buf.shape[1:])

    return _each(indices, buffers, take)


@MUTANTS.add("aliases-full-arange", bug="returns views aliasing the sources when the indices are a full arange")
def aliases_full_arange(indices, *buffers) -> GatherOutputs:
    # "Identity gather" shortcut: returns the buffers themselves (views) when every slot is read in order.
    pool = buffers[0].shape[0]
    if indices.numel() == pool and torch.equal(indices.long().cpu(), torch.arange(pool)):
        return _each(indices, buffers, lambda index, buf: buf[:])
    return compiled_gather(indices, *buffers)


@MUTANTS.add("writes-source", bug="writes the sentinel into output_tokens_buf at the gathered slots")
def writes_source(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf) -> GatherOutputs:
    # The debug-build invalidation (slot := -1) leaking into the gather itself.
    outputs = eager_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
    output_tokens_buf[indices] = -1
    return outputs


@MUTANTS.add("drops-last-odd-row", bug="loses the last row (left zero) when the index count is odd")
def drops_last_odd_row(indices, *buffers) -> GatherOutputs:
    # A kernel vectorised over pairs of rows that never handles the tail row of an odd count.
    even = indices.shape[0] - indices.shape[0] % 2

    def take(index, buf):
        out = torch.zeros((index.shape[0], *buf.shape[1:]), dtype=buf.dtype, device=buf.device)
        out[:even] = buf[index[:even]]
        return out

    return _each(indices, buffers, take)


_CACHE: dict[tuple, GatherOutputs] = {}


@MUTANTS.add("caches-by-shape", bug="reuses a cached result when only the index values change")
def caches_by_shape(indices, *buffers) -> GatherOutputs:
    # Memoised on shapes and buffer addresses, as if the indices never changed between steps.
    key = (tuple(indices.shape), indices.dtype, indices.device,
           tuple(None if b is None else (b.data_ptr(), tuple(b.shape), b.dtype) for b in buffers))
    if key not in _CACHE:
        _CACHE[key] = compiled_gather(indices, *buffers)
    return _CACHE[key]


@MUTANTS.add("upcasts-hidden", bug="returns hidden states upcast to float32")
def upcasts_hidden(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf) -> GatherOutputs:
    topk_p, topk_index, bonus, hidden = compiled_gather(
        indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
    return topk_p, topk_index, bonus, None if hidden is None else hidden.float()


@MUTANTS.add("int32-bonus-tokens", bug="returns bonus_tokens as int32")
def int32_bonus_tokens(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf) -> GatherOutputs:
    topk_p, topk_index, bonus, hidden = compiled_gather(
        indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
    return topk_p, topk_index, bonus.to(torch.int32), hidden


_OUTPUT_BUFFERS: dict[tuple, torch.Tensor] = {}


@MUTANTS.add("reuses-output-buffers", bug="writes each call's results into output buffers kept from the previous call "
             "of the same shapes: every call returns the right values, and overwrites what the previous one returned")
def reuses_output_buffers(indices, *buffers) -> GatherOutputs:
    # A preallocated-output kernel (out=), its outputs cached per shape to spare the allocator.
    def take(position: int, buf: torch.Tensor | None) -> torch.Tensor | None:
        if buf is None:
            return None
        gathered = buf[indices]
        key = (position, tuple(gathered.shape), gathered.dtype, gathered.device)
        out = _OUTPUT_BUFFERS.get(key)
        if out is None:
            out = _OUTPUT_BUFFERS[key] = torch.empty_like(gathered)
        return out.copy_(gathered)

    return tuple(take(position, buf) for position, buf in enumerate(buffers))  # type: ignore[return-value]


_STAGING: dict[tuple, torch.Tensor] = {}


def _through_workspace(staging_of: dict[tuple, torch.Tensor], indices, buffers) -> GatherOutputs:
    """Gather each buffer into the workspace ``staging_of`` keeps for its position, dtype, row shape and device,
    allocated anew when it holds fewer rows than the call, and hand out copies of it."""
    # A kernel that writes into a persistent workspace (one fixed address, as CUDA graphs like), grown on demand
    # and copied out so that every call's results are fresh: the workspace itself outlives the call.
    def take(position: int, buf: torch.Tensor | None) -> torch.Tensor | None:
        if buf is None:
            return None
        gathered = buf[indices]
        key = (position, gathered.dtype, tuple(gathered.shape[1:]), gathered.device)
        # The workspace outlives the call, so it is a normal tensor whatever the caller's autograd mode (an
        # inference tensor could not be written outside inference mode).
        with torch.inference_mode(False), torch.no_grad():
            staging = staging_of.get(key)
            if staging is None or staging.shape[0] < gathered.shape[0]:
                staging = staging_of[key] = torch.empty(gathered.shape, dtype=gathered.dtype, device=gathered.device)
            staged = staging[:gathered.shape[0]]
            staged.copy_(gathered)
        return torch.empty_like(gathered).copy_(staged)

    return tuple(take(position, buf) for position, buf in enumerate(buffers))  # type: ignore[return-value]


@MUTANTS.add("shared-workspace", bug="gathers into a staging buffer kept per buffer, dtype and row shape in a "
             "module-level dict and hands out copies of it: right for one caller at a time, but two threads "
             "gathering at once copy out each other's rows")
def shared_workspace(indices, *buffers) -> GatherOutputs:
    return _through_workspace(_STAGING, indices, buffers)


_THREAD_STAGING = threading.local()


# Judged on the emulated backend only: there the old workspace is a captured tensor its owner released, refused at
# replay. On CUDA the stale graph writes and reads the freed block within one replay, so its values stay right; only
# another tensor the allocator placed there would show it, and nothing yet checks free memory after a replay.
@MUTANTS.add("workspace-regrown", bug="gathers through a workspace of its own thread, allocated anew when a call "
             "brings more indices than it holds: every eager call is right, but a graph captured before the growth "
             "keeps the old workspace's address, freed since and handed to other data (TensorRT-LLM #16319)",
             backends={"emulated"})
def workspace_regrown(indices, *buffers) -> GatherOutputs:
    staging_of = vars(_THREAD_STAGING).setdefault("staging", {})
    return _through_workspace(staging_of, indices, buffers)


# dynamic=False: one graph per index count (dynamo's automatic dynamic shapes switched off with it).
_static_shapes_gather = torch.compile(eager_gather, dynamic=False)


@MUTANTS.add("static-shapes",
             bug="compiled with dynamic=False: each new index count is a recompile, so an engine's decode stream "
                 "reaches dynamo's recompile limit within a few steps and from then on runs eagerly, silently")
def static_shapes(indices, *buffers) -> GatherOutputs:
    return _static_shapes_gather(indices, *buffers)


@MUTANTS.add("packs-through-float64", bug="packs every buffer into one float64 matrix for a single gather, so int64 "
             "values beyond 2**53 (and any bits float64 cannot hold) come back changed")
def packs_through_float64(indices, *buffers) -> GatherOutputs:
    # "One gather instead of four": concatenate the buffers' rows in a common dtype, gather once, split.
    present = [buf for buf in buffers if buf is not None]
    pool = present[0].shape[0]
    columns = [buf.reshape(pool, -1).to(torch.float64) for buf in present]
    packed = torch.cat(columns, dim=1)[indices]
    outputs, start = [], 0
    for buf, column in zip(present, columns):
        width = column.shape[1]
        outputs.append(packed[:, start:start + width].to(buf.dtype).reshape(indices.shape[0], *buf.shape[1:]))
        start += width
    gathered = iter(outputs)
    return tuple(None if buf is None else next(gathered) for buf in buffers)  # type: ignore[return-value]


@MUTANTS.add("one-hot-matmul", bug="gathers floating buffers as a one-hot matrix product: -0.0 comes back +0.0 and an "
             "infinity anywhere in the pool turns every gathered row NaN (0 * inf)")
def one_hot_matmul(indices, *buffers) -> GatherOutputs:
    # The accelerator idiom: a gather as onehot(indices) @ buf, exact for finite values only.
    def take(index, buf):
        if not buf.dtype.is_floating_point:
            return buf[index]
        pool = buf.shape[0]
        compute = buf.dtype if buf.element_size() > 1 else torch.float32  # no float8 matmul
        one_hot = (torch.remainder(index.long(), pool).unsqueeze(1)
                   == torch.arange(pool, device=buf.device)).to(compute)
        return (one_hot @ buf.reshape(pool, -1).to(compute)).to(buf.dtype).reshape(index.shape[0], *buf.shape[1:])

    return _each(indices, buffers, take)


@MUTANTS.add("wraps-by-first-pool", bug="wraps negative indices once, by topk_p_buf's pool, for every buffer: a "
             "hidden-states buffer with more slots reads the wrong row")
def wraps_by_first_pool(indices, *buffers) -> GatherOutputs:
    # Index normalisation hoisted out of the per-buffer loop; an index still negative traps, as an
    # unsigned bounds check in a kernel would.
    pool = buffers[0].shape[0]
    wrapped = torch.where(indices < 0, indices + pool, indices)
    wrapped = torch.where(wrapped < 0, wrapped + (1 << 40), wrapped)
    return _each(wrapped, buffers, lambda index, buf: buf[index])


_SIDE_STREAMS: weakref.WeakKeyDictionary[Streams, object] = weakref.WeakKeyDictionary()
# Stands for the work the side stream exists to overlap (an engine's next forward, a copy): queued ahead of the
# gathers, it keeps them from finishing before the caller's stream reads their outputs.
_OVERLAPPED_WORK_CYCLES = 2_000_000


@MUTANTS.add("side-stream-no-wait", bug="gathers on a side stream of its own, overlapped with other work queued there, "
             "and returns without making the caller's stream wait for it: the caller reads the outputs before the "
             "gathers have written them")
def side_stream_no_wait(indices, *buffers) -> GatherOutputs:
    # An overlap-scheduled gather that orders its side stream after the caller's (the indices and sources are
    # ready) and keeps the caller's tensors alive on it, but forgets the way back.
    streams = streams_for(indices.device)
    side = _SIDE_STREAMS.get(streams)
    if side is None:
        side = _SIDE_STREAMS[streams] = streams.new_stream()
    caller = streams.current()
    with streams.on(side):
        streams.wait_stream(caller)
        streams.record(indices, *buffers)
        if indices.device.type == "cuda":
            torch.cuda._sleep(_OVERLAPPED_WORK_CYCLES)
        return compiled_gather(indices, *buffers)


# Issue 45, item 4: bugs that show only at a scale or in a form the suites did not draw before.

_WORKSPACE_LOCK = threading.Lock()
_WORKSPACE_POOL: list[dict[tuple, torch.Tensor]] = [{}, {}]
_FREE_WORKSPACES: list[dict[tuple, torch.Tensor]] = list(reversed(_WORKSPACE_POOL))


@MUTANTS.add("workspace-pool-of-two", bug="gathers through a staging workspace taken from a pool of two: two callers "
             "at once each get their own, a third concurrent caller shares the first caller's and the two copy out "
             "each other's rows")
def workspace_pool_of_two(indices, *buffers) -> GatherOutputs:
    # Sized for "the scheduler thread and the forward thread": when the pool is empty the call borrows the first
    # workspace rather than block, as if no third caller could exist.
    with _WORKSPACE_LOCK:
        borrowed = not _FREE_WORKSPACES
        workspace = _WORKSPACE_POOL[0] if borrowed else _FREE_WORKSPACES.pop()
    try:
        def take(position: int, buf: torch.Tensor | None) -> torch.Tensor | None:
            if buf is None:
                return None
            gathered = buf[indices]
            key = (position, gathered.dtype, tuple(gathered.shape[1:]), gathered.device)
            with torch.inference_mode(False), torch.no_grad():
                staging = workspace.get(key)
                if staging is None or staging.shape[0] < gathered.shape[0]:
                    staging = workspace[key] = torch.empty(gathered.shape, dtype=gathered.dtype,
                                                           device=gathered.device)
                staged = staging[:gathered.shape[0]]
                staged.copy_(gathered)
            return torch.empty_like(gathered).copy_(staged)

        return tuple(take(position, buf) for position, buf in enumerate(buffers))  # type: ignore[return-value]
    finally:
        with _WORKSPACE_LOCK:
            if not borrowed:
                _FREE_WORKSPACES.append(workspace)


_RING_SIZE = 64
_OUTPUT_RINGS: dict[tuple, tuple[list[torch.Tensor], list[int]]] = {}


@MUTANTS.add("output-ring-of-64", bug="hands out outputs from a ring of 64 preallocated buffers per shape: every call "
             "is right and the last 63 results survive, the 65th call of a shape overwrites the first one's result")
def output_ring_of_64(indices, *buffers) -> GatherOutputs:
    # Preallocated outputs (out=) rotated so that "no caller holds a result that long": a decode loop that keeps
    # a step's extras for more than 64 steps of the same batch size reads another step's.
    def take(position: int, buf: torch.Tensor | None) -> torch.Tensor | None:
        if buf is None:
            return None
        gathered = buf[indices]
        # One ring per calling mode: its buffers are made and written in the caller's mode, as eager's outputs are.
        mode = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        key = (position, tuple(gathered.shape), gathered.dtype, gathered.device, mode)
        ring, turn = _OUTPUT_RINGS.setdefault(key, ([], [0]))
        if len(ring) < _RING_SIZE:
            ring.append(torch.empty_like(gathered))
        out = ring[turn[0] % _RING_SIZE]
        turn[0] += 1
        return out.copy_(gathered)

    return tuple(take(position, buf) for position, buf in enumerate(buffers))  # type: ignore[return-value]


_BLOCK_ROWS = 4096  # rows per tile: a grid of tiles, each a CTA looping over its rows


@MUTANTS.add("drops-tile-at-multiple-of-4096", bug="gathers in tiles of 4096 rows with the full-tile count "
             "computed as (count - 1) // 4096, so at an exact multiple of 4096 rows the last tile is never "
             "launched and its rows stay zero; every other count is right")
def drops_tile_at_multiple_of_4096(indices, *buffers) -> GatherOutputs:
    count = indices.shape[0]
    full_blocks = max(count - 1, 0) // _BLOCK_ROWS  # written to never launch an empty trailing tile
    tail = count % _BLOCK_ROWS

    def take(index, buf):
        out = torch.zeros((index.shape[0], *buf.shape[1:]), dtype=buf.dtype, device=buf.device)
        head = full_blocks * _BLOCK_ROWS
        out[:head] = buf[index[:head]]
        if tail:
            out[head:head + tail] = buf[index[head:head + tail]]
        return out

    return _each(indices, buffers, take)


# The previous call: a weak reference to its index tensor, every input's identity and counter, and its results.
_PREVIOUS: list[tuple[weakref.ref, tuple, GatherOutputs]] = []


def _version_key(indices: torch.Tensor, buffers: tuple[torch.Tensor | None, ...]) -> tuple | None:
    """Every input's identity and version counter; None (not cacheable) when one is an inference tensor, which
    has no counter."""
    tensors = [tensor for tensor in (indices, *buffers) if tensor is not None]
    if any(tensor.is_inference() for tensor in tensors):
        return None
    return tuple((id(tensor), tensor._version) for tensor in tensors)


@MUTANTS.add("caches-by-version-counter", bug="returns a copy of the previous result when the same tensors come back "
             "with unchanged version counters, so a write that bypasses the counter (.data, a numpy or DLPack view, "
             "a kernel writing through data_ptr) is never seen")
def caches_by_version_counter(indices, *buffers) -> GatherOutputs:
    # Memoised on the last call's inputs, by identity and version counter: in-place ops bump the counter, so the
    # cache looks safe, but writes through aliases that have counters of their own do not.
    key = _version_key(indices, buffers)
    if key is None or is_capturing():  # a graph must record the gather itself, not a copy of the memo
        return compiled_gather(indices, *buffers)
    if _PREVIOUS and _PREVIOUS[0][0]() is indices and _PREVIOUS[0][1] == key:
        return tuple(None if out is None else out.clone() for out in _PREVIOUS[0][2])  # type: ignore[return-value]
    result = compiled_gather(indices, *buffers)
    _PREVIOUS[:] = [(weakref.ref(indices), key, tuple(None if out is None else out.clone() for out in result))]
    return result


@MUTANTS.add("token-zero-as-empty", bug="takes bonus token id 0 for padding on its int64 path and returns the "
             "empty-slot sentinel -1 in its place: a relay resolving a real token 0 refuses it as never stashed")
def token_zero_as_empty(indices, *buffers) -> GatherOutputs:
    # A kernel whose output buffer starts filled with its "no token" marker and copies only non-zero ids over it.
    topk_p, topk_index, bonus, hidden = compiled_gather(indices, *buffers)
    if bonus.dtype == torch.int64:
        bonus = torch.where(bonus == 0, torch.full_like(bonus, -1), bonus)
    return topk_p, topk_index, bonus, hidden


@MUTANTS.add("topk-index-pad-clamped", bug="clamps topk_index -1, taken for top-k padding, to 0 on its int64 path so a "
             "later gather may index with it: a real index -1 comes back 0")
def topk_index_pad_clamped(indices, *buffers) -> GatherOutputs:
    topk_p, topk_index, bonus, hidden = compiled_gather(indices, *buffers)
    if topk_index.dtype == torch.int64:
        topk_index = torch.where(topk_index == -1, torch.zeros_like(topk_index), topk_index)
    return topk_p, topk_index, bonus, hidden


@MUTANTS.add("leaves-cudnn-benchmark-on", bug="turns on torch.backends.cudnn.benchmark at its first call (a common "
             "speed-up line) and never turns it back off: every later cuDNN call of the process autotunes")
def leaves_cudnn_benchmark_on(indices, *buffers) -> GatherOutputs:
    torch.backends.cudnn.benchmark = True
    return compiled_gather(indices, *buffers)


@MUTANTS.add("narrow-view-outputs", bug="returns each output as the leading rows of a buffer allocated for twice the "
             "rows (sized for the largest batch): same values, shape and strides, twice the memory kept alive")
def narrow_view_outputs(indices, *buffers) -> GatherOutputs:
    def take(index: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        rows = index.shape[0]
        out = torch.empty((2 * rows, *buf.shape[1:]), dtype=buf.dtype, device=buf.device)
        out[:rows] = buf[index]
        return out[:rows]

    return _each(indices, buffers, take)


_LAST_ARGUMENTS: list[tuple[torch.Tensor | None, ...]] = []


@MUTANTS.add("keeps-arguments-alive", bug="keeps the last call's indices and buffers in a module-level slot (for a "
             "debug dump): the caller's tensors stay alive after the caller drops them")
def keeps_arguments_alive(indices, *buffers) -> GatherOutputs:
    _LAST_ARGUMENTS[:] = [(indices, *buffers)]
    return compiled_gather(indices, *buffers)


_INDEX_LOG: list[torch.Tensor] = []


@MUTANTS.add("logs-every-call", bug="appends a copy of every call's indices to a module-level log that nothing "
             "trims: memory grows with the number of calls")
def logs_every_call(indices, *buffers) -> GatherOutputs:
    _INDEX_LOG.append(indices.clone())
    return compiled_gather(indices, *buffers)


@MUTANTS.add("deterministic-path-sorts", bug="when the caller has enabled deterministic algorithms, takes a "
             "sort-then-gather path (duplicate indices in a fixed order) that returns the rows in sorted index "
             "order, not in the caller's order")
def deterministic_path_sorts(indices, *buffers) -> GatherOutputs:
    if torch.are_deterministic_algorithms_enabled():
        return compiled_gather(indices.sort().values, *buffers)
    return compiled_gather(indices, *buffers)
