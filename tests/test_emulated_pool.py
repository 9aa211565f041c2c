"""Positive controls of the emulated backend's pool: it must reproduce the hazard a CUDA graph pool shared by several
captures has, or a capturer that keeps too little alive passes on the CPU and corrupts outputs on a GPU.

A block an earlier capture allocated and freed again (an intermediate) may be handed to a later capture into the same
pool, as CUDA's caching allocator does; replaying the earlier graph then writes the block, whoever uses it now."""

from __future__ import annotations

import torch

from harness.graphs import EmulatedBackend, GraphCapturer


def _two_captures(*, shared: bool, first=lambda x: (x * 2).sum()):
    capturer = GraphCapturer(EmulatedBackend())
    pool = capturer.new_pool()
    x, y = torch.arange(4.0), torch.full((4,), 10.0)
    earlier = capturer.capture(lambda: first(x), pool=pool)
    later = capturer.capture(lambda: y * 3, pool=pool if shared else capturer.new_pool())
    return x, y, earlier, later


def test_a_block_an_earlier_capture_freed_is_recarved_and_its_replay_writes_it():
    x, y, earlier, later = _two_captures(shared=True)
    assert torch.equal(later.output, y * 3)
    earlier.replay()  # writes its intermediate x * 2 into the block the later capture's output now lives in
    assert torch.equal(later.output, x * 2), "the emulated pool no longer re-carves freed blocks: the control is blind"
    assert torch.equal(earlier.output, (x * 2).sum())
    later.replay()
    assert torch.equal(later.output, y * 3)


def test_captures_into_separate_pools_never_share_a_block():
    x, y, earlier, later = _two_captures(shared=False)
    earlier.replay()
    assert torch.equal(later.output, y * 3)


def test_a_block_still_held_is_not_recarved():
    # The earlier graph's output (held by the graph) is x * 2 itself: no block of it is free for the later capture.
    x, y, earlier, later = _two_captures(shared=True, first=lambda x: x * 2)
    earlier.replay()
    assert torch.equal(later.output, y * 3)
    assert torch.equal(earlier.output, x * 2)


def test_the_smallest_free_block_that_fits_is_recarved():
    capturer = GraphCapturer(EmulatedBackend())
    pool = capturer.new_pool()
    x, y = torch.arange(8.0), torch.full((4,), 10.0)
    # Two intermediates freed by the earlier capture: 8 floats (x * 2) and 4 floats (x[:4] * 5).
    earlier = capturer.capture(lambda: (x * 2).sum() + (x[:4] * 5).sum(), pool=pool)
    later = capturer.capture(lambda: y * 3, pool=pool)
    earlier.replay()
    assert torch.equal(later.output, x[:4] * 5), "the 4-float block, the best fit, holds the later output"


def test_a_one_byte_block_is_recarved_too():
    # The smallest block a capture can free: one uint8 element.
    capturer = GraphCapturer(EmulatedBackend())
    pool = capturer.new_pool()
    x, y = torch.tensor([3], dtype=torch.uint8), torch.tensor([10], dtype=torch.uint8)
    earlier = capturer.capture(lambda: (x + 1).to(torch.int64), pool=pool)
    later = capturer.capture(lambda: y * 2, pool=pool)
    earlier.replay()
    assert torch.equal(later.output, x + 1), "a freed one-byte block is not re-carved"


def test_poisoning_fills_the_free_blocks_of_a_pool_and_the_graph_still_replays_right():
    """harness.hazards poisons the emulated pools too: a block nothing holds (the earlier capture's intermediate)
    reads 0xFF bytes, NaN, after poisoning, a block still held keeps its values, and the graph, which writes its
    intermediate before reading it, replays right."""
    from harness import hazards

    capturer = GraphCapturer(EmulatedBackend())
    pool = capturer.new_pool()
    x = torch.arange(4.0)
    graph = capturer.capture(lambda: (x * 2).sum(), pool=pool)
    report = hazards.poison_free_memory(force=True)
    free = [block for block in pool.blocks.values() if block.is_free()]
    assert free and report.blocks >= len(free), f"no free block poisoned: {report}"
    for block in free:
        contents = torch.empty((0,), dtype=torch.uint8).set_(block.storage, 0, (block.nbytes,), (1,))
        assert (contents == hazards.POISON_BYTE).all(), "a free block of the pool was not poisoned"
    assert torch.equal(graph.output, (x * 2).sum()), "poisoning reached a block the graph's output holds"
    x.copy_(torch.arange(4.0) + 1)
    graph.replay()
    assert torch.equal(graph.output, (x * 2).sum())
