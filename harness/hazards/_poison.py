"""Poison memory nobody owns: every block the CUDA caching allocator (and an emulated graph pool) holds free is
filled with NaN bytes.

A graph that reads a tensor its owner released, a break output held only weakly, or rows of a buffer nobody
wrote, reads whatever the allocator's last user left there: often the right values, so the bug passes. Filled
with :data:`POISON_BYTE` beforehand, such a read gives NaN in every floating dtype (and -1 in integers), which
no equivalence check lets through. The blocks come from ``torch.cuda.memory_snapshot()``: those in the state
``inactive``, in every pool (the graphs' private pools too: a graph writes its scratch before reading it, so only
a read of memory it does not own sees the poison). Blocks the allocator keeps for a stream that still uses them
(``record_stream``: ``active_pending_free``) are left alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from harness.graphs._emulated import poison_free_blocks
from harness.hazards._config import amplifiers_enabled

__all__ = ["POISON_BYTE", "FreeBlock", "PoisonReport", "free_blocks", "poison_free_memory"]

#: All ones: NaN in float16, bfloat16, float32 and float64 (exponent all ones, mantissa not zero), -1 in
#: signed integers, True in bool.
POISON_BYTE = 0xFF


@dataclasses.dataclass(frozen=True)
class FreeBlock:
    """A block of a segment of the caching allocator that no tensor holds."""

    device: int
    address: int
    size: int
    pool: tuple[int, int]  # (0, 0): the allocator's default pool; else a graph pool's id


@dataclasses.dataclass(frozen=True)
class PoisonReport:
    """What one :func:`poison_free_memory` call filled."""

    blocks: int = 0
    bytes: int = 0


def free_blocks(segments: Iterable[Mapping[str, Any]]) -> list[FreeBlock]:
    """The free blocks of a ``torch.cuda.memory_snapshot()`` (its segments, each with its blocks in address
    order; a block's own ``address`` where the installed torch gives one, else the running sum of sizes)."""
    found = []
    for segment in segments:
        address = segment["address"]
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        for block in segment["blocks"]:
            address = block.get("address", address)
            if block["state"] == "inactive" and block["size"] > 0:
                found.append(FreeBlock(segment["device"], address, block["size"], (pool[0], pool[1])))
            address += block["size"]
    return found


class _RawMemory:
    """Device memory by address, as ``torch.as_tensor`` takes it (the CUDA array interface); it owns nothing."""

    def __init__(self, address: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False),
                                         "version": 2}


def _stream_capturing(index: int) -> bool:
    with torch.cuda.device(index):
        return torch.cuda.is_current_stream_capturing()


def poison_free_memory(*, force: bool = False) -> PoisonReport:
    """Fill every free block of the caching allocator, on every device this process initialised, with
    :data:`POISON_BYTE`, queued on each device's current stream (no wait: a side stream that still reads a block
    its owner released without ``record_stream`` races the fill, as it would race the block's next owner).

    The emulated backend's pools are poisoned the same way: every block no tensor holds
    (``harness.graphs._emulated``). A no-op while a capture is being recorded in this thread (a stream of this
    thread captures, or an emulated recording runs), where CUDA is not initialised (for its memory), or where the
    amplifiers are off or paused (``force`` acts anyway: the positive controls)."""
    if not (force or amplifiers_enabled()):
        return PoisonReport()
    emulated_blocks, emulated_bytes = poison_free_blocks(POISON_BYTE)
    report = PoisonReport(emulated_blocks, emulated_bytes)
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return report
    devices = range(torch.cuda.device_count())
    if any(_stream_capturing(index) for index in devices):
        return report
    blocks = free_blocks(torch.cuda.memory_snapshot())
    for block in blocks:
        with torch.cuda.device(block.device):
            torch.as_tensor(_RawMemory(block.address, block.size), device=f"cuda:{block.device}").fill_(POISON_BYTE)
    return PoisonReport(report.blocks + len(blocks), report.bytes + sum(block.size for block in blocks))
